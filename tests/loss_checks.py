"""Checks shared by the loss tests (values, gradients, degenerate batches, training, saving). The NumPy
references they compare against live in `tests/references/`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.references import numpy_losses as ref

# Degenerate batches every loss must survive with a finite value and finite gradients.
DEGENERATE_BATCHES = {
    "one_class": (np.zeros(6, np.int32), np.random.default_rng(1).normal(size=(6, 4))),
    "all_distinct": (np.arange(6, dtype=np.int32), np.random.default_rng(2).normal(size=(6, 4))),
    "duplicates": (
        np.array([0, 0, 1, 1, 2, 2], np.int32),
        np.repeat(np.random.default_rng(3).normal(size=(3, 4)), 2, axis=0),
    ),
    "all_identical": (np.array([0, 0, 1, 1, 2, 2], np.int32), np.ones((6, 4))),
    "all_zero": (np.array([0, 0, 1, 1, 2, 2], np.int32), np.zeros((6, 4))),
    "single_sample": (np.array([3], np.int32), np.ones((1, 4))),
}


def random_batch(seed, batch_size, num_classes, dim=5, scale=0.6):
    """Labels with unequal class counts (at least one class with a pair) and random embeddings."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=batch_size)
    labels[1] = labels[0]
    embeddings = rng.normal(size=(batch_size, dim)) * scale
    return labels.astype(np.int32), embeddings


def value_and_gradient(loss_fn, labels, embeddings):
    """Loss value and d loss / d embeddings, computed eagerly."""
    embeddings = tf.convert_to_tensor(embeddings)
    with tf.GradientTape() as tape:
        tape.watch(embeddings)
        value = loss_fn(labels, embeddings)
    return value, tape.gradient(value, embeddings)


def assert_finite(loss_fn, labels, embeddings):
    value, grad = value_and_gradient(loss_fn, labels, embeddings)
    assert np.isfinite(value.numpy()), f"loss is {value.numpy()}"
    assert grad is not None
    assert np.all(np.isfinite(grad.numpy())), "gradient has NaN/Inf"
    return value, grad


def assert_gradient_matches(loss_fn, reference_fn, labels, embeddings, atol=1e-6):
    """Analytic gradient of the TF loss vs. central finite differences of a NumPy reference."""
    _, grad = value_and_gradient(loss_fn, labels, embeddings)
    expected = ref.numerical_gradient(reference_fn, embeddings)
    np.testing.assert_allclose(grad.numpy(), expected, atol=atol, rtol=1e-5)


def assert_bad_inputs_rejected(loss):
    """The base class validation errors, with messages that name the problem."""
    good_x = np.random.default_rng(0).normal(size=(4, 3))

    with pytest.raises(ValueError, match=r"labels must have shape \[batch\]"):
        loss(np.zeros((4, 2), np.int32), good_x)
    with pytest.raises(ValueError, match="labels has 3 entries but embeddings has 4 rows"):
        loss(np.zeros(3, np.int32), good_x)
    with pytest.raises(TypeError, match="labels must be integer class ids, got dtype float32"):
        loss(np.zeros(4, np.float32), good_x)
    with pytest.raises(ValueError, match=r"embeddings must have shape \[batch, dim\]"):
        loss(np.zeros(4, np.int32), np.zeros(4))
    nan_x = good_x.copy()
    nan_x[1, 2] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="embeddings contain NaN or Inf"):
        loss(np.array([0, 0, 1, 1], np.int32), nan_x)
    with pytest.raises(ValueError, match="does not accept sample_weight"):
        loss(np.array([0, 0, 1, 1], np.int32), good_x, sample_weight=np.ones(4))


