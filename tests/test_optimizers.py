"""MultiOptimizer and learning_rate_multipliers: exact per-group learning rates, routing, serialisation,
save/load and checkpoints (inner optimizer state), and MirroredStrategy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml.distribute import mirrored_strategy
from tfdml.optimizers import MultiOptimizer, ScaledLearningRate, learning_rate_multipliers


@keras.saving.register_keras_serializable(package="tfdml_tests")
def is_kernel(variable):
    return variable.path.endswith("kernel")


def _two_branch_model():
    """out = backbone(x) + head(x), zero kernels: both kernels get exactly the same gradient."""
    inputs = keras.Input((3,))
    backbone = keras.layers.Dense(2, use_bias=False, kernel_initializer="zeros", name="backbone")(inputs)
    head = keras.layers.Dense(2, use_bias=False, kernel_initializer="zeros", name="head")(inputs)
    return keras.Model(inputs, keras.layers.Add()([backbone, head]))


def _data(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=(n, 2)).astype("float32")


def test_multiplier_moves_a_variable_exactly_one_tenth_as_far_under_fit():
    model = _two_branch_model()
    optimizer = learning_rate_multipliers(keras.optimizers.SGD(1.0), {"backbone": 0.1})
    model.compile(optimizer=optimizer, loss="mse")
    x, y = _data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    backbone = model.get_layer("backbone").kernel.numpy()
    head = model.get_layer("head").kernel.numpy()
    assert np.abs(head).min() > 0
    np.testing.assert_array_equal(backbone, np.float32(0.1) * head)  # exact, not approximate


def test_multiplier_is_exact_for_any_learning_rate_on_equal_gradients():
    with keras.name_scope("backbone"):
        slow = keras.Variable(np.zeros(4, "float32"), name="w")
    with keras.name_scope("head"):
        fast = keras.Variable(np.zeros(4, "float32"), name="w")
    optimizer = learning_rate_multipliers(keras.optimizers.SGD(0.01), {"backbone": 0.1})
    gradient = tf.constant([1.0, -2.0, 0.5, 3.0])
    optimizer.apply([gradient, gradient], [slow, fast])
    lr_fast = np.float32(0.01)
    lr_slow = np.float32(float(lr_fast) * 0.1)  # the clone scales the float32 base rate
    np.testing.assert_array_equal(fast.numpy(), -(lr_fast * gradient.numpy()))
    np.testing.assert_array_equal(slow.numpy(), -(lr_slow * gradient.numpy()))
    [inner_slow, inner_default] = optimizer.optimizers
    assert float(inner_slow.learning_rate) == lr_slow and float(inner_default.learning_rate) == lr_fast


def test_routing_by_name_regex_layer_variables_and_callable():
    inputs = keras.Input((3,))
    backbone = keras.Sequential(
        [keras.layers.Dense(4, name="conv1"), keras.layers.Dense(4, name="conv2")], name="backbone"
    )
    head = keras.layers.Dense(2, name="head")
    model = keras.Model(inputs, head(backbone(inputs)))
    sgd_a, sgd_b, sgd_c, sgd_d, default = (keras.optimizers.SGD(lr) for lr in (0.1, 0.2, 0.3, 0.4, 0.5))
    optimizer = MultiOptimizer(
        [
            (sgd_a, "backbone/conv1"),  # layer path prefix
            (sgd_b, [head.kernel]),  # explicit variables
            (sgd_c, is_kernel),  # callable: the remaining kernels
            (sgd_d, r".*bias"),
        ],  # regex
        default=default,
    )
    optimizer.build(model.trainable_variables)
    routed = {v.path: optimizer._optimizer_map(v) for v in model.trainable_variables}
    assert routed == {
        "backbone/conv1/kernel": sgd_a,
        "backbone/conv1/bias": sgd_a,
        "backbone/conv2/kernel": sgd_c,
        "backbone/conv2/bias": sgd_d,
        "head/kernel": sgd_b,
        "head/bias": sgd_d,
    }
    layer_sgd = keras.optimizers.SGD(0.1)
    by_layer = MultiOptimizer([(layer_sgd, backbone)], default=keras.optimizers.SGD(0.2))
    assert {v.path for v in backbone.trainable_variables} == {
        v.path for v in model.trainable_variables if by_layer._optimizer_map(v) is layer_sgd
    }
    without_default = MultiOptimizer([(keras.optimizers.SGD(0.1), backbone)])
    with pytest.raises(ValueError, match="'head/kernel' matches no selector"):
        without_default.build(model.trainable_variables)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError, match="selector must be"):
        MultiOptimizer([(keras.optimizers.SGD(), 3)])
    with pytest.raises(ValueError, match=r"\(optimizer, selector\) pair"):
        MultiOptimizer([keras.optimizers.SGD()])
    with pytest.raises(ValueError, match="at least one"):
        MultiOptimizer([])
    inner = MultiOptimizer([], default=keras.optimizers.SGD())
    with pytest.raises(ValueError, match="cannot be a MultiOptimizer"):
        MultiOptimizer([(inner, "x")])
    with pytest.raises(ValueError, match="must be > 0"):
        learning_rate_multipliers(keras.optimizers.SGD(), {"x": 0.0})
    with pytest.raises(ValueError, match="plain optimizer"):
        learning_rate_multipliers(inner, {"x": 0.1})


def test_config_round_trip_keeps_routes_and_inner_configs():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    optimizer = learning_rate_multipliers(
        keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True), {"backbone": 0.1, is_kernel: 2.0}
    )
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(clone) is MultiOptimizer and clone.get_config() == optimizer.get_config()
    slow = clone.optimizers[0]
    assert isinstance(slow._learning_rate, ScaledLearningRate)
    assert slow.momentum == 0.9 and slow.nesterov
    np.testing.assert_allclose(float(slow._learning_rate(10)), 0.1 * 0.5 * 0.1, rtol=1e-6)
    with keras.name_scope("x"):
        variable = keras.Variable(np.zeros(2, "float32"), name="kernel")
    assert clone._optimizer_map(variable) is clone.optimizers[1]  # the callable survived serialisation


def _compiled_model(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, name="backbone")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))
    optimizer = MultiOptimizer(
        [(keras.optimizers.SGD(0.05, momentum=0.9), "backbone")], default=keras.optimizers.Adam(0.01)
    )
    model.compile(optimizer=optimizer, loss="mse")
    return model


@pytest.mark.slow
def test_save_load_restores_inner_state_and_training_continues_identically(tmp_path):
    x, y = _data(1, n=16)
    model = _compiled_model()
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    path = tmp_path / "multi.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert type(restored.optimizer) is MultiOptimizer
    for mine, theirs in zip(model.optimizer.variables, restored.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
    assert int(restored.optimizer.optimizers[0].iterations.numpy()) == 4  # momentum state came back
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    restored.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for mine, theirs in zip(model.weights, restored.weights):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_checkpoint_restores_inner_optimizer_state(tmp_path):
    x, y = _data(2, n=8)
    model = _compiled_model()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    saved = [np.asarray(v).copy() for v in model.optimizer.variables]
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(saved, model.optimizer.variables))
    checkpoint.restore(path).assert_consumed()
    for expected, variable in zip(saved, model.optimizer.variables):
        np.testing.assert_array_equal(expected, np.asarray(variable))


@pytest.mark.slow
def test_mirrored_strategy_matches_single_device():
    x, y = _data(3, n=16)
    single = _compiled_model()
    single.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mirrored = _compiled_model()
    mirrored.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for mine, theirs in zip(single.weights, mirrored.weights):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    assert int(mirrored.optimizer.iterations.numpy()) == 4


def test_with_routes_prepends_routes_and_keeps_the_default():
    base = learning_rate_multipliers(keras.optimizers.SGD(0.1), {"backbone": 0.1})
    extra = keras.optimizers.SGD(0.5)
    combined = base.with_routes([(extra, "backbone/special")])
    with keras.name_scope("backbone"):
        special = keras.Variable(np.zeros(1, "float32"), name="special")
        other = keras.Variable(np.zeros(1, "float32"), name="other")
    assert combined._optimizer_map(special) is extra
    assert combined._optimizer_map(other) is base.optimizers[0]
    assert combined.default_optimizer is base.default_optimizer
