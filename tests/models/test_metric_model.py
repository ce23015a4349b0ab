"""MetricModel: losses' variables are tracked, trained by their own optimizer during fit, saved and restored;
losses with bind_step are bound to the optimizer's step counter."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml.distribute import mirrored_strategy
from tfdml.losses import MarginLoss, MetricLoss
from tfdml.models import MetricModel
from tfdml.optimizers import MultiOptimizer, learning_rate_multipliers


def _data(seed=0, classes=4, per_class=3):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), per_class).astype("int32")
    x = (rng.normal(size=(classes, 6))[labels] + 0.7 * rng.normal(size=(len(labels), 6))).astype("float32")
    return x, labels


def _embedder(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    embeddings = keras.layers.Dense(4, name="embedding")(inputs)
    # float32 normalisation, as mixed precision asks of a model's last layer (Keras' UnitNormalization in
    # float16 casts its 1 / epsilon = 1e12 bound to float16: NumPy's "overflow encountered in cast")
    return MetricModel(inputs, keras.layers.UnitNormalization(dtype="float32")(embeddings))


class _CountingLoss(MetricLoss):
    """A loss with its own trainable scale, trained by the model's optimizer, that records bind_step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scale = keras.Variable(1.0, name="loss_scale_test")
        self.step = None

    @property
    def trainable_variables(self):
        return [self.scale]

    def bind_step(self, step):
        self.step = step

    def compute(self, labels, embeddings):
        return self.scale * tf.reduce_mean(tf.square(embeddings))


def test_beta_is_tracked_once_and_routed_to_its_own_optimizer():
    model = _embedder()
    loss = MarginLoss(sampling="all", num_classes=4)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)  # recompiling does not duplicate it
    assert sum(v is loss.beta for v in model.trainable_variables) == 1
    assert isinstance(model.optimizer, MultiOptimizer)
    assert model.optimizer._optimizer_map(loss.beta) is loss.variable_optimizer
    assert isinstance(model.optimizer._optimizer_map(model.get_layer("embedding").kernel), keras.optimizers.Adam)
    assert model.get_compile_config()["optimizer"]["class_name"] == "Adam"  # what the user passed


