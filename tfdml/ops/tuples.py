"""Explicit tuples within a batch.

Batch-level losses never list their tuples (they combine masks, see `masks.py`). A tuple loss's `terms`
(`tfdml.ops.terms`), which methods that weight every tuple individually need, list them:
`triplet_indices` returns every valid `(anchor, positive, negative)` of a batch and
`pair_indices_with_targets` every unordered pair, each optionally capped to a random subset of at most
`max_tuples` drawn with a stateless seed (the same seed gives the same subset on every device and every run).
"""

import tensorflow as tf

from tfdml.ops.masks import negative_mask, pair_indices, positive_mask


def _cap(tuples, max_tuples, seed):
    """At most `max_tuples` rows of `tuples`, a uniform random subset kept in its original order."""
    if max_tuples is None:
        return tuples
    if int(max_tuples) < 1:
        raise ValueError(f"max_tuples must be a positive integer or None, got {max_tuples}.")
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
    labels = tf.convert_to_tensor(labels)
    positives = pair_indices(positive_mask(labels))  # [P, 2] (a, p)
    negatives_of_pair = tf.gather(negative_mask(labels), positives[:, 0])  # [P, B]
    pair_and_negative = pair_indices(negatives_of_pair)  # [T, 2] (pair id, n)
    triplets = tf.concat([tf.gather(positives, pair_and_negative[:, 0]), pair_and_negative[:, 1:]], axis=1)
    return _cap(tf.reshape(triplets, [-1, 3]), max_tuples, seed)


def pair_indices_with_targets(labels, max_tuples=None, seed=None):
    """All unordered pairs `(i, j)`, `i < j`, of a batch and whether each is a positive (same-class) pair.

    Returns:
        `(pairs, is_positive)`: int32 `[P, 2]` and bool `[P]`.
    """
    labels = tf.convert_to_tensor(labels)
    size = tf.shape(labels)[0]
    upper = tf.linalg.band_part(tf.ones([size, size], tf.bool), 0, -1)
    upper = tf.logical_and(upper, tf.logical_not(tf.cast(tf.eye(size), tf.bool)))
    pairs = _cap(tf.reshape(pair_indices(upper), [-1, 2]), max_tuples, seed)
    is_positive = tf.equal(tf.gather(labels, pairs[:, 0]), tf.gather(labels, pairs[:, 1]))
    return pairs, is_positive


def triplet_distances(distances, triplets):
    """`(d_ap, d_an)`, each `[T]`, of `[T, 3]` `(anchor, positive, negative)` rows of a distance matrix."""
    triplets = tf.cast(triplets, tf.int32)
    d_ap = tf.gather_nd(distances, tf.stack([triplets[:, 0], triplets[:, 1]], axis=1))
    d_an = tf.gather_nd(distances, tf.stack([triplets[:, 0], triplets[:, 2]], axis=1))
    return d_ap, d_an
