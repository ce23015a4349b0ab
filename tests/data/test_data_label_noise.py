"""`tfdml.data.symmetric_label_noise`: exactly the requested share of labels moves, each to another class,
spread evenly over the other classes, the same draws for the same seed; bad fractions are refused."""

import numpy as np
import pytest

from tfdml.data import symmetric_label_noise


def test_the_share_moves_to_other_classes_evenly_and_reproducibly():
    labels = np.repeat(np.arange(5), 400)
    noisy, corrupted = symmetric_label_noise(labels, 0.4, seed=[3, 1])
    assert corrupted.sum() == 800
    np.testing.assert_array_equal(noisy != labels, corrupted)  # each moved label is another class
    np.testing.assert_array_equal(noisy[~corrupted], labels[~corrupted])
    # Each class's moved items spread over the 4 other classes (200 expected each, 160 items per class).
    for c in range(5):
        moved_to = noisy[corrupted & (labels == c)]
        counts = np.bincount(moved_to, minlength=5)
        assert counts[c] == 0
        expected = moved_to.size / 4
        assert np.all(np.abs(np.delete(counts, c) - expected) < 5 * np.sqrt(expected))
    again, _ = symmetric_label_noise(labels, 0.4, seed=[3, 1])
    np.testing.assert_array_equal(again, noisy)
    assert not np.array_equal(symmetric_label_noise(labels, 0.4, seed=[3, 2])[0], noisy)


def test_no_noise_changes_nothing_and_bad_input_is_refused():
    labels = np.array([0, 0, 1, 1, 2])
    noisy, corrupted = symmetric_label_noise(labels, 0.0)
    np.testing.assert_array_equal(noisy, labels)
    assert not corrupted.any()
    with pytest.raises(ValueError, match=r"fraction must be a number in \[0, 1\], got 1.5"):
        symmetric_label_noise(labels, 1.5)
    with pytest.raises(ValueError, match="needs at least two classes"):
        symmetric_label_noise(np.zeros(4, int), 0.5)
