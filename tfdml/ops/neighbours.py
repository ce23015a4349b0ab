"""Exact k-nearest-neighbour search between embedding matrices, chunked so memory stays bounded.

Ranking uses a *score* where larger means nearer, computed with one matmul per chunk:

- `"dot_product"`: `s_ij = q_i . g_j`;
- `"squared_euclidean"` (ScaNN's and faiss' `"squared_l2"`, accepted as an alias):
  `s_ij = q_i . g_j - ||g_j||^2 / 2`, so that `||q_i - g_j||^2 = ||q_i||^2 - 2 s_ij`. The
  per-query constant `||q_i||^2` does not change the ranking; `||g_j||^2` rides along as an extra matmul
  column (`ranking_operands`), so each block costs one matmul and one top-k, with no elementwise pass.

In same-set mode each query takes its top `k + 1` and drops its own row (not other rows at distance 0).
On large galleries the top-k runs only on the column blocks with the largest maxima (exact, see
`_blocked_search_chunk`), which costs a fraction of a full top-k over every column.

Ties are broken by the lower gallery index (`tf.math.top_k` is stable), like a stable sort of the distances.
"""

import keras
import numpy as np
import tensorflow as tf

from tfdml.ops.distances import distance_name

# The rankings' names in tfdml's vocabulary of distances (`tfdml.ops.distances`); "squared_l2" is an alias.
DISTANCES = ("dot_product", "squared_euclidean")

# Score matrices are processed in blocks of at most this many bytes ([chunk, gallery] float32 scores).
DEFAULT_MEMORY_BUDGET = 256 * 2**20


def validate_distance(distance):
    """`distance`'s name in `DISTANCES` ("squared_l2" gives "squared_euclidean"), else a `ValueError` naming the
    choices."""
    return distance_name(distance, DISTANCES, aliases=("squared_l2",))


def ranking_operands(queries, gallery, distance="squared_euclidean"):
    """NumPy `(q', g')` with `q' g'^T` = the ranking scores, so one matmul needs no elementwise pass.

    For `"squared_euclidean"` a column is appended: `q' = [q, -1/2]`, `g' = [g, ||g||^2]`, giving
    `q.g - ||g||^2 / 2` (half the score of the module docstring: the same ranking).
    """
    if validate_distance(distance) == "dot_product":
        return queries, gallery
    half = np.full((queries.shape[0], 1), -0.5, queries.dtype)
    norms = np.einsum("ij,ij->i", gallery, gallery)[:, None].astype(gallery.dtype)
    return np.concatenate([queries, half], axis=1), np.concatenate([gallery, norms], axis=1)


def ranking_scores(queries, gallery, distance="squared_euclidean"):
    """`[Q, G]` scores, larger = nearer: `q.g` or `q.g - ||g||^2 / 2` (see `ranking_operands`)."""
    q, g = ranking_operands(np.asarray(queries, np.float32), np.asarray(gallery, np.float32), distance)
    return tf.matmul(q, g, transpose_b=True)


