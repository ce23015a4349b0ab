"""Label masks for pairs within a batch.

`labels` is an integer vector `[B]` (already validated). Masks are boolean `[B, B]` (or `[B, G]` with
gallery labels). Triplets are never materialised as `[B, B, B]` masks: losses that need all triplets
combine an anchor-positive mask with an anchor-negative mask per anchor.
"""

import tensorflow as tf


def same_label_mask(labels, gallery_labels=None):
    """`mask[i, j] = labels[i] == gallery_labels[j]` (the diagonal included)."""
    gallery_labels = labels if gallery_labels is None else gallery_labels
    return tf.equal(labels[:, None], gallery_labels[None, :])


def positive_mask(labels):
    """Same class and `i != j`."""
    same = same_label_mask(labels)
    not_self = tf.logical_not(tf.cast(tf.eye(tf.shape(labels)[0]), tf.bool))
    return tf.logical_and(same, not_self)


def negative_mask(labels, gallery_labels=None):
    """Different class."""
    return tf.logical_not(same_label_mask(labels, gallery_labels))


def pair_indices(mask):
    """`[P, 2]` int32 indices `(i, j)` of the true entries of a `[B, B]` mask, in row-major order."""
    return tf.cast(tf.where(mask), tf.int32)
