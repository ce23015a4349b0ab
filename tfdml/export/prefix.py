"""Coarse-to-fine search of nested (Matryoshka) embeddings: a `ScannIndex` on a short prefix, re-ranked exactly.

`PrefixIndex` indexes the first `search_dims` coordinates of each gallery embedding, L2-normalised (as
`tfdml.losses.NestedLoss` trained them), takes a shortlist of `shortlist_factor * k` candidates from that small
index and re-scores the shortlist with the full vectors (exact dot products), returning the `k` best. ScaNN's
own re-ordering re-scores with the vectors it indexed, so the re-ranking with the full vectors is done here.

The shortlist meets a recall target: after building, recall@k of the re-ranked results against exact search
on the full vectors is measured on `RECALL_QUERIES` gallery items (each left out of its own lists), and the
smallest factor of `SHORTLIST_FACTORS` whose lower confidence bound reaches `target_recall` is kept (the
largest, with `met` false, when none does). The record (`PrefixIndex.recall`) names the dims, the factor,
the shortlist, the measured recall and its bound; `tfdml export --search-dims` writes it into the metadata.

A `PrefixIndex` answers as a `ScannIndex` does (`search` takes full-width queries; `ids`, `labels`,
`class_names`, `size`, `dim`), so `tfdml search` and `load_index` use either.
"""

import math
import statistics
import time

import numpy as np

from tfdml.retrieval import ScannIndex
from tfdml.retrieval.tuning import RECALL_CONFIDENCE, RECALL_QUERIES, drop_rows, exact_neighbours

SHORTLIST_FACTORS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_SHORTLIST_FACTOR = 8
FULL_EMBEDDINGS_FILE = "full_embeddings.npy"
_RECORD_KEY = "prefix_search"


def normalised_prefix(embeddings, search_dims):
    """float32 `[N, search_dims]`: the first `search_dims` columns, each row scaled to unit norm (a zero row
    stays zero)."""
    part = np.asarray(embeddings, np.float32)[..., :search_dims]
    norms = np.linalg.norm(part, axis=-1, keepdims=True)
    return np.ascontiguousarray(part / np.maximum(norms, 1e-12), dtype=np.float32)


def check_search_dims(search_dims, width):
    """`search_dims` as an int, or a `ValueError` saying why it is no prefix of `width`-d embeddings."""
    if isinstance(search_dims, bool) or not float(search_dims).is_integer() or not 1 <= int(search_dims) < width:
        raise ValueError(
            f"search_dims must be a prefix shorter than the {width}-d embedding (1 to {width - 1}), got "
            f"{search_dims!r}; for the full vector build the index without search_dims."
        )
    return int(search_dims)


def rerank(queries, full, candidates, k):
    """`(positions [Q, k], scores [Q, k])`: the `k` of each row's `candidates` with the largest exact dot product
    between the full query and the full gallery vector, best first (ties: the earlier candidate)."""
    scores = np.einsum("qsd,qd->qs", full[candidates], queries)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(candidates, order, 1), np.take_along_axis(scores, order, 1)


def exact_prefix_candidates(prefix_queries, prefix_gallery, shortlist):
    """Exact top-`shortlist` positions of each query on the prefixes (what the `search` signature computes)."""
    return exact_neighbours(prefix_queries, prefix_gallery, shortlist, "dot_product")


def recall_against_full(found, exact, confidence=RECALL_CONFIDENCE):
    """`{measured, standard_error, lower_bound}` of recall@k, `found` and `exact` `[Q, k]` positions."""
    k = exact.shape[1]
    per_query = np.array([len(set(a) & set(b)) for a, b in zip(found, exact)], np.float64) / k
    error = float(per_query.std(ddof=1) / math.sqrt(len(per_query))) if len(per_query) > 1 else 0.0
    z = statistics.NormalDist().inv_cdf(float(confidence))
    mean = float(per_query.mean())
    return {"measured": mean, "standard_error": error, "lower_bound": mean - z * error}