def search_chunk_rows(num_gallery, k, memory_budget):
    """Query rows per chunk of an exact search: as many as keep a chunk's scores and top-k within
    `memory_budget` bytes (at least one, at most 65,536)."""
    per_row = 4 * (num_gallery + 2 * k)
    return int(max(1, min(65536, memory_budget // max(per_row, 1))))


# Padding rows of the blocked search score about -5e29: never among the top k of real rows.
_PAD_NORM = 1e30


@tf.function(reduce_retracing=True, autograph=False)  # no Python control flow on tensors
def _search_chunk(queries, gallery, k):
    return tf.math.top_k(tf.matmul(queries, gallery, transpose_b=True), k=k, sorted=True)


@tf.function(reduce_retracing=True, autograph=False)  # no Python control flow on tensors
def _blocked_search_chunk(queries, gallery, k, block):
    """Exact top-k that runs the full top-k only on the `k` column blocks with the largest maxima.

    Each of those blocks holds an element >= their smallest maximum, so the top k lie inside them unless an
    element elsewhere ties with the k-th value: any element outside is <= `outside_max` (the (k+1)-th
    largest block maximum). Rows where the k-th value is not strictly above it are flagged for a plain
    top-k. Selected blocks are kept in column order, so ties still go to the lower index.
    """
    scores = tf.matmul(queries, gallery, transpose_b=True)
    blocks = tf.reshape(scores, [tf.shape(scores)[0], -1, block])
    block_max, top_blocks = tf.math.top_k(tf.reduce_max(blocks, axis=2), k=k + 1)
    selected = tf.sort(top_blocks[:, :k], axis=1)
    candidates = tf.reshape(tf.gather(blocks, selected, batch_dims=1), [tf.shape(scores)[0], -1])
    values, positions = tf.math.top_k(candidates, k=k, sorted=True)
    columns = tf.gather(selected, positions // block, batch_dims=1) * block + positions % block
    return values, columns, values[:, -1] <= block_max[:, -1]


def search_block_size(num_gallery, width):
    """Column block for `_blocked_search_chunk`: candidates at most 1/8 of the gallery, else 0 (plain)."""
    block = min(64, num_gallery // (8 * (width + 1)))
    return block if block >= 16 else 0


def _pad_for_blocks(query_ops, gallery_ops, block, augmented):
    """Adds a (-1/2, 0) column pair if absent and pads the gallery to whole blocks with very far rows."""
    if not augmented:
        query_ops = np.concatenate([query_ops, np.full((len(query_ops), 1), -0.5, np.float32)], axis=1)
        gallery_ops = np.concatenate([gallery_ops, np.zeros((len(gallery_ops), 1), np.float32)], axis=1)
    missing = -len(gallery_ops) % block
    pad = np.zeros((missing, gallery_ops.shape[1]), np.float32)
    pad[:, -1] = _PAD_NORM
    return query_ops, np.concatenate([gallery_ops, pad], axis=0)


def drop_own_rows(found, first_row, *aligned):
    """`[Q, k+1]` neighbours -> `[Q, k]` without query `i`'s own row `first_row + i` (else the last one).

    Removing the query from its top `k + 1` gives exactly the top `k` of the other rows, tie order kept.
    Arrays in `aligned` (e.g. the scores) lose the same entries. Returns a tuple.
    """
    rows, width = found.shape
    own = found == (np.arange(rows) + first_row)[:, None]
    drop = np.where(own.any(axis=1), own.argmax(axis=1), width - 1)
    keep = np.arange(width)[None, :] != drop[:, None]
    return tuple(a[keep].reshape(rows, width - 1) for a in (found, *aligned))


def exact_search(
    queries,
    gallery=None,
    k=10,
    distance="squared_euclidean",
    chunk_size=None,
    memory_budget=DEFAULT_MEMORY_BUDGET,
    progress=False,
    block_size=None,
):
    """Exact top-`k` neighbours of each query row among the gallery rows.

    Args:
      queries: `[Q, D]` float array.
      gallery: `[G, D]` float array; `None` means "same set": the gallery is `queries` and each query's own
        row is excluded (other rows at distance 0 are kept).
      k: number of neighbours (at most `G`, or `G - 1` in same-set mode).
      distance: `"squared_euclidean"` (or its alias `"squared_l2"`) or `"dot_product"`.
      chunk_size: queries per block; default chosen so one `[chunk, G]` block fits `memory_budget` bytes.
      progress: show a `keras.utils.Progbar`.
      block_size: column block of the blocked top-k (`_blocked_search_chunk`); default automatic (used
        when the candidate blocks are at most 1/8 of the gallery), 0 forces a plain top-k over all columns.

    Returns:
      `(indices, distances)`: int64 `[Q, k]` gallery indices, nearest first, and their squared L2 distances
      (ascending) or dot products (descending).

    Example:
      >>> idx, dist = exact_search(np.eye(3, dtype="float32"), k=1)
    """
    distance = validate_distance(distance)
    same_set = gallery is None
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    gallery = queries if same_set else np.ascontiguousarray(gallery, dtype=np.float32)
    _check_search_arguments(queries, gallery, k, same_set)
    num_queries = queries.shape[0]
    chunk = chunk_size or search_chunk_rows(gallery.shape[0], k, memory_budget)
    query_ops, gallery_ops = ranking_operands(queries, gallery, distance)
    width = k + 1 if same_set else k  # same set: one more, the query's own row is dropped
    block = search_block_size(gallery.shape[0], width) if block_size is None else block_size
    if block:
        query_ops, gallery_ops = _pad_for_blocks(query_ops, gallery_ops, block, distance == "squared_euclidean")
    gallery_t = tf.constant(gallery_ops)
    out_idx = np.empty((num_queries, k), np.int64)
    out_val = np.empty((num_queries, k), np.float32)
    bar = keras.utils.Progbar(num_queries, unit_name="query") if progress else None
    for start in range(0, num_queries, chunk):
        stop = min(start + chunk, num_queries)
        scores, indices = _top_scores(tf.constant(query_ops[start:stop]), gallery_t, width, block)
        if same_set:
            indices, scores = drop_own_rows(indices, start, scores)
        out_idx[start:stop], out_val[start:stop] = indices, scores
        if bar is not None:
            bar.update(stop)
    if distance == "squared_euclidean":
        out_val = np.maximum(np.einsum("ij,ij->i", queries, queries)[:, None] - 2.0 * out_val, 0.0)
    return out_idx, out_val


def _check_search_arguments(queries, gallery, k, same_set):
    if queries.ndim != 2 or gallery.ndim != 2:
        raise ValueError(
            f"queries and gallery must be 2-D [rows, dim], got shapes {queries.shape} and {gallery.shape}."
        )
    if queries.shape[1] != gallery.shape[1]:
        raise ValueError(f"queries have dimension {queries.shape[1]} but the gallery has {gallery.shape[1]}.")
    available = gallery.shape[0] - (1 if same_set else 0)
    if not 1 <= k <= available:
        raise ValueError(
            f"k must be between 1 and {available} (gallery size"
            f"{' minus the query itself' if same_set else ''}), got {k}."
        )
    if not (np.isfinite(queries).all() and np.isfinite(gallery).all()):
        raise ValueError("embeddings contain NaN or Inf values.")


def _top_scores(chunk_queries, gallery_t, width, block):
    """NumPy `(scores, int64 indices)` of the `width` best gallery columns of each query row: blocked when
    `block`, with the rows whose k-th value is tied redone by a plain top-k."""
    if not block:
        scores, indices = _search_chunk(chunk_queries, gallery_t, tf.constant(width))
        return scores.numpy(), indices.numpy().astype(np.int64)
    scores, indices, ties = _blocked_search_chunk(chunk_queries, gallery_t, tf.constant(width), tf.constant(block))
    scores, indices, ties = scores.numpy(), indices.numpy(), ties.numpy()
    if ties.any():  # a tie at the k-th value may sit outside the selected blocks
        redo = np.flatnonzero(ties)
        plain_scores, plain_indices = _search_chunk(tf.gather(chunk_queries, redo), gallery_t, tf.constant(width))
        scores[redo], indices[redo] = plain_scores.numpy(), plain_indices.numpy()
    return scores, indices.astype(np.int64)
