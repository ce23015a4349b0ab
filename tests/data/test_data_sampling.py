"""Class-balanced batches, epochs, determinism, small classes, errors, distribution and ALA episodes."""

import logging

import numpy as np
import pytest
import tensorflow as tf

import tfdml.data as data


def tagged_source(counts, size=4, num_classes=None):
    """Array source whose pixel (0, 0) holds the label and pixel (0, 1) the item index, so a batch can be
    checked against the source item by item."""
    labels = np.concatenate([np.full(n, c) for c, n in enumerate(counts)]).astype(np.int64)
    images = np.zeros((labels.size, size, size, 1), np.uint8)
    images[:, 0, 0, 0] = labels
    images[:, 0, 1, 0] = np.arange(labels.size)
    return data.array_source(images, labels, num_classes=num_classes)


def decode_tags(images):
    pixels = np.rint(np.asarray(images)[:, 0, :2, 0]).astype(np.int64)  # raw 0-255 pixels
    return pixels[:, 0], pixels[:, 1]


def take(ds, n):
    return [tuple(np.asarray(t) for t in element) for element in ds.take(n)]


COUNTS = [3, 4, 5, 6, 7, 8, 9, 10, 3, 5]  # 10 classes of uneven size, all >= K


def test_every_batch_has_exactly_c_classes_of_k_images():
    source = tagged_source(COUNTS)
    c, k = 4, 3
    for images, labels in take(data.class_balanced_dataset(source, c, k, seed=1), 30):
        assert images.shape == (c * k, 4, 4, 1) and images.dtype == np.float32
        assert labels.shape == (c * k,)
        per_class = labels.reshape(c, k)
        assert np.all(per_class == per_class[:, :1]), "a class must fill K consecutive rows"
        assert len(set(per_class[:, 0])) == c, "C distinct classes per batch"
        tag_labels, items = decode_tags(images)
        np.testing.assert_array_equal(tag_labels, labels)  # each image belongs to its label
        np.testing.assert_array_equal(source.labels[items], labels)
        for row in items.reshape(c, k):
            assert len(set(row)) == k, "classes with >= K items are sampled without replacement"


def test_within_class_sampling_is_uniform_without_replacement():
    from tfdml.data.sampling import sample_without_replacement

    rows = 3000
    counts = tf.constant([10] * rows + [5] * rows + [2] * rows, tf.int64)
    offsets = sample_without_replacement(counts, 3, tf.constant([0, 1], tf.int64)).numpy()
    big, mid, small = offsets[:rows], offsets[rows : 2 * rows], offsets[2 * rows :]
    for block, n in ((big, 10), (mid, 5)):
        assert block.min() == 0 and block.max() == n - 1
        assert all(len(set(row)) == 3 for row in block), "no repeats when the class has >= K items"
        frequency = np.bincount(block.ravel(), minlength=n) / rows
        np.testing.assert_allclose(frequency, 3 / n, atol=0.04)  # each item in a draw with prob. K / n
    # A 2-item class: both items, one of them twice (replacement spreads the picks evenly).
    assert all(sorted(set(row)) == [0, 1] and row[0] == row[2] for row in small)


@pytest.mark.slow
def test_within_class_order_is_a_uniform_random_permutation():
    """Group Loss takes the first samples of each class as its anchors, "randomly chosen": every item of a
    class must be equally likely in every position. Drawing 3 of 10, Floyd's order never puts items 8 and 9
    first (slot 0 draws from items 0..7): a chi-square over (position, item) counts catches that."""
    source = tagged_source([10, 10])
    batches = 800
    counts = np.zeros((3, 20), np.int64)  # position in the class block x item
    for images, _ in take(data.class_balanced_dataset(source, 2, 3, seed=4, parallel_batches=1), batches):
        _, items = decode_tags(images)
        for block in items.reshape(2, 3):
            counts[np.arange(3), block] += 1
    for position in range(3):
        for cls in range(2):
            observed = counts[position, 10 * cls : 10 * (cls + 1)]
            expected = observed.sum() / 10.0  # 800 draws per class and position, 80 per item
            chi2 = np.sum((observed - expected) ** 2 / expected)
            assert chi2 < 33.7, (position, cls, observed)  # 9 degrees of freedom: p = 1e-4
            assert observed.min() > 0.5 * expected


def test_epoch_visits_every_class_before_any_repeat():
    source = tagged_source(COUNTS)
    c, k = 4, 2
    steps = data.steps_per_epoch(source, c)
    assert steps == 3
    batches = take(data.class_balanced_dataset(source, c, k, seed=3, epochs=4), 100)
    assert len(batches) == 4 * steps  # `epochs` bounds the stream
    for epoch in range(4):
        slots = [labels.reshape(c, k)[:, 0] for _, labels in batches[epoch * steps : (epoch + 1) * steps]]
        order = np.concatenate(slots)
        # The first 10 slots of the epoch are a permutation of all classes; the rest complete the last batch.
        assert sorted(order[:10]) == list(range(10))
        assert len(set(slots[-1])) == c


