"""Group Loss: values vs NumPy and the shared reference data, gradients vs finite differences, degenerate
batches and temperatures, errors, XLA, config, and end-to-end training through `compile`/`fit`."""

import hypothesis.extra.numpy as hnp
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from tests import loss_checks as checks
from tests.references import numpy_margin_group as ref
from tests.references import shared_reference_cases
from tests.references.numpy_losses import numerical_gradient
from tfdml.losses import GroupLoss, group_loss
from tfdml.losses.group import anchor_mask


def _batch(seed, batch=None, dim=5, classes=4):
    rng = np.random.default_rng(seed)
    batch = batch or int(rng.integers(5, 14))
    labels = rng.integers(0, classes, size=batch).astype(np.int32)
    return labels, rng.normal(size=(batch, dim)), rng.normal(size=(batch, classes)) * 2


def _reference_cases():
    return shared_reference_cases("group_loss")


@pytest.mark.parametrize("case,expected", list(_reference_cases()))
def test_matches_shared_reference_data(case, expected):
    labels = np.array(case["labels"], dtype=np.int32)
    f, z = np.array(case["embeddings"]), np.array(case["logits"])
    value = group_loss(tf.constant(labels), f, z, **expected["params"])
    np.testing.assert_allclose(value.numpy(), expected["value"], rtol=1e-9)
    # Same through the Keras loss on the concatenated model output.
    loss = GroupLoss(num_classes=z.shape[1], **expected["params"])
    np.testing.assert_allclose(loss(labels, np.concatenate([f, z], axis=1)).numpy(), expected["value"], rtol=1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_matches_numpy(seed):
    labels, f, z = _batch(seed)
    rng = np.random.default_rng(50 + seed)
    params = dict(
        temperature=float(rng.choice([0.5, 1.0, 24.0])),
        num_iterations=int(rng.integers(0, 4)),
        num_anchors=int(rng.integers(0, 4)),
        ce_weight=float(rng.uniform(0, 2)),
        zero_diagonal=bool(seed % 2),
    )
    value = group_loss(tf.constant(labels), f, z, **params).numpy()
    np.testing.assert_allclose(value, ref.group_loss(labels, f, z, **params), rtol=1e-6)


def test_anchors_are_the_first_samples_of_each_class():
    labels = tf.constant([3, 1, 3, 3, 1, 0, 3], dtype=tf.int32)
    assert anchor_mask(labels, 2).numpy().tolist() == [True, True, True, False, True, True, False]
    assert anchor_mask(labels, 0).numpy().tolist() == [False] * 7


@pytest.mark.slow
@pytest.mark.parametrize("zero_diagonal", [False, True])
def test_gradients_match_finite_differences(zero_diagonal):
    labels, f, z = _batch(3, batch=8, dim=4, classes=3)
    params = dict(temperature=2.0, num_iterations=2, num_anchors=1, zero_diagonal=zero_diagonal)
    graph_loss = tf.function(lambda x, logits: group_loss(tf.constant(labels), x, logits, **params))
    ft, zt = tf.constant(f), tf.constant(z)
    with tf.GradientTape() as tape:
        tape.watch([ft, zt])
        value = group_loss(tf.constant(labels), ft, zt, **params)
    grad_f, grad_z = tape.gradient(value, [ft, zt])
    num_f = numerical_gradient(lambda x: float(graph_loss(tf.constant(x), zt).numpy()), f)
    num_z = numerical_gradient(lambda x: float(graph_loss(ft, tf.constant(x)).numpy()), z)
    np.testing.assert_allclose(grad_f.numpy(), num_f, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad_z.numpy(), num_z, rtol=1e-5, atol=1e-7)
    assert np.abs(grad_f.numpy()).max() > 0  # gradients do reach the embeddings through W


@pytest.mark.parametrize("zero_diagonal", [False, True])
@pytest.mark.parametrize("case", sorted(checks.DEGENERATE_BATCHES) + ["t_small", "t_large", "float16"])
def test_degenerate_inputs_are_finite(case, zero_diagonal):
    labels, f = checks.DEGENERATE_BATCHES.get(case, checks.DEGENERATE_BATCHES["duplicates"])
    z = np.random.default_rng(0).normal(size=(len(labels), 6)) * 2
    temperature = {"t_small": 1e-3, "t_large": 1e3}.get(case, 1.0)
    dtype = tf.float16 if case == "float16" else tf.float64
    y_pred = tf.constant(np.concatenate([f, z * 10], axis=1), dtype=dtype)
    loss = GroupLoss(6, temperature=temperature, num_iterations=3, num_anchors=1, zero_diagonal=zero_diagonal)
    with tf.GradientTape() as tape:
        tape.watch(y_pred)
        value = loss(labels, y_pred)
    grad = tape.gradient(value, y_pred).numpy()
    assert np.isfinite(value.numpy()) and value.numpy() >= 0
    assert np.all(np.isfinite(grad))
    if case != "float16":
        expected = ref.group_loss(labels, f, z * 10, temperature, 3, 1, 1.0, zero_diagonal)
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6)


@given(
    labels=hnp.arrays(np.int32, st.integers(1, 10), elements=st.integers(0, 3)),
    data=st.data(),
    temperature=st.sampled_from([1e-3, 1.0, 30.0, 1e3]),
    iterations=st.integers(0, 3),
)
def test_fuzz_finite_with_finite_gradients(labels, data, temperature, iterations):
    y_pred = data.draw(hnp.arrays(np.float64, (len(labels), 7), elements=st.floats(-30, 30, width=32)))
    y_pred = tf.constant(y_pred)
    loss = GroupLoss(4, temperature=temperature, num_iterations=iterations)
    with tf.GradientTape() as tape:
        tape.watch(y_pred)
        value = loss(labels, y_pred)
    assert np.isfinite(value.numpy()) and value.numpy() >= 0
    assert np.all(np.isfinite(tape.gradient(value, y_pred).numpy()))


