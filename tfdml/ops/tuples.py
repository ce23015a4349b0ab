"""Explicit tuples within a batch.

Losses never list their tuples to compute their value (they combine masks, see `masks.py`). Methods that
weight every tuple individually (DML-ALA) need the list: `triplet_indices` returns every valid
`(anchor, positive, negative)` of a batch and `pair_indices_with_targets` every unordered pair, each
optionally capped to a random subset of at most `max_tuples` drawn with a stateless seed (the same seed gives
the same subset on every device and every run).

The lists have a data-dependent length: they run eagerly on every backend and in TensorFlow graphs, not in a
traced JAX function. The random cap is TensorFlow's stateless sampler (DML-ALA's, which is TensorFlow-only).
"""

from keras import ops

from tfdml.ops.masks import negative_mask, pair_indices, positive_mask, upper_pair_mask


def _cap(tuples, max_tuples, seed):
    """At most `max_tuples` rows of `tuples`, a uniform random subset kept in its original order."""
    if max_tuples is None:
        return tuples
    if int(max_tuples) < 1:
        raise ValueError(f"max_tuples must be a positive integer or None, got {max_tuples}.")
    import tensorflow as tf  # the stateless (seed, step) sampler of DML-ALA, which is TensorFlow-only

    count = tf.shape(tuples)[0]
    keep = tf.minimum(count, int(max_tuples))
    seed = tf.cast(tf.convert_to_tensor(0 if seed is None else seed), tf.int64)
    if seed.shape.rank == 0:
        seed = tf.stack([seed, tf.zeros_like(seed)])
    scores = tf.random.stateless_uniform([count], seed=seed)
    _, chosen = tf.math.top_k(scores, k=keep)
    return tf.gather(tuples, tf.sort(chosen))


def triplet_indices(labels, max_tuples=None, seed=None):
    """All valid triplets `(a, p, n)` of a batch: `y_a == y_p`, `a != p`, `y_a != y_n`.

    Args:
        labels: int `[B]` class ids.
        max_tuples: keep a random subset of at most this many triplets (None: all of them).
        seed: int or `[2]` int stateless seed of that subset (for example `(seed, step)`).

    Returns:
        int32 `[T, 3]`, ordered by anchor, then positive, then negative (a capped subset keeps that order).
    """
    labels = ops.convert_to_tensor(labels)
    positives = pair_indices(positive_mask(labels))  # [P, 2] (a, p)
    negatives_of_pair = ops.take(negative_mask(labels), positives[:, 0], axis=0)  # [P, B]
    pair_and_negative = pair_indices(negatives_of_pair)  # [T, 2] (pair id, n)
    anchor_positive = ops.take(positives, pair_and_negative[:, 0], axis=0)
    triplets = ops.concatenate([anchor_positive, pair_and_negative[:, 1:]], axis=1)
    return _cap(ops.reshape(triplets, (-1, 3)), max_tuples, seed)


def pair_indices_with_targets(labels, max_tuples=None, seed=None):
    """All unordered pairs `(i, j)`, `i < j`, of a batch and whether each is a positive (same-class) pair.

    Returns:
        `(pairs, is_positive)`: int32 `[P, 2]` and bool `[P]`.
    """
    labels = ops.convert_to_tensor(labels)
    pairs = _cap(ops.reshape(pair_indices(upper_pair_mask(ops.shape(labels)[0])), (-1, 2)), max_tuples, seed)
    is_positive = ops.equal(ops.take(labels, pairs[:, 0]), ops.take(labels, pairs[:, 1]))
    return pairs, is_positive


def pair_values(matrix, pairs):
    """`matrix[i, j]` of each `[P, 2]` `(i, j)` row: `[P]`."""
    pairs = ops.cast(pairs, "int32")
    return ops.take(ops.reshape(matrix, (-1,)), pairs[:, 0] * ops.shape(matrix)[1] + pairs[:, 1])


def triplet_distances(distances, triplets):
    """`(d_ap, d_an)`, each `[T]`, of `[T, 3]` `(anchor, positive, negative)` rows of a distance matrix."""
    triplets = ops.cast(triplets, "int32")
    return pair_values(distances, triplets[:, :2]), pair_values(distances, ops.take(triplets, [0, 2], axis=1))
