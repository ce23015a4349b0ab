"""Explicit tuples within a batch, and the loss of each tuple on its own.

Batch-level losses never list their tuples (they combine masks, see `masks.py`). Methods that weight every
tuple individually (DML-ALA) need them listed: `triplet_indices` returns every valid `(anchor, positive,
negative)` of a batch and `pair_indices_with_targets` every unordered pair, each optionally capped to a
random subset of at most `max_tuples` drawn with a stateless seed (the same seed gives the same subset on
every device and every run).

The per-tuple losses use the formulas of the batch-level losses in `tfdml.losses` (before their reduction):

    triplet      [d_ap - d_an + margin]+, or squared distances (eq 4 of DML-ALA)  (TripletLoss, mining="all")
    margin       [d_ap - beta + alpha]+ + [beta - d_an + alpha]+          (MarginLoss, one triplet)
    contrastive  [d - pos_margin]+ for a positive pair, [neg_margin - d]+ for a negative pair (ContrastiveLoss)

with `d = tfdml.ops.pairwise_distance` (Euclidean, gradient-safe at 0).
"""

import tensorflow as tf

from tfdml.ops.distances import pairwise_distance
from tfdml.ops.masks import negative_mask, pair_indices, positive_mask
from tfdml.ops.reductions import safe_divide
from tfdml.ops.scalars import as_scalar


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


def triplet_tuple_losses(embeddings, triplets, margin=0.2, squared=False):
    """`[d_ap - d_an + margin]+` of each triplet (`[d_ap^2 - d_an^2 + margin]+` with `squared`): float `[T]`."""
    d_ap, d_an = triplet_distances(pairwise_distance(embeddings, squared=squared), triplets)
    return tf.nn.relu(d_ap - d_an + as_scalar(margin, d_ap.dtype))


def triplet_hardness(embeddings, triplets):
    """`d(a, p) / d(a, n)` of each triplet (Euclidean; 0 where `d(a, n) = 0`), the hardness whose weighted
    mean is DML-ALA's average weighted hardness (Fig. 4c): float `[T]`."""
    d_ap, d_an = triplet_distances(pairwise_distance(embeddings), triplets)
    return safe_divide(d_ap, d_an)


def margin_tuple_losses(embeddings, triplets, alpha=0.2, beta=1.2):
    """`[d_ap - beta + alpha]+ + [beta - d_an + alpha]+` of each triplet (Wu et al. 2017): float `[T]`."""
    d_ap, d_an = triplet_distances(pairwise_distance(embeddings), triplets)
    alpha, beta = as_scalar(alpha, d_ap.dtype), as_scalar(beta, d_ap.dtype)
    return tf.nn.relu(d_ap - beta + alpha) + tf.nn.relu(beta - d_an + alpha)


def contrastive_tuple_losses(embeddings, pairs, is_positive, pos_margin=0.0, neg_margin=1.0):
    """`[d - pos_margin]+` for positive pairs, `[neg_margin - d]+` for negative pairs: float `[P]`."""
    dist = pairwise_distance(embeddings)
    d = tf.gather_nd(dist, pairs)
    return tf.where(
        is_positive, tf.nn.relu(d - as_scalar(pos_margin, d.dtype)), tf.nn.relu(as_scalar(neg_margin, d.dtype) - d)
    )
