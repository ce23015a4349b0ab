"""`evaluate`: the retrieval protocol of the DML papers (Recall@K, MAP@R, R-precision, NMI, clustering F1).

Two modes:

- same set (CUB, Cars, SOP): every embedding queries all the others; only the query's own row is excluded
  (other items at distance 0, e.g. duplicate images, stay in the ranking);
- query / gallery (In-shop): `query_embeddings` search `embeddings`; nothing is excluded.

Neighbours come from exact chunked search (`tfdml.ops.exact_search`: one matmul + top-k per block of
queries, memory bounded, ties broken by the lower gallery index) or, with `exact=False`, from a ScaNN
`ScannIndex` in approximate mode (dot-product scoring when the embeddings are unit-norm: the same ranking,
and what ScaNN's anisotropic hashing is designed for). See `tfdml.retrieval.metrics` for the metric definitions.
"""

import numpy as np

from tfdml.ops.neighbours import drop_own_rows, exact_search, validate_distance
from tfdml.retrieval import _inputs
from tfdml.retrieval import metrics as M
from tfdml.retrieval.expansion import expanded_sets
from tfdml.retrieval.index import ScannIndex

METRICS = ("recall", "map@r", "r_precision", "nmi", "f1")


def _approximate_search(queries, gallery, k, distance, same_set, index_kwargs):
    if _inputs.unit_norm(gallery) and _inputs.unit_norm(queries):
        # Same ranking as squared L2 on the unit sphere, and ScaNN's anisotropic AH is built for it.
        distance = "dot_product"
    index = ScannIndex(
        gallery, distance=distance, mode="approximate", num_neighbors=k + same_set, **(index_kwargs or {})
    )
    found, _ = index.search(queries, k + same_set)
    return drop_own_rows(found, 0)[0] if same_set else found


def embed_batches(model, batches):
    """`(embeddings [N, D], labels [N])` of `(images, labels)` batches, embedded by `model(images,
    training=False)`; `tfdml.data.eval_dataset` gives such batches."""
    embeddings, labels = [], []
    for images, batch_labels in batches:
        embeddings.append(np.asarray(model(images, training=False)))
        labels.append(np.asarray(batch_labels).reshape(-1))
    return np.concatenate(embeddings), np.concatenate(labels)


def evaluate(
    embeddings,
    labels,
    ks=(1, 2, 4, 8),
    query_embeddings=None,
    query_labels=None,
    metrics=METRICS,
    exact=True,
    distance="squared_euclidean",
    chunk_size=None,
    index_kwargs=None,
    seed=0,
    progress=False,
    query_expansion=0,
    database_augmentation=0,
    expansion_alpha=3.0,
):
    """Retrieval and clustering metrics of embeddings.

    Args:
      embeddings, labels: `[N, D]` gallery embeddings and their `[N]` integer labels (also the queries in
        same-set mode).
      ks: the K of Recall@K.
      query_embeddings, query_labels: query set for query/gallery evaluation (In-shop).
      metrics: any of `"recall"`, `"map@r"`, `"r_precision"`, `"nmi"`, `"f1"`.
      exact: exact search (default) or ScaNN approximate search (`index_kwargs` go to `ScannIndex`).
      distance: `"squared_euclidean"` (default, as faiss `IndexFlatL2`; its alias `"squared_l2"`) or
        `"dot_product"`; the same ranking for L2-normalised embeddings.
      chunk_size: queries per exact-search block (default: bounded by 256 MiB of scores).
      seed: k-means seed for NMI / F1.
      query_expansion, database_augmentation, expansion_alpha: alpha-QE and DBA with this many neighbours
        (0: off) and this exponent of their weights (`tfdml.retrieval.expansion`): queries, or gallery items
        once before the search, averaged with their top neighbours weighted by cosine ** alpha.

    Returns:
      dict with `recall@K` for each K, `map@r`, `r_precision`, `nmi`, `f1` (those requested), as floats.
      Retrieval metrics average over queries that have at least one same-class gallery item. NMI and F1
      cluster the query set with k-means into as many clusters as it has classes (the embeddings as given,
      without QE or DBA).

    Example:
      >>> evaluate(emb, y, ks=(1, 10), query_expansion=2)
    """
    distance = validate_distance(distance)
    metrics, ks = _check_metrics(metrics, ks)
    gallery, gallery_labels, queries, q_labels = _inputs.checked(embeddings, labels, query_embeddings, query_labels)
    same_set = query_embeddings is None
    searched = expanded_sets(queries, gallery, same_set, query_expansion, database_augmentation, expansion_alpha)
    results = {}
    if any(m in metrics for m in ("recall", "map@r", "r_precision")):
        search = _searcher(searched, same_set, exact, distance, chunk_size, progress, index_kwargs)
        results.update(_retrieval_metrics(search, q_labels, gallery_labels, same_set, metrics, ks))
    if "nmi" in metrics or "f1" in metrics:
        results.update(_clustering_metrics(queries, q_labels, metrics, seed))
    return results


