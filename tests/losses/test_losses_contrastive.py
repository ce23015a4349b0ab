"""Contrastive loss (pytorch-metric-learning semantics): values and gradients vs. pytorch-metric-learning 2.9's
own (`tests/references/pml_reference.json`, "normalizing_losses"), values vs. a NumPy reference, gradients vs. finite
differences, degenerate input, XLA, training and serialisation."""

import json
import os

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import REFERENCES
from tests import loss_checks as checks
from tests.references import numpy_losses as ref
from tfdml.losses import ContrastiveLoss, contrastive_loss

with open(os.path.join(REFERENCES, "pml_reference.json")) as _reference:
    PML = json.load(_reference)
PML_CASES = [(name, batch) for name, spec in PML["normalizing_losses"].items() for batch in spec["cases"]]


@pytest.mark.parametrize("name, batch_name", PML_CASES)
def test_equals_pytorch_metric_learning_on_the_embeddings_it_normalises(name, batch_name):
    """PML's ContrastiveLoss L2-normalises the embeddings inside (LpDistance(normalize_embeddings=True));
    tfdml's takes them as its embedders give them, normalised. So PML(x) == tfdml(l2_normalize(x)): value, and
    the gradient with respect to the raw x through the normalisation. On raw, unnormalised embeddings the two
    differ (1.79 vs 1.60 on the class-balanced batch): the user normalises, as tfdml's embedders do."""
    spec, batch = PML["normalizing_losses"][name], PML["batches"][batch_name]
    case = spec["cases"][batch_name]
    labels = np.asarray(batch["labels"], np.int32)
    x = tf.constant(batch["embeddings"], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = ContrastiveLoss(**spec["args"])(labels, tf.math.l2_normalize(x, axis=1))
    grad = tape.gradient(value, x)
    np.testing.assert_allclose(value.numpy(), case["value"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad.numpy(), np.asarray(case["grad_embeddings"]), atol=1e-10)


@pytest.mark.parametrize("pos_margin, neg_margin", [(0.0, 1.0), (0.3, 1.2), (0.5, 0.8), (0.0, 3.0)])
@pytest.mark.parametrize("seed, batch_size, num_classes", [(0, 7, 2), (1, 12, 3), (2, 15, 5), (3, 10, 4)])
def test_matches_numpy_reference(pos_margin, neg_margin, seed, batch_size, num_classes):
    labels, embeddings = checks.random_batch(seed, batch_size, num_classes)
    expected = ref.contrastive(labels, embeddings, pos_margin, neg_margin)
    np.testing.assert_allclose(
        contrastive_loss(labels, embeddings, pos_margin, neg_margin).numpy(), expected, rtol=1e-6
    )
    np.testing.assert_allclose(ContrastiveLoss(pos_margin, neg_margin)(labels, embeddings).numpy(), expected, rtol=1e-6)


def test_each_part_averages_only_its_active_pairs():
    # Positive pair (0, 1) at distance 0.5, (2, 3) at 0.1; negatives far apart except (1, 2) at 0.6.
    embeddings = np.array([[0.0, 0.0], [0.5, 0.0], [1.1, 0.0], [1.2, 0.0]])
    labels = np.array([0, 0, 1, 1])
    # pos terms with pos_margin 0.2: 0.3 (twice, ordered pairs) and 0 (d = 0.1 < 0.2): mean 0.3.
    # neg terms with neg_margin 1.0: only d(1, 2) = 0.6 and d(1, 3) = 0.7 are below 1: mean (0.4 + 0.3) / 2.
    np.testing.assert_allclose(contrastive_loss(labels, embeddings, 0.2, 1.0).numpy(), 0.3 + 0.35, rtol=1e-12)


def test_no_active_pair_gives_zero():
    embeddings = np.array([[0.0, 0.0], [0.0, 0.0], [5.0, 0.0]])
    assert contrastive_loss(np.array([0, 0, 1]), embeddings).numpy() == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pos_margin, neg_margin", [(0.0, 1.0), (0.2, 1.5)])
def test_gradient_matches_finite_differences(seed, pos_margin, neg_margin):
    labels, x = checks.random_batch(seed, 9, 3, dim=3)
    checks.assert_gradient_matches(
        lambda y, e: contrastive_loss(y, e, pos_margin, neg_margin),
        lambda e: ref.contrastive(labels, e, pos_margin, neg_margin),
        labels,
        x,
    )


@pytest.mark.parametrize("batch", sorted(checks.DEGENERATE_BATCHES))
def test_degenerate_batches_are_finite(batch):
    labels, embeddings = checks.DEGENERATE_BATCHES[batch]
    value, _ = checks.assert_finite(ContrastiveLoss(), labels, embeddings)
    np.testing.assert_allclose(value.numpy(), ref.contrastive(labels, embeddings), rtol=1e-6, atol=1e-7)


def test_float16_and_mixed_precision():
    checks.assert_float16_ok(ContrastiveLoss(pos_margin=0.1))


@pytest.mark.slow
@settings(max_examples=15)
@given(labels=hnp.arrays(np.int32, st.integers(1, 9), elements=st.integers(0, 3)), data=st.data())
def test_fuzzed_batches_are_finite(labels, data):
    embeddings = data.draw(
        hnp.arrays(np.float64, (labels.size, 3), elements=st.floats(-2, 2, allow_nan=False, width=32))
    )
    value, _ = checks.assert_finite(ContrastiveLoss(pos_margin=0.1), labels, embeddings)
    assert value.numpy() >= 0.0


def test_bad_inputs_are_rejected():
    checks.assert_bad_inputs_rejected(ContrastiveLoss())
    with pytest.raises(ValueError, match=r"ContrastiveLoss: neg_margin must be in \[0, 4\], got -1.0"):
        ContrastiveLoss(neg_margin=-1.0)


@pytest.mark.slow
def test_jit_compile_matches():
    labels, embeddings = checks.random_batch(6, 13, 4)
    checks.assert_jit_matches_eager(ContrastiveLoss(0.1, 1.0), labels, embeddings)


@pytest.mark.slow
def test_fit_lowers_the_loss():
    checks.assert_fit_lowers_loss(ContrastiveLoss())


def test_config_and_saving_roundtrip(tmp_path):
    restored = checks.assert_config_roundtrip(ContrastiveLoss(pos_margin=0.25, neg_margin=1.5, name="c"))
    assert (restored.pos_margin, restored.neg_margin, restored.name) == (0.25, 1.5, "c")
    checks.assert_saving_roundtrip(ContrastiveLoss(0.1, 0.9), tmp_path)
