"""tfdml.retrieval.calibrate against an independent computation written from the definition (loops), closed and
open set; the open-set threshold's precision on a fresh stream of present and absent queries; calibrations that
cannot be measured record no threshold."""

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
    cal = calibrate(embeddings, labels, target_precision=target, mode="closed")
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
    angles = 0.1 * np.arange(12)  # equally spaced on an arc, the classes alternating:
    embeddings = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    labels = np.arange(12) % 2  # every nearest neighbour is of the other class
    cal = calibrate(embeddings, labels, target_precision=0.5, mode="closed")
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


def open_set_reference(embeddings, labels, target, absent_share):
    """The open-set threshold from the definition with plain loops: each item is a present query (top-1 over
    all other items) and an absent query (top-1 over the items of the other classes: its class left out of
    the gallery, so any match is wrong); precision on a stream with `absent_share` absent queries."""
    x = [np.asarray(e, np.float64) / np.linalg.norm(e) for e in embeddings]
    present, absent = [], []
    for i in range(len(x)):
        best, best_j, impostor = -math.inf, None, -math.inf
        for j in range(len(x)):
            if j == i:
                continue
            score = float(x[i] @ x[j])
            if score > best:
                best, best_j = score, j
            if labels[j] != labels[i]:
                impostor = max(impostor, score)
        present.append((best, labels[best_j] == labels[i]))
        absent.append(impostor)
    fitted = []
    for t in sorted({s for s, _ in present} | set(absent)):
        right = sum(ok for s, ok in present if s >= t) / len(present)
        accepted_present = sum(1 for s, _ in present if s >= t) / len(present)
        accepted_absent = sum(1 for a in absent if a >= t) / len(absent)
        accepted = (1 - absent_share) * accepted_present + absent_share * accepted_absent
        if accepted == 0:
            continue
        precision = (1 - absent_share) * right / accepted
        if precision >= target:
            recall = sum(ok for s, ok in present if s >= t) / sum(ok for _, ok in present)
            fitted.append((t, precision, recall, accepted_absent))
    return present, absent, (fitted[0] if fitted else None)


@pytest.mark.parametrize("seed,target,share", [(0, 0.9, 0.5), (5, 0.8, 0.5), (8, 0.95, 0.3), (2, 0.9, 0.7)])
def test_open_set_threshold_equals_the_reference(seed, target, share):
    embeddings, labels = labelled_set(seed, spread=0.6)
    cal = calibrate(embeddings, labels, target_precision=target, absent_share=share)
    assert cal.mode == "open" and cal.absent_share == share  # auto: open set with 6 classes
    present, absent, expected = open_set_reference(embeddings, labels, target, share)
    np.testing.assert_allclose(cal.scores, [s for s, _ in present], atol=1e-5)
    np.testing.assert_allclose(cal.absent_scores, absent, atol=1e-5)
    assert expected is not None and cal.reached
    np.testing.assert_allclose([cal.threshold, cal.precision, cal.recall, cal.absent_match_rate], expected, atol=1e-5)
    summary = cal.to_dict()
    assert summary["mode"] == "open" and summary["absent"]["match_rate"] == cal.absent_match_rate
    assert "absent from the gallery" in cal.promise()


def clusters(rng, centres, per_class, spread):
    labels = np.repeat(np.arange(len(centres)), per_class)
    return centres[labels] + spread * rng.normal(size=(len(labels), centres.shape[1])), labels


def test_open_set_precision_holds_for_absent_classes_and_closed_set_does_not():
    """A small open-world problem: a gallery of 40 classes, calibrated on its own items at precision 0.9; then
    fresh queries, half of the gallery's classes and half of 40 classes the gallery does not hold. The
    open-set threshold keeps its stated precision on that stream; the closed-set one (fitted for present
    queries only) matches most absent queries and falls far below what it states."""
    rng = np.random.default_rng(0)
    dim, spread = 16, 0.7
    centres = rng.normal(size=(80, dim)) / np.sqrt(dim)
    gallery, gallery_labels = clusters(rng, centres[:40], 10, spread / np.sqrt(dim))
    present, present_labels = clusters(rng, centres[:40], 25, spread / np.sqrt(dim))
    absent, _ = clusters(rng, centres[40:], 25, spread / np.sqrt(dim))

    def stream_precision(threshold):
        g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
        hits = 0
        accepted = 0
        for queries, labels in ((present, present_labels), (absent, None)):
            q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
            sims = q @ g.T
            top = sims.argmax(axis=1)
            matched = sims[np.arange(len(q)), top] >= threshold
            accepted += matched.sum()
            if labels is not None:
                hits += (matched & (gallery_labels[top] == labels)).sum()
        return hits / accepted

    open_set = calibrate(gallery, gallery_labels, target_precision=0.9)
    closed_set = calibrate(gallery, gallery_labels, target_precision=0.9, mode="closed")
    assert open_set.mode == "open" and closed_set.mode == "closed"
    assert open_set.reached and closed_set.reached and open_set.threshold > closed_set.threshold
    assert abs(stream_precision(open_set.threshold) - open_set.precision) < 0.05
    assert stream_precision(closed_set.threshold) < closed_set.precision - 0.2


@pytest.mark.parametrize(
    "labels,reason",
    [
        (np.zeros(30, int), "1 class"),  # a gallery of one class: every top-1 match is "correct"
        (np.arange(30), "have another item of their class"),  # every item its own class (a classifier's ids)
        (np.repeat(np.arange(4), 2), "at least 10"),  # too few queries
    ],
)
def test_a_calibration_that_cannot_be_measured_records_no_threshold(labels, reason):
    embeddings = np.random.default_rng(1).normal(size=(len(labels), 4)).astype(np.float32)
    cal = calibrate(embeddings, labels, target_precision=0.9)
    assert not cal.measurable and reason in cal.note
    assert not cal.reached and cal.threshold == math.inf and cal.table == []
    summary = cal.to_dict()
    assert summary["threshold"] is None and summary["measurable"] is False
    assert cal.promise().startswith("no threshold: the calibration cannot be measured")


def test_bad_mode_and_share_are_named():
    embeddings, labels = labelled_set(0)
    with pytest.raises(ValueError, match="calibration mode must be one of auto, open, closed"):
        calibrate(embeddings, labels, mode="opened")
    with pytest.raises(ValueError, match=r"absent_share must be in \[0, 1\)"):
        calibrate(embeddings, labels, absent_share=1.0)