def assert_jit_matches_eager(loss, labels, embeddings, rtol=1e-6):
    @tf.function(jit_compile=True)
    def compiled(labels, embeddings):
        return value_and_gradient(loss, labels, embeddings)

    embeddings = tf.convert_to_tensor(embeddings)
    value, grad = value_and_gradient(loss, labels, embeddings)
    jit_value, jit_grad = compiled(tf.convert_to_tensor(labels), embeddings)
    np.testing.assert_allclose(jit_value.numpy(), value.numpy(), rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(jit_grad.numpy(), grad.numpy(), rtol=rtol, atol=1e-9)


def assert_config_roundtrip(loss):
    config = loss.get_config()
    clone = type(loss).from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert type(restored) is type(loss)
    assert restored.get_config() == config
    return restored


def clustered_data(num_classes=4, per_class=8, dim=6, seed=0):
    """Float32 points around well separated class centres; labels int32."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dim)) * 2.0
    labels = np.repeat(np.arange(num_classes), per_class).astype(np.int32)
    points = centres[labels] + rng.normal(size=(labels.size, dim))
    return points.astype(np.float32), labels


def tiny_embedder(input_dim=6, embedding_dim=4, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((input_dim,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    outputs = keras.layers.UnitNormalization(axis=-1)(keras.layers.Dense(embedding_dim)(hidden))
    return keras.Model(inputs, outputs)


def assert_fit_lowers_loss(loss, epochs=15, callbacks=None, measure=None):
    """Full-batch training of a tiny embedder on clustered data lowers the loss (`measure`, default `loss`)."""
    measure = measure or loss
    x, y = clustered_data()
    model = tiny_embedder()
    before = float(measure(y, model(x)))
    # XLA is covered by assert_jit_matches_eager; skipping it here saves compile time.
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss, jit_compile=False)
    model.optimizer.build(model.trainable_variables)  # before fit: its step is then traced once, not twice
    model.fit(x, y, batch_size=len(y), epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    after = float(measure(y, model(x)))
    assert np.isfinite(after)
    assert after < 0.8 * before, (before, after)


def assert_saving_roundtrip(loss, tmp_path):
    """`model.save` (.keras) + `keras.models.load_model` keeps the compiled loss, its config and outputs."""
    x, y = clustered_data()
    model = tiny_embedder()
    model.compile(optimizer="sgd", loss=loss)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    restored_loss = loaded.loss
    assert type(restored_loss) is type(loss)
    assert restored_loss.get_config() == loss.get_config()
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(float(restored_loss(y, loaded(x))), float(loss(y, model(x))), rtol=1e-6)
    return loaded


def assert_float16_ok(loss, value_dtype=tf.float32):
    """float16 embeddings (computed in float32 inside) and a `mixed_float16` model: finite loss/gradients.
    The value comes back in `value_dtype` (float16 for the tensorflow-addons drop-ins, as tfa)."""
    x, y = clustered_data()
    value, grad = value_and_gradient(loss, y, tf.constant(x[:, :4], tf.float16))
    assert value.dtype == value_dtype and np.isfinite(value.numpy())
    assert np.all(np.isfinite(grad.numpy()))

    inputs = keras.Input((x.shape[1],))
    hidden = keras.layers.Dense(16, activation="tanh", dtype="mixed_float16")(inputs)
    embedded = keras.layers.Dense(4, dtype="mixed_float16")(hidden)
    outputs = keras.layers.UnitNormalization(axis=-1, dtype="mixed_float16")(embedded)
    model = keras.Model(inputs, outputs)
    with tf.GradientTape() as tape:
        embeddings = model(x)
        value = loss(y, embeddings)
    assert embeddings.dtype == tf.float16
    grads = tape.gradient(value, model.trainable_variables)
    assert np.isfinite(value.numpy())
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)


def largest_tensor_in_graph(fn, batch_size, dim=8):
    """Largest number of elements of any op output in `fn`'s graph, loop bodies and gradient included. A
    dimension the graph leaves open (a dynamic shape: tf.where, a boolean mask, a loop-carried tensor) counts
    as `batch_size`, the most any axis indexed by samples can hold, so that a `[B, B, B]` tensor built with
    dynamic shapes counts B^3 instead of escaping the scan; an output of unknown rank fails the scan."""
    spec = (tf.TensorSpec([batch_size], tf.int32), tf.TensorSpec([batch_size, dim], tf.float32))

    @tf.function(input_signature=spec)
    def value_and_grad(labels, embeddings):
        return value_and_gradient(fn, labels, embeddings)

    graph = value_and_grad.get_concrete_function().graph
    graphs, largest = [graph], 0
    seen = set()
    while graphs:
        current = graphs.pop()
        for op in current.get_operations():
            for output in op.outputs:
                if output.dtype == tf.resource or output.dtype == tf.variant:
                    continue  # handles (variables, tensor lists): no elements of their own
                if output.shape.rank is None and op.type == "Placeholder":
                    continue  # a function body's input: the tensor it receives is counted where it is made
                assert output.shape.rank is not None, f"{op.name}: an output of unknown rank cannot be bounded"
                largest = max(largest, int(np.prod([batch_size if d is None else d for d in output.shape.as_list()])))
        for function in getattr(current, "_functions", {}).values():
            inner = getattr(function, "graph", None)
            if inner is not None and id(inner) not in seen:
                seen.add(id(inner))
                graphs.append(inner)
    return largest, len(seen)
