"""The label-noise benchmark's labels: a seed's noisy training labels, the validation split of the training
classes, and a small verified set."""

import numpy as np

from benchmarks.reality_check import reality_check as rc
from tfdml.data.label_noise import symmetric_label_noise

NOISE_SEED = 7919  # the noise of seed s is drawn from [NOISE_SEED, s, noise level in per mille]


def noisy_data(data, noise, seed):
    """`data` (benchmark_methods.load_data) with the training labels of seed `seed` at noise level `noise`."""
    labels, corrupted = symmetric_label_noise(data["train_y"], noise, [NOISE_SEED, int(seed), round(1000 * noise)])
    return dict(data, train_y=labels.astype(np.int64), true_y=data["train_y"], corrupted=corrupted)


def validation_split(data):
    """`rc.split_training_classes(data)` (100 training characters by their noisy labels, renumbered, and 50 to
    score) keeping the true labels in the renumbered space, for the verified set and the weight AUC: an image
    whose true character is one of the 50 gets `-1 - character`, equal to no training label."""
    part = rc.split_training_classes(data)
    if "true_y" in data:
        kept = np.isin(data["train_y"], np.unique(part["test_y"]), invert=True)
        classes = np.unique(data["train_y"][kept])  # part["train_y"] is their rank in this sorted list
        true = data["true_y"][kept]
        inside = np.isin(true, classes)
        part["true_y"] = np.where(inside, np.searchsorted(classes, true), -1 - true).astype(np.int64)
    return part


def trusted_labels(data, classes, per_class, seed):
    """Labels of a small verified set: `per_class` images of each of `classes` training characters drawn at
    random, with their true labels (what a user gets by checking that many images by hand); -1 elsewhere. Where
    fewer than `classes` training classes exist (Fashion-MNIST's validation split has 3), all of them."""
    rng = np.random.default_rng([int(seed), 7907])
    true = data.get("true_y", data["train_y"])
    available = np.unique(true[true >= 0])
    chosen = rng.choice(available, min(int(classes), len(available)), replace=False)
    labels = np.full_like(true, -1)
    for c in chosen:
        picked = rng.choice(np.flatnonzero(true == c), per_class, replace=False)
        labels[picked] = c
    return labels
