"""Label-noise weightings (`tfdml.losses.noise`): the small-loss heuristic drops exactly the fraction of
positive pairs with the largest anchor-positive distance, and PRISM's selection equals a NumPy reading of the
paper's official code (`tests/references/numpy_noise.py`) on fixed memories and on a sequence of batches."""

import numpy as np
import pytest
import tensorflow as tf

from tests import loss_checks as checks
from tests.references import numpy_losses
from tests.references import numpy_noise as ref
from tfdml.losses import PRISM, ContrastiveLoss, TripletSemiHardLoss
from tfdml.losses.noise import farthest_positive_pairs, prism_clean_probability, prism_keep


def _batch(classes=6, per_class=4, dim=8, seed=0, spread=0.3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    labels = np.repeat(np.arange(classes), per_class).astype(np.int32)
    embeddings = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return labels, embeddings


# ------------------------------------------------------------------------------------------------ heuristic
@pytest.mark.parametrize("drop_rate", [0.0, 0.1, 0.25, 0.5, 0.9])
def test_heuristic_drops_exactly_the_farthest_positive_pairs(drop_rate):
    labels, embeddings = _batch(seed=1)
    mask = farthest_positive_pairs(tf.constant(labels), tf.constant(embeddings), drop_rate).numpy()
    np.testing.assert_array_equal(mask, mask.T)
    dropped = {(i, j) for i, j in zip(*np.nonzero(mask)) if i < j}
    assert dropped == ref.farthest_positive_pairs(labels, embeddings, drop_rate)
    positives = 6 * 4 * 3 // 2
    assert len(dropped) == int(np.floor(drop_rate * positives + 0.5))
    assert all(labels[i] == labels[j] for i, j in dropped)


# ------------------------------------------------------------------------------------------------ PRISM
def _memory(seed, size=40, classes=6, dim=8, missing=()):
    labels, embeddings = _batch(classes=classes, per_class=size // classes + 1, dim=dim, seed=seed, spread=0.8)
    keep = ~np.isin(labels, missing)
    return labels[keep][:size], embeddings[keep][:size]


def test_prism_clean_probability_equals_the_papers_rule_on_a_fixed_memory():
    labels, embeddings = _batch(classes=7, per_class=3, seed=2, spread=0.5)
    memory_labels, memory_embeddings = _memory(3, classes=7, missing=(5,))
    # Invalid (empty) slots must not count: pad the memory with rows that are not valid.
    padded_labels = np.concatenate([memory_labels, np.full(5, 1, np.int32)])
    padded = np.concatenate([memory_embeddings, np.ones((5, 8))])
    valid = np.arange(len(padded_labels)) < len(memory_labels)
    got = prism_clean_probability(
        tf.constant(labels), tf.constant(embeddings), tf.constant(padded_labels), tf.constant(padded), valid
    ).numpy()
    expected = ref.clean_probability(labels, embeddings, memory_labels, memory_embeddings)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert np.all(got[labels == 5] == 1.0)  # class 5 has nothing in memory


def test_prism_selection_equals_the_papers_rule_over_a_sequence_of_batches():
    """The same batches through the TensorFlow rule (window and memory carried by hand) and the reference:
    the same keep masks at every step, window resets included (a low window mean keeps everybody, a batch of
    outliers falls back to the fixed fraction)."""
    rate, width = 0.25, 3
    reference = ref.Prism(rate, width)
    window, count = tf.zeros([width], tf.float64), tf.constant(0)
    memory_labels = np.zeros([0], np.int32)
    memory_embeddings = np.zeros([0, 8])
    rng = np.random.default_rng(5)
    flips = 0
    for step in range(8):
        labels, embeddings = _batch(classes=6, per_class=4, seed=10 + step, spread=0.6)
        noisy = labels.copy()
        flip = rng.random(len(labels)) < 0.3
        noisy[flip] = rng.integers(0, 6, flip.sum())
        flips += flip.sum()
        scores = prism_clean_probability(
            tf.constant(noisy),
            tf.constant(embeddings),
            tf.constant(memory_labels),
            tf.constant(memory_embeddings),
            np.ones(len(memory_labels), bool),
        )
        keep, window, count = prism_keep(scores, rate, window, count, has_memory=len(memory_labels) > 0)
        expected = reference.select(noisy, embeddings)
        np.testing.assert_array_equal(keep.numpy(), expected, err_msg=f"step {step}")
        assert int(count) == len(reference.window)
        np.testing.assert_allclose(window.numpy()[: int(count)], reference.window, rtol=1e-12)
        memory_labels = np.concatenate([memory_labels, noisy[keep.numpy()]])
        memory_embeddings = np.concatenate([memory_embeddings, embeddings[keep.numpy()]])
    assert flips > 0


def test_prism_falls_back_to_the_fixed_fraction_and_resets_the_window_when_nobody_clears_it():
    scores = tf.constant([0.01, 0.02, 0.03, 0.04], tf.float64)
    window, count = tf.constant([0.5, 0.6, 0.0], tf.float64), tf.constant(2)
    keep, window, count = prism_keep(scores, 0.5, window, count)
    np.testing.assert_array_equal(keep.numpy(), [False, False, True, True])
    assert int(count) == 1 and window.numpy()[0] == pytest.approx(0.02)


def test_prism_keeps_everybody_without_memory_and_leaves_the_window_alone():
    scores = tf.constant([1.0, 1.0, 1.0, 1.0], tf.float64)
    keep, window, count = prism_keep(scores, 0.5, tf.zeros([3], tf.float64), tf.constant(0), has_memory=False)
    assert keep.numpy().all() and int(count) == 0


def _noisy_batches(steps, seed=5, flip_rate=0.3):
    rng = np.random.default_rng(seed)
    for step in range(steps):
        labels, embeddings = _batch(classes=6, per_class=4, seed=10 + step, spread=0.6)
        flip = rng.random(len(labels)) < flip_rate
        labels[flip] = rng.integers(0, 6, flip.sum())
        yield labels, embeddings


def test_prism_loss_is_the_wrapped_loss_of_the_kept_samples_and_fills_its_memory():
    loss = PRISM(ContrastiveLoss(neg_margin=1.2), noise_rate=0.25, memory_size=500, embedding_dim=8, window_size=3)
    reference = ref.Prism(0.25, 3)
    for step, (labels, embeddings) in enumerate(_noisy_batches(8)):
        keep = reference.select(labels, embeddings)
        expected = numpy_losses.contrastive(labels[keep], embeddings[keep], 0.0, 1.2)
        value = loss(tf.constant(labels), tf.constant(embeddings, tf.float32))
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5, err_msg=f"step {step}")
    labels, _ = loss.stored()
    np.testing.assert_array_equal(labels, reference.memory_labels)


def test_prism_memory_is_a_ring_buffer_of_memory_size():
    """Past `memory_size` kept samples the oldest make room (the centres follow the last 30): the same
    selections as the reference's queue of 30, and the same stored samples."""
    loss = PRISM(ContrastiveLoss(), noise_rate=0.25, memory_size=30, embedding_dim=8, window_size=3)
    reference = ref.Prism(0.25, 3, memory_size=30)
    for step, (labels, embeddings) in enumerate(_noisy_batches(6)):
        keep = reference.select(labels, embeddings)
        expected = numpy_losses.contrastive(labels[keep], embeddings[keep])
        value = loss(tf.constant(labels), tf.constant(embeddings, tf.float32))
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5, err_msg=f"step {step}")
    assert int(loss.memory_count.value.numpy()) == reference.enqueued > 60
    labels, embeddings = loss.stored()
    order = np.argsort([(i - reference.enqueued) % 30 for i in range(30)])  # slot order -> oldest first
    np.testing.assert_array_equal(labels[order], reference.memory_labels)
    np.testing.assert_allclose(embeddings[order], reference.memory_embeddings, rtol=1e-6)


