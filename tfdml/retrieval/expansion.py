"""Query expansion and database-side augmentation: re-ranking by averaging an embedding with its neighbours.

alpha-QE (alpha-weighted query expansion, Radenovic, Tolias and Chum, "Fine-tuning CNN Image Retrieval with
No Human Annotation", TPAMI 2018): a query `q` is searched once, and its top-`n` gallery neighbours
`x_1..x_n` (cosine similarities `s_i = q . x_i`) are averaged into it with weights `s_i^alpha`, the query
itself with weight 1 (its own similarity, `q . q = 1`):

    q' = normalise(q + sum_{i=1..n} max(s_i, 0)^alpha * x_i)

`q'` is then searched again. `alpha = 0` is plain average query expansion (Chum et al. 2007); a large alpha
keeps only the nearest neighbours' pull. Negative similarities are clipped to 0 (no pull for alpha > 0; a fractional
power of a negative number is undefined).

DBA (database-side augmentation, Gordo et al. 2017, with the same alpha weights) applies the same update
offline to every gallery item with its own top-`n` gallery neighbours (itself excluded, then added with
weight 1), once; queries then search the augmented gallery, and QE uses the augmented vectors.

Every vector is L2-normalised first (the methods are defined on unit descriptors, where the dot product is
the cosine). `n = 0` leaves the vectors unchanged. Neighbours come from `tfdml.ops.exact_search` (ties by
the lower gallery index).
"""

import numpy as np

from tfdml.ops.neighbours import drop_own_rows, exact_search


def l2_normalise(x):
    """Rows of `x` scaled to unit L2 norm (zero rows stay zero)."""
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def check_expansion(neighbours, alpha, name="query_expansion"):
    """`(neighbours, alpha)` checked: a whole number >= 0 and a finite alpha >= 0."""
    if isinstance(neighbours, bool) or not isinstance(neighbours, (int, np.integer)) or neighbours < 0:
        raise ValueError(f"{name} must be a whole number of neighbours >= 0 (0: off), got {neighbours!r}.")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)) or not 0 <= alpha < np.inf:
        raise ValueError(f"expansion_alpha must be a finite number >= 0, got {alpha!r}.")
    return int(neighbours), float(alpha)


def expand(vectors, neighbour_vectors, similarities, alpha):
    """`normalise(v + sum_i max(s_i, 0)^alpha * x_i)` for each row: `vectors` `[Q, D]`, `neighbour_vectors`
    `[Q, n, D]`, `similarities` `[Q, n]`."""
    weights = np.maximum(np.asarray(similarities, np.float64), 0.0) ** alpha
    summed = np.asarray(vectors, np.float64) + np.einsum("qn,qnd->qd", weights, neighbour_vectors)
    return l2_normalise(summed)


def _top(queries, gallery, n, exclude_own_rows):
    """`(indices, cosines)` `[Q, n]` of the unit `queries` among the unit `gallery`; `exclude_own_rows`: query
    `i` is gallery row `i` and not its own neighbour."""
    width = n + 1 if exclude_own_rows else n
    found, scores = exact_search(queries, gallery, width, "dot_product")
    if exclude_own_rows:
        found, scores = drop_own_rows(found, 0, scores)
    return found, scores


def query_expansion(queries, gallery, neighbours=1, alpha=3.0, same_set=False):
    """alpha-QE (see the module docstring): each query averaged with its top-`neighbours` gallery items.

    Args:
      queries: `[Q, D]` query embeddings.
      gallery: `[G, D]` gallery embeddings (DBA-augmented ones, when DBA is used).
      neighbours: `n`, the gallery items averaged into each query (0: the normalised queries unchanged).
      alpha: the exponent of the similarity weights.
      same_set: the queries are the gallery's own rows (query `i` is row `i`, not its own neighbour).

    Returns:
      `[Q, D]` unit-norm expanded queries.

    Example:
      >>> print(np.array2string(query_expansion([[1.0, 0.0]], [[0.6, 0.8], [0.0, 1.0]], 1), precision=3))
      [[0.989 0.151]]
    """
    neighbours, alpha = check_expansion(neighbours, alpha)
    queries, gallery = l2_normalise(queries), l2_normalise(gallery)
    available = len(gallery) - bool(same_set)
    if neighbours == 0:
        return queries
    if neighbours > available:
        raise ValueError(f"query_expansion={neighbours} exceeds the {available} gallery items a query can see.")
    found, scores = _top(queries, gallery, neighbours, same_set)
    return expand(queries, gallery[found], scores, alpha)


def database_augmentation(gallery, neighbours=1, alpha=3.0):
    """DBA (see the module docstring): each gallery item averaged with its own top-`neighbours` gallery items
    (itself excluded from them, and added with weight 1).

    Args:
      gallery: `[G, D]` gallery embeddings.
      neighbours: `n` (0: the normalised gallery unchanged).
      alpha: the exponent of the similarity weights.

    Returns:
      `[G, D]` unit-norm augmented gallery.

    Example:
      >>> database_augmentation(np.eye(3), neighbours=2).tolist()  # orthogonal items pull nothing
      [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    neighbours, alpha = check_expansion(neighbours, alpha, "database_augmentation")
    gallery = l2_normalise(gallery)
    if neighbours == 0:
        return gallery
    if neighbours > len(gallery) - 1:
        raise ValueError(f"database_augmentation={neighbours} exceeds the {len(gallery) - 1} other gallery items.")
    found, scores = _top(gallery, gallery, neighbours, True)
    return expand(gallery, gallery[found], scores, alpha)


def expanded_sets(queries, gallery, same_set, query_neighbours=0, database_neighbours=0, alpha=3.0):
    """`(queries, gallery)` to search after DBA (`database_neighbours`) of the gallery and then alpha-QE
    (`query_neighbours`) of the queries against it; both unchanged when both counts are 0."""
    query_neighbours, alpha = check_expansion(query_neighbours, alpha)
    database_neighbours, _ = check_expansion(database_neighbours, alpha, "database_augmentation")
    if not query_neighbours and not database_neighbours:
        return queries, gallery
    gallery = database_augmentation(gallery, database_neighbours, alpha)
    return query_expansion(queries, gallery, query_neighbours, alpha, same_set), gallery
