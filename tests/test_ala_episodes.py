"""`episode_dataset(disjoint_labels=False)`: the random episodes of DML-ALA's Table 1 ablation."""

import numpy as np
import pytest

import tfdml.data as data


def _source(num_classes=6, per_class=8):
    labels = np.repeat(np.arange(num_classes), per_class)
    # Each image is filled with its own item index, so an episode tells which items it holds.
    images = np.broadcast_to(np.arange(labels.size, dtype=np.uint8)[:, None, None, None], (labels.size, 4, 4, 1))
    return data.array_source(np.ascontiguousarray(images), labels)


def _episodes(ds, n):
    return [tuple(np.asarray(t) for t in episode) for episode in ds.take(n)]


def test_random_episodes_may_share_labels_and_stay_class_balanced():
    source = _source()
    kwargs = dict(train_size=12, val_size=6, train_classes=4, val_classes=3, seed=0, preprocess=lambda x: x)
    random = _episodes(data.episode_dataset(source, disjoint_labels=False, **kwargs), 40)
    shared = 0
    for train_x, train_y, val_x, val_y in random:
        assert train_x.shape == (12, 4, 4, 1) and val_x.shape == (6, 4, 4, 1)
        assert np.unique(train_y, return_counts=True)[1].tolist() == [3] * 4
        assert np.unique(val_y, return_counts=True)[1].tolist() == [2] * 3
        items = train_x[:, 0, 0, 0].astype(int), val_x[:, 0, 0, 0].astype(int)
        np.testing.assert_array_equal(items[0] // 8, train_y)  # each image belongs to its label
        np.testing.assert_array_equal(items[1] // 8, val_y)
        shared += bool(set(train_y) & set(val_y))
    # 4 + 3 classes out of 6 always overlap; with 4 of 6 and 3 of 6 drawn independently, so do they here.
    assert shared == 40
    disjoint = _episodes(data.episode_dataset(_source(num_classes=10), **kwargs), 40)
    assert all(not set(e[1]) & set(e[3]) for e in disjoint)
    again = _episodes(data.episode_dataset(source, disjoint_labels=False, **kwargs), 3)
    for a, b in zip(random, again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_random_episodes_can_share_labels_that_disjoint_ones_cannot():
    source = _source(num_classes=10)
    kwargs = dict(train_size=8, val_size=4, train_classes=4, val_classes=2, seed=1, preprocess=lambda x: x)
    random = _episodes(data.episode_dataset(source, disjoint_labels=False, **kwargs), 60)
    overlaps = [len(set(e[1]) & set(e[3])) for e in random]
    assert 0 < sum(o > 0 for o in overlaps) < 60  # sometimes, not always
    with pytest.raises(ValueError, match="disjoint label sets"):
        data.episode_dataset(_source(num_classes=5), **kwargs)
    data.episode_dataset(_source(num_classes=5), disjoint_labels=False, **kwargs)  # 4 classes suffice
