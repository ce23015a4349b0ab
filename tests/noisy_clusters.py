"""The label-noise problem at test size: Gaussian class clusters with a share of the labels flipped.

Twelve classes of 40 points in 8 dimensions (centres 2 standard deviations apart on average); each label is
moved to another class with probability `noise`. Episodes draw K points of each of 6 training classes by their
noisy labels and K of each of 2 validation classes by `val_labels` (the true labels for a verified set). The DML-ALA
noise tests (`tests/models/ala/test_ala_noise.py`) and the assessor drift benchmark (`benchmarks/ala_drift`)
train on it: it
lives with the tests, which the benchmarks may import (the tests import no benchmark).
"""

import numpy as np

CLASSES, PER_CLASS, DIM = 12, 40, 8
TRAIN_CLASSES, VAL_CLASSES, K = 6, 2, 4


def noisy_clusters(seed, noise=0.4):
    """Points, true labels, noisy labels and the generator that drew them (for the episodes that follow)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CLASSES, DIM)) * 2.0
    true = np.repeat(np.arange(CLASSES), PER_CLASS)
    x = (centres[true] + rng.normal(size=(true.size, DIM))).astype("float32")
    noisy = true.copy()
    flipped = rng.random(true.size) < noise
    noisy[flipped] = (true[flipped] + rng.integers(1, CLASSES, flipped.sum())) % CLASSES  # another class
    return x, true, noisy.astype("int32"), rng


def subset(rng, labels, classes):
    """Indices of K points of each of `classes` by `labels`."""
    return np.concatenate([rng.choice(np.flatnonzero(labels == c), K, replace=False) for c in classes])


def episodes(x, noisy, rng, steps, val_labels=None):
    """`steps` ALA episodes as a tf.data.Dataset of (train x, train labels, validation x, validation labels).

    Training subsets follow the noisy labels; validation subsets follow `val_labels` (default: the noisy ones).
    """
    import tensorflow as tf

    val_labels = noisy if val_labels is None else val_labels
    drawn = []
    for _ in range(steps):
        classes = rng.permutation(CLASSES)
        train = subset(rng, noisy, classes[:TRAIN_CLASSES])
        val = subset(rng, val_labels, classes[TRAIN_CLASSES : TRAIN_CLASSES + VAL_CLASSES])
        drawn.append((x[train], noisy[train], x[val], val_labels[val]))
    return tf.data.Dataset.from_tensor_slices(tuple(np.stack(parts) for parts in zip(*drawn)))