def test_bad_inputs_raise_clear_errors():
    labels = np.array([0, 1, 1, 2])
    with pytest.raises(ValueError, match="last num_classes=4 columns are the logits"):
        GroupLoss(4)(labels, np.ones((4, 4)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be < num_classes=3"):
        GroupLoss(3)(np.array([0, 1, 3, 2]), np.random.default_rng(0).normal(size=(4, 6)))
    with pytest.raises(ValueError, match=r"GroupLoss: temperature must be in \(0, 10000\], got 0.0"):
        GroupLoss(3, temperature=0.0)
    with pytest.raises(ValueError, match=r"GroupLoss: num_classes must be in \[2, 1e\+09\], got 1"):
        GroupLoss(1)
    with pytest.raises(ValueError, match="num_iterations"):
        group_loss(tf.constant(labels), np.ones((4, 2)), np.ones((4, 3)), 1.0, num_iterations=-1)
    with pytest.raises(TypeError, match="integer class ids"):
        GroupLoss(3)(labels.astype(np.float32), np.ones((4, 6)))
    with pytest.raises(ValueError, match="must match"):
        GroupLoss(3)(labels[:3], np.ones((4, 6)))


def test_group_loss_function_validates_its_inputs():
    """The public function checks its input as every tfdml loss does (it used to compute on anything)."""
    labels, f, z = np.array([0, 1, 1, 2]), np.ones((4, 2)), np.ones((4, 3))
    with pytest.raises(TypeError, match="integer class ids"):
        group_loss(labels.astype(np.float32), f, z, 1.0)
    with pytest.raises(ValueError, match="labels has 3 entries but embeddings has 4 rows"):
        group_loss(labels[:3], f, z[:3], 1.0)
    with pytest.raises(ValueError, match="labels has 4 entries but logits has 3 rows"):
        group_loss(labels, f, z[:3], 1.0)
    with pytest.raises(ValueError, match="logits must have shape \\[batch, dim\\]"):
        group_loss(labels, f, np.ones(4), 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="logits contain NaN"):
        group_loss(labels, f, np.full((4, 3), np.nan), 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="embeddings contain NaN"):
        group_loss(labels, np.full((4, 2), np.inf), z, 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be < the number of logits"):
        group_loss(np.array([0, 1, 3, 2]), f, z, 1.0)


def test_jit_compile_gives_the_same_values():
    labels, f, z = _batch(4, batch=9, classes=4)
    loss = GroupLoss(4, temperature=3.0, num_iterations=2)
    y_pred = tf.constant(np.concatenate([f, z], axis=1))
    compiled = tf.function(lambda y, p: loss(y, p), jit_compile=True)(tf.constant(labels), y_pred)
    np.testing.assert_allclose(compiled.numpy(), loss(labels, y_pred).numpy(), rtol=1e-9)


def test_config_round_trips():
    loss = GroupLoss(12, temperature=79.0, num_iterations=2, num_anchors=3, ce_weight=0.5, zero_diagonal=True, name="g")
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert type(clone) is GroupLoss and clone.get_config() == loss.get_config()


@pytest.mark.slow
def test_trains_through_fit_on_concatenated_output_and_saves(tmp_path):
    from tfdml.models import MetricModel

    rng = np.random.default_rng(0)
    num_classes, per_class = 4, 6
    centres = rng.normal(size=(num_classes, 10))
    labels = np.repeat(np.arange(num_classes), per_class).astype(np.int32)
    x = (centres[labels] + 0.8 * rng.normal(size=(len(labels), 10))).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((10,))
    embeddings = keras.layers.Dense(8, name="embedding")(inputs)
    logits = keras.layers.Dense(num_classes, name="logits")(embeddings)
    model = MetricModel(inputs, keras.layers.Concatenate()([embeddings, logits]))
    loss = GroupLoss(num_classes, temperature=2.0)
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss=loss)
    history = model.fit(x, labels, batch_size=len(x), epochs=15, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.6 * losses[0]
    path = tmp_path / "group.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert restored.loss.get_config() == loss.get_config()
    np.testing.assert_allclose(
        restored.evaluate(x, labels, batch_size=len(x), verbose=0),
        model.evaluate(x, labels, batch_size=len(x), verbose=0),
        rtol=1e-6,
    )


def test_float32_matches_float64_when_the_plain_product_would_underflow():
    # Sharp priors against neighbours of other classes: x * (W x) underflows to 0/0 in float32 unless the
    # update is done in log space. The float32 value must agree with float64, gradients finite.
    labels, f, z = _batch(0, batch=6, dim=4, classes=6)
    args = dict(temperature=1.0, num_iterations=3, num_anchors=1, zero_diagonal=True)
    values, grads = [], []
    for dtype in (tf.float64, tf.float32):
        ft, zt = tf.constant(f, dtype), tf.constant(z * 10, dtype)
        with tf.GradientTape() as tape:
            tape.watch([ft, zt])
            value = group_loss(tf.constant(labels), ft, zt, **args)
        values.append(value.numpy())
        grads.append([g.numpy() for g in tape.gradient(value, [ft, zt])])
    np.testing.assert_allclose(values[1], values[0], rtol=1e-5)
    np.testing.assert_allclose(values[0], ref.group_loss(labels, f, z * 10, **args), rtol=1e-6)
    for g32, g64 in zip(grads[1], grads[0]):
        assert np.all(np.isfinite(g32))
        np.testing.assert_allclose(g32, g64, rtol=1e-3, atol=1e-4)
