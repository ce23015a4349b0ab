"""`worst_queries`: the queries an embedding serves worst, with what they retrieved instead.

Two orders (`by`):

- `"rank"` (default): by the rank of the query's nearest correct item (the first same-class gallery item
  in its ranking; 1 = top), worst first, ties by average precision. The queries that miss Recall@1 come
  first, the ones whose class is farthest away at the top.
- `"ap"`: by the query's average precision, its term of MAP@R (`tfdml.retrieval.metrics`), lowest first,
  ties by the rank of the nearest correct item.

The ranking is the one `tfdml.retrieval.evaluate` scores (exact search, same-set mode without the query's own
row, ties by the lower gallery index); queries without a same-class gallery item cannot be ranked and are
left out.
"""

import dataclasses

import numpy as np

from tfdml.ops.neighbours import exact_search, ranking_scores, validate_distance
from tfdml.retrieval import _inputs
from tfdml.retrieval import metrics as M

ORDERS = ("rank", "ap")


@dataclasses.dataclass(frozen=True)
class WorstQuery:
    """One query: its row, label, top neighbours (gallery rows, nearest first) with their labels and scores,
    its nearest correct gallery item with its rank (1 = top) and score, and its average precision."""

    query: int
    label: int
    neighbours: tuple
    neighbour_labels: tuple
    scores: tuple
    first_correct: int
    first_correct_rank: int
    first_correct_score: float
    average_precision: float


@dataclasses.dataclass(frozen=True)
class WorstQueries:
    """The worst queries, worst first; `score_name` says what the scores are (`"cosine"` for unit-norm
    embeddings, else the distance's value); `evaluated` is the number of queries ranked."""

    queries: list
    by: str
    score_name: str
    same_set: bool
    evaluated: int


def worst_queries(
    embeddings,
    labels,
    query_embeddings=None,
    query_labels=None,
    count=8,
    neighbours=5,
    by="rank",
    distance="squared_euclidean",
):
    """The `count` worst queries of an embedding (see the module docstring for the orders).

    Args:
      embeddings, labels: `[N, D]` gallery embeddings and their `[N]` integer labels (also the queries in
        same-set mode).
      query_embeddings, query_labels: a separate query set (query / gallery mode).
      count: how many queries to return (fewer when fewer can be ranked).
      neighbours: top neighbours kept per query.
      by: `"rank"` (rank of the nearest correct item, default) or `"ap"` (average precision).
      distance: `"squared_euclidean"` (or `"squared_l2"`) or `"dot_product"`, as in `tfdml.retrieval.evaluate`.

    Returns:
      a `WorstQueries`.

    Example:
      >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]], np.float32)
      >>> worst = worst_queries(x, np.array([0, 1, 0, 1]), count=2, neighbours=1)
      >>> [(q.query, q.first_correct_rank) for q in worst.queries]
      [(0, 3), (2, 3)]
    """
    gallery, gallery_labels, queries, q_labels = _inputs.checked(embeddings, labels, query_embeddings, query_labels)
    distance = _check_request(distance, by, count, neighbours)
    same_set = query_embeddings is None
    rows, found, values, precision, correct, rank = _rankings(
        queries, gallery, q_labels, gallery_labels, same_set, neighbours, distance
    )
    order = np.lexsort((rows, precision, -rank) if by == "rank" else (rows, -rank, precision))
    score_name, shown = _shown_scores(_inputs.unit_norm(gallery) and _inputs.unit_norm(queries), distance)
    worst = []
    for i in order[: int(count)]:
        q, j, top = int(rows[i]), int(correct[i]), found[i, :neighbours]
        worst.append(
            WorstQuery(
                query=q,
                label=int(q_labels[q]),
                neighbours=tuple(int(n) for n in top),
                neighbour_labels=tuple(int(gallery_labels[n]) for n in top),
                scores=tuple(float(shown(v)) for v in values[i, :neighbours]),
                first_correct=j,
                first_correct_rank=int(rank[i]),
                first_correct_score=float(shown(_value(queries[q], gallery[j], distance))),
                average_precision=float(precision[i]),
            )
        )
    return WorstQueries(worst, by, score_name, same_set, len(rows))


def _rankings(queries, gallery, q_labels, gallery_labels, same_set, neighbours, distance):
    """`(rows, found, values, average precision, nearest correct item, its rank)` of the queries that can be
    ranked (those with a same-class gallery item): their searched neighbours (gallery rows and distance
    values, nearest first), their term of MAP@R and their nearest correct gallery row with its rank."""
    r = M.positives_per_query(q_labels, gallery_labels, same_set)
    rows = np.flatnonzero(r > 0)
    if not len(rows):
        raise ValueError("no query has a same-class item in the gallery: no query can be ranked.")
    k = min(max(int(neighbours), int(r.max())), gallery.shape[0] - same_set)
    found, values = exact_search(queries, None if same_set else gallery, k, distance)
    found, values = found[rows], values[rows]
    hits = M.neighbour_hits(found, q_labels[rows], gallery_labels)
    precision = M.average_precision_at_r(hits, r[rows])
    correct, rank = _nearest_correct(queries, gallery, q_labels, gallery_labels, rows, found, hits, distance, same_set)
    return rows, found, values, precision, correct, rank


def _check_request(distance, by, count, neighbours):
    """`distance`'s name in the vocabulary, once the request is checked."""
    distance = validate_distance(distance)
    if by not in ORDERS:
        raise ValueError(f"by must be one of {ORDERS}, got {by!r}.")
    if int(count) < 1 or int(neighbours) < 1:
        raise ValueError(f"count and neighbours must be positive, got {count} and {neighbours}.")
    return distance


def _shown_scores(unit_norm, distance):
    """`(name, value -> shown score)`: the cosine for unit-norm embeddings (as the served index reports it),
    else the distance's own value."""
    if unit_norm and distance == "squared_euclidean":
        return "cosine", lambda d: 1.0 - d / 2.0
    if unit_norm:
        return "cosine", lambda s: s
    return ("squared L2 distance" if distance == "squared_euclidean" else "dot product"), lambda v: v


def _value(query, item, distance):
    if distance == "dot_product":
        return float(np.dot(query, item))
    return float(np.sum((query.astype(np.float64) - item) ** 2))


def _nearest_correct(queries, gallery, q_labels, gallery_labels, rows, found, hits, distance, same_set):
    """`(gallery row, rank)` of each query's nearest same-class item: from the searched neighbours when one
    of them is correct, else by counting the items ranked before it (ties by the lower gallery index)."""
    first = hits.argmax(axis=1)
    correct = found[np.arange(len(rows)), first]
    rank = first + 1
    misses = np.flatnonzero(~hits.any(axis=1))
    columns = np.arange(gallery.shape[0])[None, :]
    for start in range(0, len(misses), 256):
        chunk = misses[start : start + 256]
        q, own = rows[chunk], np.arange(len(chunk))
        scores = np.asarray(ranking_scores(queries[q], gallery, distance), np.float64)
        same = gallery_labels[None, :] == q_labels[q][:, None]
        if same_set:  # the query's own row is not in its ranking
            scores[own, q], same[own, q] = -np.inf, False
        j = np.where(same, scores, -np.inf).argmax(axis=1)  # argmax: the lowest row of equal scores
        best = scores[own, j][:, None]
        before = np.sum(scores > best, axis=1) + np.sum((scores == best) & (columns < j[:, None]), axis=1)
        correct[chunk], rank[chunk] = j, np.maximum(before + 1, hits.shape[1] + 1)
    return correct, rank