@pytest.mark.slow
def test_same_seed_same_batches_other_seed_differs():
    source = tagged_source(COUNTS)
    kwargs = dict(classes_per_batch=3, samples_per_class=2, image_size=6, augment=data.Augment(resize=8))
    first = take(data.class_balanced_dataset(source, seed=7, **kwargs), 6)
    second = take(data.class_balanced_dataset(source, seed=7, **kwargs), 6)
    other = take(data.class_balanced_dataset(source, seed=8, **kwargs), 6)
    for (x1, y1), (x2, y2) in zip(first, second):
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(x1, x2)
    assert not all(np.array_equal(y1, y3) for (_, y1), (_, y3) in zip(first, other))


def test_small_class_sampled_with_replacement_and_reported(caplog):
    source = tagged_source([1, 4, 4, 2])
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        ds = data.class_balanced_dataset(source, 4, 3, seed=0)
    reports = [r.getMessage() for r in caplog.records if "fewer than samples_per_class=3" in r.getMessage()]
    assert len(reports) == 1
    assert "2 classes" in reports[0] and "0 (1)" in reports[0] and "3 (2)" in reports[0]
    assert source.class_counts == {0: 1, 1: 4, 2: 4, 3: 2}
    for images, labels in take(ds, 3):
        _, items = decode_tags(images)
        rows = dict(zip(labels.reshape(4, 3)[:, 0], items.reshape(4, 3)))
        assert list(rows[0]) == [0, 0, 0]  # the single image, three times
        assert sorted(set(rows[3])) == [9, 10]  # both items of class 3, one of them twice


def test_drop_small_classes(caplog):
    source = tagged_source([1, 4, 4, 2, 5])
    with caplog.at_level(logging.WARNING, logger="tfdml.data"):
        ds = data.class_balanced_dataset(source, 3, 3, seed=0, drop_small_classes=True)
    assert any("are dropped" in r.getMessage() for r in caplog.records)
    seen = np.concatenate([labels for _, labels in take(ds, 6)])
    assert set(seen) == {1, 2, 4}
    assert data.steps_per_epoch(source, 3, 3, drop_small_classes=True) == 1
    with pytest.raises(ValueError, match="3 usable classes, fewer than classes_per_batch=4 after dropping"):
        data.class_balanced_dataset(source, 4, 3, drop_small_classes=True)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(classes_per_batch=0, samples_per_class=2), ValueError, "classes_per_batch must be a positive"),
        (dict(classes_per_batch=2, samples_per_class=-1), ValueError, "samples_per_class must be a positive"),
        (
            dict(classes_per_batch=11, samples_per_class=2),
            ValueError,
            "has 10 usable classes, fewer than classes_per_batch=11",
        ),
        (
            dict(classes_per_batch=3, samples_per_class=2, num_replicas=2),
            ValueError,
            "classes_per_batch=3 is not divisible by num_replicas=2",
        ),
        (dict(classes_per_batch=2, samples_per_class=2, seed=1.5), TypeError, "seed must be an int"),
        (dict(classes_per_batch=2, samples_per_class=2, augment=True), ValueError, "pass image_size"),
        (dict(classes_per_batch=2, samples_per_class=2, augment="yes"), TypeError, "augment must be True"),
        (dict(classes_per_batch=2, samples_per_class=2, epochs=0), ValueError, "epochs must be a positive"),
    ],
)
def test_class_balanced_argument_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        data.class_balanced_dataset(tagged_source(COUNTS), **kwargs)


def test_source_errors():
    with pytest.raises(ValueError, match="is empty"):
        data.class_balanced_dataset(data.array_source(np.zeros((0, 4, 4), np.uint8), np.zeros(0, int)), 1, 1)
    with pytest.raises(ValueError, match=r"labels out of range: found class id 5 but num_classes=3"):
        data.array_source(np.zeros((2, 4, 4), np.uint8), [0, 5], num_classes=3)
    with pytest.raises(ValueError, match=r"labels out of range: found -1"):
        data.array_source(np.zeros((2, 4, 4), np.uint8), [0, -1])
    with pytest.raises(ValueError, match="2 images but labels has shape"):
        data.array_source(np.zeros((2, 4, 4), np.uint8), [0, 1, 1])
    with pytest.raises(ValueError, match="labels must be integer class ids"):
        data.array_source(np.zeros((2, 4, 4), np.uint8), [0.5, 1.0])
    with pytest.raises(TypeError, match="images must be uint8 or float"):
        data.array_source(np.zeros((2, 4, 4), bool), [0, 1])


