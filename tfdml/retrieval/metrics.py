"""Retrieval and clustering metrics from ranked neighbour lists (pure NumPy functions).

Notation: for query `q` with label `y_q`, `hits[q, i]` is 1 when its `i`-th nearest gallery item (nearest
first, the query itself already excluded in same-set mode) has label `y_q`; `R_q` is the number of gallery
items with label `y_q` (the query itself not counted).

- Recall@K = mean over queries of `1[any(hits[q, :K])]` (SPEC.md: at least one same-class item in the top K).
- R-precision = mean over queries of `sum(hits[q, :R_q]) / R_q`.
- MAP@R (Musgrave et al. 2020, "A Metric Learning Reality Check", eq. 4) = mean over queries of
  `(1 / R_q) * sum_{i <= R_q} P_q(i) * hits[q, i]`, with `P_q(i) = sum(hits[q, :i]) / i`.
- Clustering F1 (Song et al. 2017, used by DML-ALA): pair counting over the `n(n-1)/2` pairs,
  precision = same-cluster-and-same-class / same-cluster pairs, recall = ... / same-class pairs.

Queries with `R_q = 0` (no same-class item in the gallery) cannot retrieve anything: the retrieval metrics
average over the other queries (as pytorch-metric-learning's AccuracyCalculator does).
"""

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score


def positives_per_query(query_labels, gallery_labels, same_set):
    """`R_q`: gallery items sharing the query's label, minus the query itself in same-set mode."""
    gallery_labels = np.asarray(gallery_labels)
    classes, counts = np.unique(gallery_labels, return_counts=True)
    pos = np.searchsorted(classes, query_labels)
    pos = np.clip(pos, 0, len(classes) - 1)
    found = classes[pos] == query_labels
    r = np.where(found, counts[pos], 0)
    return r - 1 if same_set else r


def neighbour_hits(neighbour_indices, query_labels, gallery_labels):
    """Boolean `[Q, k]`: does each retrieved gallery item share its query's label."""
    gallery_labels = np.asarray(gallery_labels)
    return gallery_labels[neighbour_indices] == np.asarray(query_labels)[:, None]


def recall_at_k(hits, ks):
    """`{K: Recall@K}` from `[Q, >= max(ks)]` hits."""
    first_hit = np.where(hits.any(axis=1), hits.argmax(axis=1), hits.shape[1])
    return {k: float(np.mean(first_hit < k)) for k in ks}


def _hits_within_r(hits, r):
    columns = np.arange(hits.shape[1])[None, :]
    return hits & (columns < r[:, None])


def r_precision(hits, r):
    """Mean of `|relevant in top R_q| / R_q` over queries (`hits` has at least `max(R_q)` columns)."""
    return float(np.mean(_hits_within_r(hits, r).sum(axis=1) / r))


def average_precision_at_r(hits, r):
    """`[Q]`: each query's term of MAP@R, `(1 / R_q) * sum_{i <= R_q} P_q(i) * hits[q, i]` (`hits` has at
    least `max(R_q)` columns)."""
    within = _hits_within_r(hits, r)
    precision_at_i = np.cumsum(within, axis=1) / np.arange(1, hits.shape[1] + 1)[None, :]
    return np.sum(precision_at_i * within, axis=1) / r


def map_at_r(hits, r):
    """MAP@R (Musgrave et al. 2020) over queries (`hits` has at least `max(R_q)` columns)."""
    return float(np.mean(average_precision_at_r(hits, r)))


def cluster_embeddings(embeddings, num_clusters, seed=0):
    """k-means cluster ids (scikit-learn `KMeans`, k-means++ init, `n_init=1` above 20k points for speed)."""
    n_init = 3 if len(embeddings) <= 20000 else 1
    return KMeans(n_clusters=num_clusters, n_init=n_init, random_state=seed).fit_predict(
        np.asarray(embeddings, np.float64)
    )


def nmi(cluster_ids, labels):
    """Normalised mutual information between clusters and classes (arithmetic normalisation)."""
    return float(normalized_mutual_info_score(labels, cluster_ids))


def clustering_f1(cluster_ids, labels):
    """Pair-counting F1 between clusters and classes (see the module docstring)."""
    _, cluster_inv = np.unique(cluster_ids, return_inverse=True)
    _, label_inv = np.unique(labels, return_inverse=True)
    table = np.zeros((cluster_inv.max() + 1, label_inv.max() + 1), np.float64)
    np.add.at(table, (cluster_inv, label_inv), 1.0)

    def pairs(counts):
        return float(np.sum(counts * (counts - 1) / 2.0))

    true_pos = pairs(table)
    same_cluster = pairs(table.sum(axis=1))
    same_class = pairs(table.sum(axis=0))
    precision = true_pos / same_cluster if same_cluster else 0.0
    recall = true_pos / same_class if same_class else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
