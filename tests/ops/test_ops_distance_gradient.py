"""`tfdml.ops.pairwise_distance`, the distance of every loss: values against NumPy, its hand-written
one-matmul gradient against finite differences and against autodiff of the plain formula."""

import numpy as np
import pytest
import tensorflow as tf

from tests.references import numpy_losses as ref
from tfdml.ops import pairwise_distance, pairwise_squared_distance, safe_sqrt


def _batch(seed, rows=7, dim=3):
    x = np.random.default_rng(seed).normal(size=(rows, dim))
    x[3] = x[1]  # a duplicate row: distance 0 off the diagonal
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_match_pairwise_distance_and_numpy(seed):
    x = _batch(seed)
    gallery = np.random.default_rng(seed + 10).normal(size=(4, 3))
    np.testing.assert_array_equal(pairwise_distance(x).numpy(), safe_sqrt(pairwise_squared_distance(x)).numpy())
    np.testing.assert_allclose(pairwise_distance(x).numpy(), ref.distance_matrix(x), atol=1e-7)
    np.testing.assert_allclose(pairwise_distance(x, gallery).numpy(), ref.distance_matrix(x, gallery), atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1])
def test_gradients_match_finite_differences(seed):
    rng = np.random.default_rng(seed + 20)
    x = rng.normal(size=(6, 3))
    gallery = rng.normal(size=(5, 3))
    weights = rng.normal(size=(6, 6))
    cross_weights = rng.normal(size=(6, 5))

    x_t, g_t = tf.constant(x), tf.constant(gallery)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x_t, g_t])
        symmetric = tf.reduce_sum(weights * pairwise_distance(x_t))
        cross = tf.reduce_sum(cross_weights * pairwise_distance(x_t, g_t))
        held = tf.reduce_sum(weights * pairwise_distance(x_t, tf.stop_gradient(x_t)))
    np.testing.assert_allclose(
        tape.gradient(symmetric, x_t).numpy(),
        ref.numerical_gradient(lambda e: np.sum(weights * ref.distance_matrix(e)), x),
        atol=1e-6,
    )
    np.testing.assert_allclose(
        tape.gradient(cross, x_t).numpy(),
        ref.numerical_gradient(lambda e: np.sum(cross_weights * ref.distance_matrix(e, gallery)), x),
        atol=1e-6,
    )
    np.testing.assert_allclose(
        tape.gradient(cross, g_t).numpy(),
        ref.numerical_gradient(lambda g: np.sum(cross_weights * ref.distance_matrix(x, g)), gallery),
        atol=1e-6,
    )
    np.testing.assert_allclose(
        tape.gradient(held, x_t).numpy(),
        ref.numerical_gradient(lambda e: np.sum(weights * ref.distance_matrix(e, x)), x),
        atol=1e-6,
    )


def test_gradient_equals_autodiff_and_is_zero_at_zero_distance():
    x = tf.constant(np.concatenate([_batch(3), np.zeros((2, 3))]))
    weights = tf.constant(np.random.default_rng(4).normal(size=(9, 9)))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        fast = tf.reduce_sum(weights * pairwise_distance(x))
        plain = tf.reduce_sum(weights * safe_sqrt(pairwise_squared_distance(x)))
    fast_grad = tape.gradient(fast, x).numpy()
    assert np.all(np.isfinite(fast_grad))
    np.testing.assert_allclose(fast_grad, tape.gradient(plain, x).numpy(), atol=1e-12)
    zeros = tf.zeros((3, 4))
    with tf.GradientTape() as tape:
        tape.watch(zeros)
        value = tf.reduce_sum(pairwise_distance(zeros))
    np.testing.assert_array_equal(tape.gradient(value, zeros).numpy(), np.zeros((3, 4)))
