"""Shared primitives in tfdml.ops against NumPy, including their gradients at the awkward points."""

import numpy as np
import pytest
import tensorflow as tf

from tfdml import ops


def _np_dist(a, b):
    return np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))


@pytest.mark.parametrize("seed", range(3))
def test_pairwise_distance_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(7, 5))
    g = rng.normal(size=(4, 5))
    np.testing.assert_allclose(ops.pairwise_distance(x).numpy(), _np_dist(x, x), atol=1e-12)
    np.testing.assert_allclose(ops.pairwise_distance(x, g).numpy(), _np_dist(x, g), atol=1e-12)
    np.testing.assert_allclose(ops.pairwise_distance(x, squared=True).numpy(), _np_dist(x, x) ** 2, atol=1e-12)


def test_pairwise_distance_gradient_finite_and_exact_for_duplicates_and_zeros():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3))
    x = np.concatenate([x, x[:1], np.zeros((1, 3))])  # a duplicate row and a zero row
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        total = tf.reduce_sum(ops.pairwise_distance(xt))
    grad = tape.gradient(total, xt).numpy()
    assert np.all(np.isfinite(grad))
    # Away from coincident points the gradient is sum_j 2 (x_i - x_j) / d_ij (each pair counted twice).
    d = _np_dist(x, x)
    expected = np.zeros_like(x)
    for i in range(len(x)):
        for j in range(len(x)):
            if d[i, j] > 1e-9:
                expected[i] += 2 * (x[i] - x[j]) / d[i, j]
    np.testing.assert_allclose(grad, expected, atol=1e-9)


def test_pearson_similarity_matches_numpy_and_handles_constant_rows():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 6))
    expected = np.corrcoef(x)
    np.testing.assert_allclose(ops.pairwise_pearson_similarity(x).numpy(), expected, atol=1e-12)
    const = np.concatenate([x, np.full((1, 6), 3.0)])
    xt = tf.constant(const)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        sim = ops.pairwise_pearson_similarity(xt)
        total = tf.reduce_sum(sim)
    assert np.all(np.isfinite(sim.numpy()))
    np.testing.assert_allclose(sim.numpy()[-1, :-1], 0.0, atol=1e-12)
    assert np.all(np.isfinite(tape.gradient(total, xt).numpy()))


def test_masks():
    labels = tf.constant([0, 1, 0, 2], tf.int32)
    pos = ops.positive_mask(labels).numpy()
    neg = ops.negative_mask(labels).numpy()
    np.testing.assert_array_equal(pos, [[0, 0, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(neg, [[0, 1, 0, 1], [1, 0, 1, 1], [0, 1, 0, 1], [1, 1, 1, 0]])
    np.testing.assert_array_equal(ops.pair_indices(ops.positive_mask(labels)).numpy(), [[0, 2], [2, 0]])


def test_masked_softmax_is_stable_and_zero_on_empty_rows():
    logits = tf.constant([[1000.0, 1.0, 999.0], [5.0, 6.0, 7.0]], tf.float32)
    mask = tf.constant([[True, False, True], [False, False, False]])
    out = ops.masked_softmax(logits, mask).numpy()
    e = np.exp([1.0, 0.0])
    np.testing.assert_allclose(out[0], [e[0] / e.sum(), 0.0, e[1] / e.sum()], rtol=1e-6)
    np.testing.assert_array_equal(out[1], 0.0)


def test_masked_reductions_and_safe_divide():
    v = tf.constant([[1.0, -2.0, 3.0], [4.0, 5.0, 6.0]])
    m = tf.constant([[True, True, False], [False, False, False]])
    np.testing.assert_allclose(ops.masked_max(v, m).numpy(), [1.0, 0.0])
    np.testing.assert_allclose(ops.masked_min(v, m).numpy(), [-2.0, 0.0])
    np.testing.assert_allclose(ops.masked_mean(v, m).numpy(), -0.5)
    np.testing.assert_allclose(ops.mean_of_positive(tf.constant([0.0, -1.0, 2.0, 4.0])).numpy(), 3.0)
    np.testing.assert_allclose(ops.mean_of_positive(tf.constant([0.0, -1.0])).numpy(), 0.0)
    x = tf.constant([1.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ops.safe_divide(x, tf.constant([0.0, 4.0]))
    np.testing.assert_allclose(y.numpy(), [0.0, 0.5])
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), [0.0, 0.25])


def test_validation_errors_name_the_problem():
    emb = tf.zeros((3, 2))
    with pytest.raises(TypeError, match="integer class ids"):
        ops.validate_inputs(tf.constant([0.0, 1.0, 1.0]), emb)
    with pytest.raises(ValueError, match=r"shape \[batch\]"):
        ops.validate_inputs(tf.zeros((3, 2), tf.int32), emb)
    with pytest.raises(ValueError, match="3 rows"):
        ops.validate_inputs(tf.constant([0, 1]), emb)
    with pytest.raises(ValueError, match=r"\[batch, dim\]"):
        ops.validate_inputs(tf.constant([0, 1, 1]), tf.zeros((3,)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        ops.validate_inputs(tf.constant([0, 1, 1]), tf.constant([[0.0], [np.nan], [1.0]]))
    labels, e = ops.validate_inputs(tf.constant([[0], [1], [1]], tf.int64), tf.zeros((3, 2), tf.float16))
    assert labels.shape == (3,) and labels.dtype == tf.int32 and e.dtype == tf.float32
