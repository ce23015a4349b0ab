"""Synthetic label noise, to measure how a method copes with wrong labels before trusting it with real ones."""

import numpy as np


def symmetric_label_noise(labels, fraction, seed=0):
    """`(noisy labels, corrupted flags)`: `round(fraction * n)` items chosen at random get the label of another
    class, chosen uniformly among the other classes present (symmetric noise).

    Args:
        labels: int `[n]` class ids.
        fraction: the share of items whose label changes, in [0, 1].
        seed: anything `numpy.random.default_rng` takes (an int, or a sequence of ints).

    Returns:
        `(labels [n], bool [n])`: the new labels (same dtype) and which items were changed.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}.")
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels).copy()
    classes = np.unique(labels)
    if fraction > 0 and classes.size < 2:
        raise ValueError("symmetric_label_noise needs at least two classes to move labels between.")
    corrupted = np.zeros(labels.size, bool)
    corrupted[rng.choice(labels.size, int(round(fraction * labels.size)), replace=False)] = True
    for i in np.flatnonzero(corrupted):
        labels[i] = rng.choice(classes[classes != labels[i]])
    return labels, corrupted
