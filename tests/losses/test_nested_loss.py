"""NestedLoss (Matryoshka embeddings): each prefix's contribution is the wrapped loss on that normalised prefix
(values and gradients, against the wrapped loss called on sliced inputs normalised by TensorFlow's own
`tf.math.l2_normalize`), a finite-difference check of the wrapper, config round-trip, `model.fit`, the
cross-batch memory around it (equal to one memory per prefix fed the normalised prefixes), and the errors.
`tests/losses/test_backends.py` checks its value, gradient and `model.fit` on JAX and PyTorch too
(`tests/backend_neutral`)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml import losses
from tfdml.losses import CrossBatchMemory, NestedLoss
from tfdml.models import MetricModel

DIMS, WEIGHTS = (4, 8, 16), (0.5, 1.0, 2.0)


def _batch(seed=0, size=12, width=16, classes=3):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), size // classes).astype(np.int32)
    return labels, rng.normal(size=(size, width))


WRAPPED = {
    "contrastive": lambda: losses.ContrastiveLoss(pos_margin=0.1, neg_margin=0.9),
    "triplet": lambda: losses.TripletLoss(margin=0.3),
    "multi_similarity": lambda: losses.MultiSimilarityLoss(),
    "ranked_list": lambda: losses.RankedListLoss(),
    "supcon": lambda: losses.SupConLoss(),
}


def _value_and_grad(fn, x):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = fn(x)
    return float(value.numpy()), tape.gradient(value, x).numpy()


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_each_prefix_is_the_wrapped_loss_on_its_normalised_prefix(name):
    labels, x = _batch()
    nested = NestedLoss(WRAPPED[name](), DIMS, WEIGHTS, dtype="float64")
    inner = WRAPPED[name]()
    inner_64 = type(inner).from_config({**inner.get_config(), "dtype": "float64"})
    total_value, total_grad = _value_and_grad(lambda e: nested(labels, e), x)
    expected_value, expected_grad = 0.0, np.zeros_like(x)
    for m, (dim, weight) in enumerate(zip(DIMS, WEIGHTS)):
        value, grad = _value_and_grad(lambda e, m=m: nested.prefix_losses(labels, e)[m], x)
        ref_value, ref_grad = _value_and_grad(
            lambda e, d=dim: inner_64(labels, tf.math.l2_normalize(e[:, :d], axis=1)), x
        )
        np.testing.assert_allclose(value, ref_value, rtol=1e-10, err_msg=f"prefix {dim}")
        np.testing.assert_allclose(grad, ref_grad, atol=1e-10, err_msg=f"prefix {dim}")
        assert np.all(grad[:, dim:] == 0), "a prefix's loss has no gradient beyond its dims"
        expected_value += weight * ref_value
        expected_grad += weight * ref_grad
    assert expected_value > 0
    np.testing.assert_allclose(total_value, expected_value, rtol=1e-10)
    np.testing.assert_allclose(total_grad, expected_grad, atol=1e-10)


@pytest.mark.slow
def test_gradient_equals_finite_differences():
    labels, x = _batch(seed=1, size=6, width=6, classes=2)
    nested = NestedLoss(
        losses.ContrastiveLoss(pos_margin=0.05, neg_margin=1.2), (2, 4, 6), (1.0, 0.5, 2.0), dtype="float64"
    )
    _, grad = _value_and_grad(lambda e: nested(labels, e), x)
    step, numeric = 1e-6, np.zeros_like(x)
    for index in np.ndindex(*x.shape):
        up, down = x.copy(), x.copy()
        up[index] += step
        down[index] -= step
        numeric[index] = (float(nested(labels, up)) - float(nested(labels, down))) / (2 * step)
    assert np.abs(grad).max() > 1e-3
    np.testing.assert_allclose(grad, numeric, atol=1e-6)


def test_default_weights_are_uniform_and_the_full_width_may_be_a_prefix():
    labels, x = _batch(seed=2)
    loss = NestedLoss(losses.TripletLoss(), (8, 16), dtype="float64")
    assert loss.weights == (1.0, 1.0)
    inner = losses.TripletLoss(dtype="float64")
    expected = sum(float(inner(labels, tf.math.l2_normalize(x[:, :d], axis=1))) for d in (8, 16))
    np.testing.assert_allclose(float(loss(labels, x)), expected, rtol=1e-10)


def test_a_loss_on_raw_inner_products_sees_raw_prefixes():
    labels, x = _batch(seed=3, size=8, classes=4)
    raw = NestedLoss(losses.NPairsLoss(normalize=False), (4, 16), dtype="float64")
    assert not raw.normalizes_prefixes
    inner = losses.NPairsLoss(normalize=False, dtype="float64")
    expected = sum(float(inner(labels, x[:, :d])) for d in (4, 16))
    np.testing.assert_allclose(float(raw(labels, x)), expected, rtol=1e-10)
    assert NestedLoss(losses.NPairsLoss(), (4,)).normalizes_prefixes
    assert not NestedLoss(losses.TripletLoss(), (4,), normalize=False).normalizes_prefixes


def test_config_round_trip():
    loss = NestedLoss(losses.MultiSimilarityLoss(alpha=3.0), (8, 32), (2.0, 1.0), name="nested_ms")
    config = keras.saving.serialize_keras_object(loss)
    again = keras.saving.deserialize_keras_object(config)
    assert isinstance(again, NestedLoss) and isinstance(again.loss, losses.MultiSimilarityLoss)
    assert (again.dims, again.weights, again.name, again.loss.alpha) == ((8, 32), (2.0, 1.0), "nested_ms", 3.0)
    assert again.get_config() == loss.get_config()
    labels, x = _batch(seed=4, width=32)
    np.testing.assert_allclose(float(again(labels, x)), float(loss(labels, x)), rtol=1e-6)


def _separable(seed=0, classes=4, per_class=8, width=12):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), per_class).astype("int32")
    x = (rng.normal(size=(classes, width))[labels] + 0.8 * rng.normal(size=(len(labels), width))).astype("float32")
    return labels, x


@pytest.mark.slow
def test_fit_lowers_the_loss_of_every_prefix():
    keras.utils.set_random_seed(0)
    labels, x = _separable()
    inputs = keras.Input((12,))
    outputs = keras.layers.UnitNormalization()(
        keras.layers.Dense(16)(keras.layers.Dense(32, activation="relu")(inputs))
    )
    model = MetricModel(inputs, outputs)
    loss = NestedLoss(losses.ContrastiveLoss(), (4, 8, 16))
    before = [float(v) for v in loss.prefix_losses(labels, model(x))]
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss)
    history = model.fit(x, labels, batch_size=32, epochs=8, shuffle=False, verbose=0).history["loss"]
    after = [float(v) for v in loss.prefix_losses(labels, model(x))]
    assert np.all(np.isfinite(history)) and history[-1] < 0.7 * history[0]
    assert all(a < 0.8 * b for a, b in zip(after, before)), (before, after)


def test_cross_batch_memory_stores_full_vectors_and_each_prefix_slices_them():
    """CrossBatchMemory(NestedLoss) equals the weighted sum of one memory per prefix fed normalised prefixes."""
    dims, weights, memory = (4, 8), (1.0, 3.0), 24
    nested = CrossBatchMemory(
        NestedLoss(losses.ContrastiveLoss(), dims, weights), memory_size=memory, embedding_dim=8, dtype="float64"
    )
    per_prefix = [
        CrossBatchMemory(losses.ContrastiveLoss(), memory_size=memory, embedding_dim=d, dtype="float64") for d in dims
    ]
    for step in range(4):
        labels, x = _batch(seed=10 + step, size=12, width=8, classes=3)
        value, grad = _value_and_grad(lambda e, y=labels: nested(y, e), x)
        expected_value, expected_grad = 0.0, np.zeros_like(x)
        for dim, weight, loss in zip(dims, weights, per_prefix):
            v, g = _value_and_grad(lambda e, f=loss, y=labels, d=dim: f(y, tf.math.l2_normalize(e[:, :d], axis=1)), x)
            expected_value, expected_grad = expected_value + weight * v, expected_grad + weight * g
        np.testing.assert_allclose(value, expected_value, rtol=1e-10, err_msg=f"step {step}")
        np.testing.assert_allclose(grad, expected_grad, atol=1e-10, err_msg=f"step {step}")
    assert nested.memory_embeddings.shape == (memory, 8)
    assert int(nested.memory_count.numpy()) == 48


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: NestedLoss(losses.TripletLoss(), (16, 8)), "strictly increasing"),
        (lambda: NestedLoss(losses.TripletLoss(), (8, 8)), "strictly increasing"),
        (lambda: NestedLoss(losses.TripletLoss(), ()), "non-empty"),
        (lambda: NestedLoss(losses.TripletLoss(), (0, 8)), "positive integers"),
        (lambda: NestedLoss(losses.TripletLoss(), (4.5, 8)), "positive integers"),
        (lambda: NestedLoss(losses.TripletLoss(), (4, 8), (1.0,)), "1 weights for 2 dims"),
        (lambda: NestedLoss(losses.TripletLoss(), (4, 8), (1.0, 0.0)), "positive and finite"),
        (lambda: NestedLoss(losses.TripletLoss(), (4, 8), (1.0, float("nan"))), "positive and finite"),
        (lambda: NestedLoss(losses.TripletLoss(), (4,), normalize="yes"), "normalize"),
        (lambda: NestedLoss(losses.ProxyAnchorLoss(3, 8), (4, 8)), "proxies of one width"),
        (
            lambda: NestedLoss(CrossBatchMemory(losses.TripletLoss(), memory_size=8, embedding_dim=8), (4, 8)),
            r"CrossBatchMemory\(NestedLoss\(loss, dims\)",
        ),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_dim_above_the_embedding_width_is_refused():
    labels, x = _batch(width=8)
    with pytest.raises(ValueError, match=r"go up to 16 but the embeddings have width 8"):
        NestedLoss(losses.TripletLoss(), (4, 16))(labels, x)


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_degenerate_batches_give_finite_values_and_gradients(name):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(8, 16))
    x[:2, :4] = 0.0  # a zero 4-d prefix
    x[2] = x[3]  # duplicates
    cases = {
        "one class": (np.zeros(8, np.int32), x),
        "all classes distinct": (np.arange(8, dtype=np.int32), x),
        "zero embeddings": (np.repeat(np.arange(4), 2).astype(np.int32), np.zeros((8, 16))),
        "zero prefix, duplicates": (np.repeat(np.arange(4), 2).astype(np.int32), x),
    }
    loss = NestedLoss(WRAPPED[name](), DIMS, WEIGHTS, dtype="float64")
    for case, (labels, embeddings) in cases.items():
        value, grad = _value_and_grad(lambda e, y=labels: loss(y, e), embeddings)
        assert np.isfinite(value) and np.all(np.isfinite(grad)), f"{name}, {case}"