def choose_shortlist(candidates_for, full, k, target_recall, factors=SHORTLIST_FACTORS, confidence=RECALL_CONFIDENCE):
    """The recall record of the smallest factor of `factors` whose re-ranked results reach `target_recall`
    against exact full-vector search (lower confidence bound), on `RECALL_QUERIES` gallery items left out of
    their own lists. `candidates_for(rows, shortlist)` gives `[Q, shortlist]` prefix candidates of the
    gallery rows `rows` (their own row among them)."""
    size = len(full)
    k = int(min(k, size - 1))
    rows = np.sort(np.random.default_rng(0).choice(size, min(RECALL_QUERIES, size), replace=False))
    exact = exact_neighbours(full[rows], full, k, "dot_product", rows)
    record = None
    for factor in factors:
        shortlist = int(min(size, factor * k + 1))
        start = time.perf_counter()
        found, _ = rerank(full[rows], full, np.asarray(candidates_for(rows, shortlist), np.int64), k + 1)
        seconds = time.perf_counter() - start
        record = {
            "k": k,
            "shortlist_factor": factor,
            "shortlist": shortlist - 1,
            **recall_against_full(drop_rows(found, rows, k), exact, confidence),
            "target": None if target_recall is None else float(target_recall),
            "confidence": float(confidence),
            "queries": len(rows),
            "ms_per_query": 1000.0 * seconds / len(rows),
        }
        record["met"] = None if target_recall is None else record["lower_bound"] >= target_recall
        if record["met"] is not False or shortlist >= size:
            break
    return record


def signature_prefix_record(embeddings, search_dims, k, target_recall):
    """The recall record of the `search` signature's prefix search (exact on the normalised prefixes, then the
    full vectors): its shortlist sized as `PrefixIndex`'s (`target_recall` None: `DEFAULT_SHORTLIST_FACTOR`)."""
    full = np.ascontiguousarray(embeddings, np.float32)
    search_dims = check_search_dims(search_dims, full.shape[1])
    prefixes = normalised_prefix(full, search_dims)
    factors = SHORTLIST_FACTORS if target_recall is not None else (DEFAULT_SHORTLIST_FACTOR,)
    record = choose_shortlist(
        lambda rows, shortlist: exact_prefix_candidates(prefixes[rows], prefixes, shortlist),
        full,
        k,
        target_recall,
        factors,
    )
    record["shortlist"] = int(min(len(full), record["shortlist_factor"] * k))
    return {"search_dims": search_dims, "full_dims": int(full.shape[1]), **record}


