"""tfdml.retrieval.calibrate against an independent computation written from the definition (loops)."""

import math

import numpy as np
import pytest

from tfdml.retrieval import calibrate


def reference(embeddings, labels, target):
    """Each item queries every other one (plain loops over pairs); the threshold is the smallest top-1 score
    t whose accepted queries (score >= t) are correct at `target` precision or better."""
    x = [np.asarray(e, np.float64) / np.linalg.norm(e) for e in embeddings]
    top = []
    for i in range(len(x)):
        best, best_j = -math.inf, None
        for j in range(len(x)):
            if j != i and float(x[i] @ x[j]) > best:
                best, best_j = float(x[i] @ x[j]), j
        top.append((best, labels[best_j] == labels[i]))
    fitted = []
    for t in sorted({s for s, _ in top}):
        accepted = [ok for s, ok in top if s >= t]
        precision = sum(accepted) / len(accepted)
        recall = sum(accepted) / max(sum(ok for _, ok in top), 1)
        if precision >= target:
            fitted.append((t, precision, recall))
    return top, (fitted[0] if fitted else None)


def labelled_set(seed, classes=6, per_class=7, dim=5, spread=0.8):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    labels = np.repeat(np.arange(classes), per_class)
    embeddings = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    return embeddings.astype(np.float32), labels


@pytest.mark.parametrize("seed,target", [(0, 0.9), (5, 0.5), (8, 0.8), (2, 0.95), (3, 1.0)])
def test_threshold_equals_the_reference_and_keeps_the_target_precision(seed, target):
    embeddings, labels = labelled_set(seed)
    labels[-1] = 99  # a class of one: its match is always wrong
    cal = calibrate(embeddings, labels, target_precision=target)
    top, expected = reference(embeddings, labels, target)
    np.testing.assert_allclose(cal.scores, [s for s, _ in top], atol=1e-5)
    np.testing.assert_array_equal(cal.correct, [ok for _, ok in top])
    assert 0 < cal.correct.sum() < len(labels)  # the data set is neither trivial nor hopeless
    assert expected is not None and cal.reached
    np.testing.assert_allclose([cal.threshold, cal.precision, cal.recall], expected, atol=1e-5)
    # The property a user relies on: on the pairs it was fitted on, the threshold gives the target precision.
    accepted = cal.correct[cal.scores >= cal.threshold]
    assert accepted.mean() >= target and 0 < len(accepted) < len(labels)
    targets = [row["target_precision"] for row in cal.table]
    assert target in targets and targets == sorted(targets)
    assert cal.to_dict()["threshold"] == cal.threshold


def test_unreachable_target_matches_nothing():
    embeddings = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], np.float32)
    labels = np.array([0, 1, 0, 1])  # every nearest neighbour is of the other class
    cal = calibrate(embeddings, labels, target_precision=0.5)
    assert not cal.reached and cal.threshold == math.inf and cal.to_dict()["threshold"] is None
    assert not cal.correct.any()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="one label per row"):
        calibrate(np.zeros((3, 2)), [0, 1])
    with pytest.raises(ValueError, match="at least 2"):
        calibrate(np.ones((1, 2)), [0])
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        calibrate(np.ones((3, 2)), [0, 0, 1], target_precision=1.5)
    with pytest.raises(ValueError, match="NaN"):
        calibrate(np.array([[np.nan, 1], [1, 1]]), [0, 0])