def _searcher(searched, same_set, exact, distance, chunk_size, progress, index_kwargs):
    """`search(k)`: the `[Q, k]` gallery indices of each query's nearest neighbours, exact or approximate."""

    def search(needed):
        if exact:
            return _exact_search(searched, same_set, needed, distance, chunk_size, progress)
        return _approximate_search(*searched, needed, distance, same_set, index_kwargs)

    return search


def _exact_search(searched, same_set, k, distance, chunk_size, progress):
    """`[Q, k]` gallery indices of each query's nearest neighbours; in same-set mode without the query's own
    row (the queries are the gallery's rows, or, after QE or DBA, stand for them)."""
    queries, gallery = searched
    if same_set and queries is gallery:
        return exact_search(queries, None, k, distance, chunk_size=chunk_size, progress=progress)[0]
    found = exact_search(queries, gallery, k + same_set, distance, chunk_size=chunk_size, progress=progress)[0]
    return drop_own_rows(found, 0)[0] if same_set else found


def _clustering_metrics(queries, labels, metrics, seed):
    """NMI and F1 (those in `metrics`) of the queries clustered by k-means into as many clusters as classes."""
    clusters = M.cluster_embeddings(queries, len(np.unique(labels)), seed=seed)
    scores = {"nmi": M.nmi, "f1": M.clustering_f1}
    return {name: score(clusters, labels) for name, score in scores.items() if name in metrics}


def _check_metrics(metrics, ks):
    metrics = tuple(metrics)
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {METRICS}.")
    ks = tuple(int(k) for k in ks)
    if "recall" in metrics and (not ks or min(ks) < 1):
        raise ValueError(f"ks must be positive integers, got {ks}.")
    return metrics, ks


def _retrieval_metrics(search, q_labels, gallery_labels, same_set, metrics, ks):
    """Recall@K, MAP@R and R-precision over the queries that have a same-class gallery item; `search(k)`
    returns the `[Q, k]` gallery indices of each query's nearest neighbours."""
    r = M.positives_per_query(q_labels, gallery_labels, same_set)
    valid = r > 0
    if not valid.any():
        raise ValueError("no query has a same-class item in the gallery; retrieval metrics are undefined.")
    needed = max(ks) if "recall" in metrics else 1
    if "map@r" in metrics or "r_precision" in metrics:
        needed = max(needed, int(r.max()))
    available = gallery_labels.shape[0] - same_set
    if needed > available:
        raise ValueError(f"max(ks)={needed} exceeds the {available} gallery items each query can see.")
    hits = M.neighbour_hits(search(needed)[valid], q_labels[valid], gallery_labels)
    results = {}
    if "recall" in metrics:
        results.update({f"recall@{k}": value for k, value in M.recall_at_k(hits, ks).items()})
    if "map@r" in metrics:
        results["map@r"] = M.map_at_r(hits, r[valid])
    if "r_precision" in metrics:
        results["r_precision"] = M.r_precision(hits, r[valid])
    return results
