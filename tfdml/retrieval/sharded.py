"""Search and evaluation over a gallery split in shards: one `ScannIndex` per shard, each query's per-shard
top-k lists merged into one.

A query's `k` nearest items over the whole gallery are among the union of its `k` nearest in each shard, so
merging the per-shard lists (`merge_top_k`) gives the exact global top-k whenever each shard's search is
exact (a brute-force `ScannIndex`), and an approximate shard loses no more than it loses alone. Ties keep the
earlier shard first, then the shard's own order: with shards in gallery order and brute-force shards, the
merged list is the one of a single exact search over the concatenated gallery.

`ShardedIndex` holds the shards as indexes or as saved index folders; folders are loaded one at a time while
a batch of queries is searched, so memory holds one shard's index (plus `[Q, k]` results), whatever the
gallery's size.

The retrieval metrics of `tfdml.retrieval.metrics` are means over queries; `retrieval_sums` returns the
sums of one block of queries so that blocks (query shards, searched on different workers) add up, and
`metrics_from_sums` divides once at the end: Recall@K, MAP@R and R-precision equal `evaluate`'s on the
whole set to float rounding.

Example:
  >>> index = ShardedIndex.load(["out/indexes/shard-00000", "out/indexes/shard-00001"])
  >>> ids, scores = index.search(query_embeddings, k=10)
"""

import numpy as np

from tfdml.retrieval import metrics as M
from tfdml.retrieval.index import ScannIndex

RETRIEVAL_METRICS = ("recall", "map@r", "r_precision")


def merge_top_k(ids, scores, k, larger_is_nearer=True, labels=None):
    """The `k` nearest of several `[Q, k_i]` result lists of the same queries.

    Args:
      ids, scores: sequences of `[Q, k_i]` arrays (ids and scores of each list, nearest first).
      k: how many to keep (at most the sum of the `k_i`).
      larger_is_nearer: True for dot products, False for squared distances.
      labels: optional sequence of `[Q, k_i]` labels of the listed items, merged alongside.

    Returns `(ids [Q, k], scores [Q, k])` (and the labels `[Q, k]` when given), nearest first; equal scores
    keep the order of the lists, then of each list (a stable sort).
    """
    ids = np.concatenate([np.asarray(i) for i in ids], axis=1)
    scores = np.concatenate([np.asarray(s, np.float32) for s in scores], axis=1)
    if k > ids.shape[1]:
        raise ValueError(f"k={k} exceeds the {ids.shape[1]} merged neighbours.")
    order = np.argsort(-scores if larger_is_nearer else scores, axis=1, kind="stable")[:, :k]
    merged = (np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1))
    if labels is None:
        return merged
    return (*merged, np.take_along_axis(np.concatenate([np.asarray(x) for x in labels], axis=1), order, 1))


def drop_query_ids(query_ids, ids, *aligned):
    """`[Q, k+1]` results -> `[Q, k]` without each query's own id (same-set search), else without the last
    entry; arrays in `aligned` (scores, labels) lose the same entries. Returns a tuple."""
    own = ids == np.asarray(query_ids)[:, None]
    drop = np.where(own.any(axis=1), own.argmax(axis=1), ids.shape[1] - 1)
    keep = np.arange(ids.shape[1])[None, :] != drop[:, None]
    return tuple(a[keep].reshape(len(ids), -1) for a in (ids, *aligned))


