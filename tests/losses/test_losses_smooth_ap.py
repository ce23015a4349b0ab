"""SmoothAPLoss: value and gradient equal pytorch-metric-learning's `SmoothAPLoss` where PML applies (labels in
blocks, as many classes as samples per class; `tests/references/smooth_ap_reference.json` from
`tests/references/generators/smooth_ap_reference.py`), a NumPy
loop over the paper's formula on any batch (unequal, shuffled
classes) with finite-difference gradients, degenerate batches, config and training."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests import REFERENCES
from tests import loss_checks as checks
from tfdml.losses import SmoothAPLoss, smooth_ap_loss

with open(os.path.join(REFERENCES, "smooth_ap_reference.json")) as _f:
    REFERENCE = json.load(_f)


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: f"{c['batch']}-t{c['temperature']}")
def test_value_and_gradient_equal_pytorch_metric_learning(case):
    batch = REFERENCE["batches"][case["batch"]]
    labels = np.asarray(batch["labels"], np.int32)
    value, grad = checks.value_and_gradient(
        lambda y, x: smooth_ap_loss(y, x, case["temperature"]), labels, tf.constant(batch["embeddings"], tf.float64)
    )
    # PML sums each anchor's AP into a float32 tensor: its figures carry float32 round-off.
    np.testing.assert_allclose(value.numpy(), case["value"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad.numpy(), case["grad_embeddings"], rtol=0, atol=2e-7)


def test_reference_file_is_from_pml_2_9_and_not_trivial():
    assert REFERENCE["pml_version"].startswith("2.9")
    assert sum(case["value"] > 0.01 for case in REFERENCE["cases"]) >= 4
    assert sum(np.abs(case["grad_embeddings"]).max() > 1e-3 for case in REFERENCE["cases"]) >= 4


def _smoothed_rank(row, x, over, temperature):
    return 1.0 + sum(1.0 / (1.0 + np.exp(-(row[y] - row[x]) / temperature)) for y in over if y != x)


def numpy_smooth_ap(labels, embeddings, temperature):
    """The paper's formula, one anchor and one positive at a time (positives include the anchor)."""
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    sim = unit @ unit.T
    losses = []
    for a in range(len(labels)):
        positives = [x for x in range(len(labels)) if labels[x] == labels[a]]
        ap = 0.0
        for x in positives:
            ap += _smoothed_rank(sim[a], x, positives, temperature) / _smoothed_rank(
                sim[a], x, range(len(labels)), temperature
            )
        losses.append(1.0 - ap / len(positives))
    return float(np.mean(losses))


@pytest.mark.parametrize("seed", [0, 1])
def test_any_batch_equals_the_formula_with_finite_difference_gradients(seed):
    labels, embeddings = checks.random_batch(seed, 11, 4)  # unequal, shuffled classes: beyond PML
    temperature = 0.1
    value, _ = checks.value_and_gradient(lambda y, x: smooth_ap_loss(y, x, temperature), labels, embeddings)
    np.testing.assert_allclose(value.numpy(), numpy_smooth_ap(labels, embeddings, temperature), rtol=1e-12)
    checks.assert_gradient_matches(
        lambda y, x: smooth_ap_loss(y, x, temperature),
        lambda x: numpy_smooth_ap(labels, x, temperature),
        labels,
        embeddings,
        atol=1e-7,
    )


@pytest.mark.parametrize("case", sorted(checks.DEGENERATE_BATCHES))
def test_degenerate_batches_are_finite(case):
    labels, embeddings = checks.DEGENERATE_BATCHES[case]
    checks.assert_finite(SmoothAPLoss(), labels, embeddings)


@pytest.mark.slow
def test_config_errors_and_training():
    checks.assert_config_roundtrip(SmoothAPLoss(temperature=0.05))
    with pytest.raises(ValueError, match=r"SmoothAPLoss: temperature must be in \(0, 10000\], got 0.0"):
        SmoothAPLoss(temperature=0.0)
    checks.assert_bad_inputs_rejected(SmoothAPLoss())
    checks.assert_fit_lowers_loss(SmoothAPLoss(temperature=0.1))