class PrefixIndex:
    """A `ScannIndex` on the normalised `search_dims` prefix of `[N, D]` embeddings, its shortlist re-ranked with
    the full vectors (see the module docstring).

    Args:
      embeddings: `[N, D]` L2-normalised gallery embeddings (the full vectors).
      search_dims: the prefix the index searches (less than `D`).
      num_neighbors: the `k` of the recall target and of `search` by default.
      target_recall: recall@k against exact full-vector search the shortlist must reach (None: a shortlist of
        `DEFAULT_SHORTLIST_FACTOR * k`, its recall still measured).
      shortlist_factor: a fixed shortlist of `shortlist_factor * k` (its recall still measured); default: the
        smallest of `SHORTLIST_FACTORS` that meets the target.
      ids, labels, class_names, metadata, mode, index_settings: of the prefix `ScannIndex`.

    Example:
      >>> index = PrefixIndex(gallery_embeddings, search_dims=16)
      >>> ids, scores = index.search(query_embeddings, k=10)     # full-width queries
      >>> index.recall["measured"], index.recall["shortlist"]
    """

    def __init__(
        self,
        embeddings,
        search_dims,
        num_neighbors=10,
        target_recall=0.95,
        shortlist_factor=None,
        ids=None,
        labels=None,
        class_names=None,
        metadata=None,
        mode="auto",
        **index_settings,
    ):
        full = np.ascontiguousarray(embeddings, np.float32)
        if full.ndim != 2 or len(full) < 2:
            raise ValueError(f"a prefix index needs [items >= 2, dim] embeddings, got shape {full.shape}.")
        self.search_dims = check_search_dims(search_dims, full.shape[1])
        if target_recall is not None and not 0.0 < float(target_recall) <= 1.0:
            raise ValueError(f"target_recall must be in (0, 1] or None, got {target_recall}.")
        self.full = full
        self.index = ScannIndex(
            normalised_prefix(full, self.search_dims),
            ids=ids,
            labels=labels,
            class_names=class_names,
            metadata=metadata,
            mode=mode,
            num_neighbors=num_neighbors,
            target_recall=target_recall,
            **index_settings,
        )
        if shortlist_factor is None:  # unmeasured target: the factor that met 0.95 on the benchmark's catalogue
            factors = SHORTLIST_FACTORS if target_recall is not None else (DEFAULT_SHORTLIST_FACTOR,)
        else:
            factors = (int(shortlist_factor),)
        if factors[0] < 1:
            raise ValueError(f"shortlist_factor must be a positive integer, got {shortlist_factor}.")
        record = choose_shortlist(self._candidates_of_rows, full, num_neighbors, target_recall, factors)
        self.shortlist_factor = record["shortlist_factor"]
        self.recall = {"search_dims": self.search_dims, "full_dims": int(full.shape[1]), **record}
        self.index.metadata[_RECORD_KEY] = self.recall

    def _candidates_of_rows(self, rows, shortlist):
        queries = normalised_prefix(self.full[rows], self.search_dims)
        return self.index.search(queries, k=shortlist, positions=True)[0]

    # What `tfdml search` and `load_index` read, as on a `ScannIndex`.
    ids = property(lambda self: self.index.ids)
    labels = property(lambda self: self.index.labels)
    class_names = property(lambda self: self.index.class_names)
    metadata = property(lambda self: self.index.metadata)
    distance = property(lambda self: self.index.distance)
    mode = property(lambda self: self.index.mode)
    settings = property(lambda self: self.index.settings)
    num_neighbors = property(lambda self: self.index.num_neighbors)
    size = property(lambda self: len(self.full))
    dim = property(lambda self: int(self.full.shape[1]))

    def class_name(self, position):
        return self.index.class_name(position)

    def load_array(self, file_name):
        return self.index.load_array(file_name)

    def search(self, queries, k=None, positions=False):
        """Top-`k` of each full-width `[Q, D]` (or `[D]`) query: `(ids, scores)`, scores the exact dot products
        with the full gallery vectors, best first."""
        k = self.index.num_neighbors if k is None else int(k)
        queries = np.asarray(queries, np.float32)
        single = queries.ndim == 1
        queries = queries[None] if single else queries
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must be [Q, {self.dim}] full-width embeddings, got shape {queries.shape}.")
        shortlist = int(min(self.size, max(k, self.shortlist_factor * k)))
        candidates = self.index.search(normalised_prefix(queries, self.search_dims), k=shortlist, positions=True)[0]
        found, scores = rerank(queries, self.full, np.asarray(candidates, np.int64).reshape(len(queries), -1), k)
        ids = found if self.ids is None or positions else self.ids[found]
        return (ids[0], scores[0]) if single else (ids, scores)

    def save(self, directory, arrays=None):
        """Saves the prefix index with the full vectors beside it (`load_prefix_or_full_index` reads it back)."""
        return self.index.save(directory, arrays={**(arrays or {}), FULL_EMBEDDINGS_FILE: self.full})

    @classmethod
    def load(cls, directory):
        index = ScannIndex.load(directory)
        return cls._around(index)

    @classmethod
    def _around(cls, index):
        record = index.metadata[_RECORD_KEY]
        self = cls.__new__(cls)
        self.index, self.recall = index, record
        self.search_dims, self.shortlist_factor = int(record["search_dims"]), int(record["shortlist_factor"])
        self.full = index.load_array(FULL_EMBEDDINGS_FILE)
        if self.full is None:
            raise FileNotFoundError(f"the prefix index at {index.directory} has no {FULL_EMBEDDINGS_FILE}.")
        return self

    def __repr__(self):
        return f"PrefixIndex(size={self.size}, dim={self.dim}, search_dims={self.search_dims}, mode={self.mode!r})"


def load_prefix_or_full_index(directory):
    """The index saved in `directory`: a `PrefixIndex` where it was saved as one, else the `ScannIndex`."""
    index = ScannIndex.load(directory)
    return PrefixIndex._around(index) if _RECORD_KEY in index.metadata else index