class ShardedIndex:
    """Nearest neighbours over several `ScannIndex` shards of one gallery (see the module docstring).

    Args:
      shards: `ScannIndex` objects, or folders written by `ScannIndex.save` (loaded one at a time at each
        search, so that memory holds one shard).

    Example:
      >>> index = ShardedIndex([ScannIndex(part, ids=part_ids, mode="exact") for part, part_ids in shards])
      >>> ids, scores = index.search(queries, k=5)   # == one brute-force search over all the parts
    """

    def __init__(self, shards):
        self.shards = list(shards)
        if not self.shards:
            raise ValueError("a sharded index needs at least one shard.")
        self.loads = 0  # shard folders loaded so far (one at a time)

    @classmethod
    def load(cls, directories):
        """A `ShardedIndex` over saved index folders (nothing is loaded before a search)."""
        return cls([str(d) for d in directories])

    def _each_shard(self):
        for shard in self.shards:
            if isinstance(shard, ScannIndex):
                yield shard
            else:
                self.loads += 1
                index = ScannIndex.load(shard)
                yield index
                del index  # released before the next one is loaded

    def search(self, queries, k=10, exclude_ids=None, labels=False):
        """Top-`k` of each `[Q, D]` query over every shard: `(ids [Q, k], scores [Q, k])`, nearest first, and
        with `labels=True` the labels `[Q, k]` of the items found (the shards' `labels`).

        `exclude_ids`: `[Q]` ids left out of their own query's list (each query's own gallery item, when the
        queries are gallery items: same-set evaluation).
        """
        queries = np.asarray(queries, np.float32)
        width = k + (exclude_ids is not None)
        merged, total, larger = None, 0, True
        for index in self._each_shard():
            larger = index.distance == "dot_product"
            rows, scores = index.search(queries, min(width, index.size), positions=True)
            found = [index.ids[rows] if index.ids is not None else rows + total, scores]
            if labels:
                if index.labels is None:
                    raise ValueError(f"shard {index.directory or index!r} has no labels.")
                found.append(index.labels[rows])
            total += index.size
            if merged is not None:  # merged shard by shard: the running list first, so ties keep the shard order
                parts = list(zip(merged, found))
                extra = {"labels": parts[2]} if labels else {}
                found = merge_top_k(*parts[:2], min(width, merged[0].shape[1] + found[0].shape[1]), larger, **extra)
            merged = found
        if width > total:
            raise ValueError(f"k={k} exceeds the {total - (width - k)} gallery items each query can see.")
        if exclude_ids is not None:
            merged = drop_query_ids(exclude_ids, *merged)
        return tuple(part[:, :k] for part in merged)


def class_counts(labels):
    """`{label: count}` of a gallery's labels (summed over shards with `collections.Counter`)."""
    classes, counts = np.unique(np.asarray(labels), return_counts=True)
    return dict(zip(classes.tolist(), counts.tolist()))


def needed_neighbours(counts, ks, metrics, same_set=True):
    """How many neighbours each query needs: `max(ks)` for Recall@K, the largest `R_q` for MAP@R and
    R-precision (as `evaluate` searches)."""
    needed = max(ks) if "recall" in metrics else 1
    if "map@r" in metrics or "r_precision" in metrics:
        needed = max(needed, max(counts.values()) - int(same_set))
    return int(needed)


def retrieval_sums(neighbour_labels, query_labels, counts, ks, metrics=RETRIEVAL_METRICS, same_set=True):
    """Sums over one block of queries of what `evaluate` averages: `{"queries": n, "recall@K": ..., "map@r":
    ..., "r_precision": ...}` over the `n` queries that have a same-class gallery item.

    Args:
      neighbour_labels: `[Q, k]` labels of each query's nearest gallery items (own item excluded in same-set
        mode), `k` at least `needed_neighbours(counts, ks, metrics, same_set)`.
      query_labels: `[Q]` labels of the queries.
      counts: `{label: gallery items}` over the whole gallery (`class_counts`).
      ks, metrics: as `evaluate` (any of `"recall"`, `"map@r"`, `"r_precision"`).
      same_set: the queries are gallery items (their own item is not counted in `R_q`).
    """
    query_labels = np.asarray(query_labels)
    r = np.array([counts.get(label, 0) for label in query_labels.tolist()], np.int64) - int(same_set)
    valid = r > 0
    n = int(valid.sum())
    sums = {"queries": n}
    if n == 0:
        return sums
    hits = np.asarray(neighbour_labels)[valid] == query_labels[valid][:, None]
    if "recall" in metrics:
        sums.update({f"recall@{k}": value * n for k, value in M.recall_at_k(hits, ks).items()})
    if "map@r" in metrics:
        sums["map@r"] = M.map_at_r(hits, r[valid]) * n
    if "r_precision" in metrics:
        sums["r_precision"] = M.r_precision(hits, r[valid]) * n
    return sums


def add_sums(a, b):
    """Two `retrieval_sums` added (keys of either)."""
    return {key: a.get(key, 0) + b.get(key, 0) for key in {**a, **b}}


def metrics_from_sums(sums):
    """The metrics (means over queries) of added `retrieval_sums`."""
    n = sums.get("queries", 0)
    if not n:
        raise ValueError("no query has a same-class item in the gallery; retrieval metrics are undefined.")
    return {key: value / n for key, value in sorted(sums.items()) if key != "queries"}