def test_streaming_loads_only_what_the_batches_need():
    """A 2,000-item source: taking two batches loads a few batches' worth of items, never the source."""
    loaded = []
    labels = np.repeat(np.arange(100), 20)

    def read(i):
        loaded.append(int(i))
        return np.full((4, 4, 1), labels[i], np.uint8)

    def load(i):
        image = tf.numpy_function(read, [i], tf.uint8)
        image.set_shape([4, 4, 1])
        return image

    source = data.Source(labels, load, channels=1, name="counting")
    ds = data.class_balanced_dataset(source, 4, 2, seed=0, prefetch=False, parallel_batches=1)
    batches = take(ds, 2)
    assert len(batches) == 2
    assert 16 <= len(loaded) <= 6 * 8, len(loaded)  # in-flight batches only, not 2,000 images
    for images, labels_ in batches:
        np.testing.assert_allclose(images[:, 0, 0, 0], labels_, atol=1e-3)


def test_replica_shares_hold_whole_classes():
    c, k, replicas = 4, 3, 2
    source = tagged_source(COUNTS)
    ds = data.class_balanced_dataset(source, c, k, seed=0, num_replicas=replicas)
    for _, labels in take(ds, 5):
        for share in np.split(labels, replicas):  # tf.distribute splits a batch into contiguous shares
            counts = np.unique(share, return_counts=True)[1]
            assert np.all(counts == k) and counts.size == c // replicas

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    distributed = strategy.experimental_distribute_dataset(
        data.class_balanced_dataset(source, c, k, seed=0, num_replicas=replicas)
    )
    for _, (_, labels) in zip(range(3), distributed):
        shares = [np.asarray(t) for t in strategy.experimental_local_results(labels)]
        assert len(shares) == replicas
        for share in shares:
            counts = np.unique(share, return_counts=True)[1]
            assert np.all(counts == k) and counts.size == c // replicas
        assert len(set(np.concatenate(shares))) == c


def test_episodes_have_disjoint_label_sets_and_balanced_train_subset():
    source = tagged_source(COUNTS)
    ds = data.episode_dataset(source, train_size=12, val_size=4, train_classes=4, val_classes=2, seed=0)
    episodes = take(ds, 25)
    assert len(episodes) == 25
    for train_x, train_y, val_x, val_y in episodes:
        assert train_x.shape == (12, 4, 4, 1) and val_x.shape == (4, 4, 4, 1)
        assert not set(train_y) & set(val_y), "train and validation labels must be disjoint"
        labels, counts = np.unique(train_y, return_counts=True)
        assert labels.size == 4 and np.all(counts == 3)
        assert np.unique(val_y, return_counts=True)[1].tolist() == [2, 2]
        np.testing.assert_array_equal(decode_tags(train_x)[0], train_y)
        np.testing.assert_array_equal(decode_tags(val_x)[0], val_y)
    again = take(data.episode_dataset(source, train_size=12, val_size=4, train_classes=4, val_classes=2, seed=0), 3)
    for a, b in zip(episodes, again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_episode_defaults_and_errors():
    source = tagged_source([12] * 30)
    train_x, train_y, val_x, val_y = take(data.episode_dataset(source, seed=0), 1)[0]
    assert train_x.shape[0] == 100 and val_x.shape[0] == 20  # 20 classes x 5, 4 classes x 5
    assert np.unique(train_y).size == 20 and np.unique(val_y).size == 4
    assert not set(train_y) & set(val_y)
    with pytest.raises(ValueError, match="train_size=100 is not divisible by train_classes=3"):
        data.episode_dataset(source, train_classes=3)
    with pytest.raises(ValueError, match=r"fewer than train_classes \+ val_classes = 20 \+ 4"):
        data.episode_dataset(tagged_source([6] * 10))


def test_digits_pipeline_shapes_and_range():
    train, test = data.digits("train"), data.digits("test")
    assert train.image_shape == (8, 8, 1) and set(train.classes) == {0, 1, 2, 3, 4}
    assert set(test.classes) == {5, 6, 7, 8, 9} and len(train) + len(test) == 1797
    images, labels = take(data.class_balanced_dataset(train, 5, 4, image_size=32, seed=0), 1)[0]
    assert images.shape == (20, 32, 32, 1) and images.dtype == np.float32
    assert images.min() >= 0.0 and images.max() <= 255.0 and images.max() > 128.0  # raw pixels
    with pytest.raises(ValueError, match="split must be 'train', 'test' or 'all'"):
        data.digits("validation")