@pytest.mark.slow
def test_fit_updates_beta_by_its_own_sgd_while_the_model_uses_adam(tmp_path):
    x, labels = _data()
    model = _embedder()
    loss = MarginLoss(sampling="all", num_classes=4, beta_learning_rate=0.1, nu=0.05)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    kernel = model.get_layer("embedding").kernel

    def beta_gradient():
        with tf.GradientTape() as tape:
            value = loss(labels, model(x))
        return tape.gradient(value, loss.beta).numpy()

    beta0, kernel0 = loss.beta.numpy().copy(), kernel.numpy().copy()
    grad0 = beta_gradient()
    assert np.abs(grad0).min() > 0
    model.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    beta1 = loss.beta.numpy().copy()
    np.testing.assert_allclose(beta1, beta0 - 0.1 * grad0, rtol=1e-6)  # SGD(0.1) first step
    # Adam's first step moves every kernel entry by ~lr = 1e-3 whatever its gradient: not SGD(0.1).
    np.testing.assert_allclose(np.abs(kernel.numpy() - kernel0), 1e-3, rtol=1e-2)
    grad1 = beta_gradient()
    model.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    velocity = 0.9 * -(0.1 * grad0) - 0.1 * grad1  # momentum 0.9
    np.testing.assert_allclose(loss.beta.numpy(), beta1 + velocity, rtol=1e-5)

    path = tmp_path / "margin.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    restored_loss = restored.loss
    assert isinstance(restored_loss, MarginLoss) and restored_loss.get_config() == loss.get_config()
    np.testing.assert_array_equal(restored_loss.beta.numpy(), loss.beta.numpy())
    for mine, theirs in zip(model.optimizer.variables, restored.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
    assert restored.optimizer._optimizer_map(restored_loss.beta) is restored_loss.variable_optimizer
    # Training goes on identically from the restored state (beta momentum included).
    model.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    restored.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(restored_loss.beta.numpy(), loss.beta.numpy(), rtol=1e-6)


@pytest.mark.slow
def test_margin_loss_decreases_under_fit_and_checkpoint_keeps_beta(tmp_path):
    x, labels = _data(1, classes=5, per_class=4)
    model = _embedder(1)
    loss = MarginLoss(sampling="distance_weighted")
    model.compile(optimizer=keras.optimizers.Adam(0.03), loss=loss)
    exact = MarginLoss(sampling="all", learn_beta=False)  # deterministic yardstick at the initial beta
    before = exact(labels, model(x)).numpy()
    history = model.fit(x, labels, batch_size=len(x), epochs=20, shuffle=False, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert exact(labels, model(x)).numpy() < 0.8 * before
    checkpoint = tf.train.Checkpoint(model=model)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    learned = loss.beta.numpy()
    assert learned != np.float32(1.2)
    loss.beta.assign(0.0)
    checkpoint.restore(path)
    assert loss.beta.numpy() == learned


def test_variables_without_their_own_optimizer_use_the_model_optimizer_and_bind_step():
    x, labels = _data()
    model = _embedder()
    loss = _CountingLoss()
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)
    assert not isinstance(model.optimizer, MultiOptimizer)
    assert loss.step is model.optimizer.iterations
    with tf.GradientTape() as tape:
        value = loss(labels, model(x))
    grad = tape.gradient(value, loss.scale).numpy()
    model.fit(x, labels, batch_size=len(x), epochs=1, verbose=0)
    np.testing.assert_allclose(loss.scale.numpy(), 1.0 - 0.5 * grad, rtol=1e-6)
    assert int(loss.step.numpy()) == 1


def test_learning_rate_multipliers_compose_with_the_loss_optimizer():
    x, labels = _data()
    model = _embedder()
    loss = MarginLoss(sampling="all")
    base = learning_rate_multipliers(keras.optimizers.SGD(0.1), {"embedding/bias": 0.5})
    model.compile(optimizer=base, loss=loss)
    routing = model.optimizer._optimizer_map
    assert routing(loss.beta) is loss.variable_optimizer
    assert routing(model.get_layer("embedding").bias) is base.optimizers[0]
    assert routing(model.get_layer("embedding").kernel) is base.default_optimizer
    beta0 = loss.beta.numpy()
    model.fit(x, labels, batch_size=len(x), epochs=1, verbose=0)
    assert loss.beta.numpy() != beta0


def test_mixed_precision_training_updates_beta():
    x, labels = _data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _embedder()
        loss = MarginLoss(sampling="all", num_classes=4)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, MultiOptimizer)
    history = model.fit(x, labels, batch_size=len(x), epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    beta = loss.beta.numpy()
    assert np.all(np.isfinite(beta)) and np.any(beta != np.float32(1.2))


def test_compile_without_loss_variables_keeps_the_optimizer():
    model = _embedder()
    optimizer = keras.optimizers.Adam(1e-3)
    model.compile(optimizer=optimizer, loss=MarginLoss(learn_beta=False, sampling="all"))
    assert model.optimizer is optimizer


@pytest.mark.slow
def test_mirrored_strategy_trains_beta_like_one_device():
    x, labels = _data(2)
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _embedder(2)
        loss = MarginLoss(sampling="all")
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    assert isinstance(loss.beta.value, tf.distribute.DistributedValues)  # mirrored, created in the scope
    with tf.GradientTape() as tape:
        value = loss(labels, model(x))
    grad = tape.gradient(value, loss.beta).numpy()
    model.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    # Each replica holds half of the batch; the loss sees the global batch, so beta moves as on one device.
    np.testing.assert_allclose(loss.beta.numpy(), 1.2 - 0.1 * grad, rtol=1e-5)


def test_recompiling_with_another_loss_drops_the_old_loss_variables():
    model = _embedder()
    first = MarginLoss(sampling="all")
    model.compile(optimizer="adam", loss=first)
    second = MarginLoss(sampling="all", num_classes=4)
    model.compile(optimizer="adam", loss=second)
    betas = [v for v in model.trainable_variables if "margin_beta" in v.path]
    assert len(betas) == 1 and betas[0] is second.beta


def test_fit_on_a_dataset_does_not_warn_that_keras_ignores_shuffle():
    """Keras' default `shuffle=True` cannot apply to a tf.data.Dataset and warns at every `fit`."""
    x, labels = _data()
    model = _embedder()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=MarginLoss())
    dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(len(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        history = model.fit(dataset, epochs=2, verbose=0).history
    assert len(history["loss"]) == 2
    with pytest.warns(UserWarning, match="shuffle=True"):  # asked for explicitly, Keras still says so
        model.fit(dataset, epochs=1, shuffle=True, verbose=0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["functional", "embedder", "multi_level"])
def test_fit_traces_the_train_step_once(kind):
    """The optimizer's variables exist before the first trace: a function that creates variables while it is
    traced is traced a second time, which doubles the wait before the first step."""
    from tfdml.models import Embedder, MultiLevelEmbedder

    keras.utils.set_random_seed(0)
    x, labels = _data()
    if kind == "functional":
        model = _embedder()
    else:
        x = np.random.default_rng(0).uniform(size=(len(labels), 16, 16, 1)).astype("float32")
        if kind == "embedder":
            model = Embedder("small_cnn", embedding_dim=4, input_shape=(16, 16, 1), widths=(4, 8))
        else:  # its L and M heads pool with CaffeAveragePooling2D, a layer without weights
            model = MultiLevelEmbedder(
                "small_cnn", embedding_dim=4, input_shape=(16, 16, 1), head_filters=4, head_units=8
            )
    model.compile(keras.optimizers.Adam(1e-3), loss=MarginLoss())
    traces = []
    step = model.train_step
    model.train_step = lambda data: traces.append(1) or step(data)  # Python runs only while it is traced
    model.fit(x, labels, batch_size=len(labels), epochs=2, verbose=0)
    assert len(traces) == 1


class _StopIfTraining(keras.callbacks.Callback):
    """Bounds a `fit` that should have been refused: it ends it after a few batches instead of never."""

    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches >= 3:
            self.model.stop_training = True


@pytest.mark.slow
def test_fit_on_an_endless_stream_without_steps_per_epoch_is_refused_at_once():
    """`class_balanced_dataset` never ends: without `steps_per_epoch` Keras would wait for the end of the first
    epoch forever, with no output. The model says what is missing before one batch is read, and trains with
    it."""
    from tfdml import data
    from tfdml.models import Embedder

    source = data.digits("train")
    stream = data.class_balanced_dataset(source, 3, 2, image_size=8, seed=0)
    assert int(stream.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    keras.utils.set_random_seed(0)
    model = Embedder("small_cnn", embedding_dim=4, input_shape=(8, 8, 1), widths=(4,))
    model.compile(optimizer="adam", loss=MarginLoss())
    guard = _StopIfTraining()
    with pytest.raises(ValueError, match=r"fit: the dataset never ends .* needs steps_per_epoch=N") as raised:
        model.fit(stream, epochs=1, verbose=0, callbacks=[guard])
    assert guard.batches == 0 and "tfdml.data.steps_per_epoch(source, classes_per_batch)" in str(raised.value)
    with pytest.raises(ValueError, match="steps_per_epoch"):  # a plain endless dataset too
        model.fit(stream.take(2).repeat(), epochs=1, verbose=0, callbacks=[guard])
    assert guard.batches == 0
    history = model.fit(stream, epochs=1, steps_per_epoch=2, verbose=0).history
    assert len(history["loss"]) == 1