def test_prism_evaluation_calls_use_the_whole_batch_and_leave_the_state_alone():
    loss = PRISM(ContrastiveLoss(), noise_rate=0.4, memory_size=100, embedding_dim=8)
    batches = list(_noisy_batches(2))
    for labels, embeddings in batches:
        loss(tf.constant(labels), tf.constant(embeddings, tf.float32))
    state = [v.value.numpy().copy() for v in loss.non_trainable_variables]
    loss.training = False
    labels, embeddings = batches[0]
    value = loss(tf.constant(labels), tf.constant(embeddings, tf.float32))
    np.testing.assert_allclose(value.numpy(), numpy_losses.contrastive(labels, embeddings), rtol=1e-5)
    for before, variable in zip(state, loss.non_trainable_variables):
        np.testing.assert_array_equal(before, variable.value.numpy())


def test_prism_config_roundtrip_and_bad_arguments():
    loss = PRISM(TripletSemiHardLoss(margin=0.3), noise_rate=0.2, memory_size=64, embedding_dim=8, window_size=5)
    restored = checks.assert_config_roundtrip(loss)
    assert isinstance(restored.loss, TripletSemiHardLoss) and restored.loss.margin == 0.3
    with pytest.raises(ValueError, match=r"noise_rate must be a number in \[0, 1\), got 1.5"):
        PRISM(ContrastiveLoss(), noise_rate=1.5, memory_size=64, embedding_dim=8)
    with pytest.raises(ValueError, match="memory_size must be an integer >= 1"):
        PRISM(ContrastiveLoss(), noise_rate=0.2, memory_size=0, embedding_dim=8)
    with pytest.raises(TypeError, match="PRISM wraps a tfdml MetricLoss, got str"):
        PRISM("contrastive", noise_rate=0.2, memory_size=64, embedding_dim=8)
    with pytest.raises(ValueError, match="a \\(global\\) batch of 24 exceeds memory_size=10"):
        PRISM(ContrastiveLoss(), noise_rate=0.2, memory_size=10, embedding_dim=8)(*_batch()[:1], _batch()[1])


def test_prism_fit_lowers_the_wrapped_loss():
    loss = PRISM(TripletSemiHardLoss(margin=0.2), noise_rate=0.2, memory_size=64, embedding_dim=4)
    checks.assert_fit_lowers_loss(loss, measure=TripletSemiHardLoss(margin=0.2))
