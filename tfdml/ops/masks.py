"""Label masks for pairs and triplets within a batch, in `keras.ops` (static shapes on every backend).

`labels` is an integer vector `[B]` (already validated). Masks are boolean `[B, B]` (or `[B, G]` with
gallery labels). `triplet_mask` is the `[B, B, B]` mask of the valid triplets, for the terms of a tuple
loss; the losses' fast paths never build it (they combine an anchor-positive mask with an anchor-negative
mask per anchor).
"""

from keras import ops


def not_self_mask(size, columns=None):
    """bool `[size, columns]`, false on the diagonal."""
    return ops.logical_not(ops.cast(ops.eye(size, size if columns is None else columns), "bool"))


def same_label_mask(labels, gallery_labels=None):
    """`mask[i, j] = labels[i] == gallery_labels[j]` (the diagonal included)."""
    gallery_labels = labels if gallery_labels is None else gallery_labels
    return ops.equal(labels[:, None], gallery_labels[None, :])


def positive_mask(labels):
    """Same class and `i != j`."""
    return ops.logical_and(same_label_mask(labels), not_self_mask(ops.shape(labels)[0]))


def negative_mask(labels, gallery_labels=None):
    """Different class."""
    return ops.logical_not(same_label_mask(labels, gallery_labels))


def upper_pair_mask(size):
    """bool `[size, size]`: the unordered pairs `i < j`."""
    return ops.triu(ops.ones((size, size), "bool"), k=1)


def triplet_mask(positives, negatives):
    """bool `[B, B, G]` `valid[a, p, n]`: `(a, p)` a positive pair and `(a, n)` a negative pair."""
    return ops.logical_and(positives[:, :, None], negatives[:, None, :])


def pair_indices(mask):
    """`[P, 2]` int32 indices `(i, j)` of the true entries of a `[B, B]` mask, in row-major order.

    A variable-length list: for eager code and TensorFlow graphs (the tuples DML-ALA weights), not for a
    traced JAX function; the losses themselves use the masks.
    """
    rows, columns = ops.nonzero(mask)
    return ops.cast(ops.stack([rows, columns], axis=1), "int32")
