"""Training recipes: 10x head learning rate (exact), weight decay, schedules, frozen BatchNorm."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml.config import OPTIMIZERS
from tfdml.losses import MarginLoss
from tfdml.models import Embedder, MultiLevelEmbedder
from tfdml.optimizers import OPTIMIZER_NAMES, MultiOptimizer, build_optimizer, build_schedule
from tfdml.recipes import freeze_batchnorm, make_optimizer, make_schedule

SHAPE = (16, 16, 1)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return MultiLevelEmbedder("small_cnn", embedding_dim=4, input_shape=SHAPE, head_filters=4, head_units=8)


def _backbone_and_head_kernels(model):
    return next(v for v in model.backbone_variables if v.shape.rank == 4), model.get_layer("head_H").projection.kernel


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_head_moves_exactly_ten_times_the_backbone_for_equal_gradients(model, momentum):
    optimizer = make_optimizer(
        {"name": "sgd", "learning_rate": 0.01, "momentum": momentum, "head_lr_multiplier": 10}, model
    )
    assert isinstance(optimizer, MultiOptimizer)
    backbone_var, head_var = _backbone_and_head_kernels(model)
    optimizer.build([backbone_var, head_var])
    start = (backbone_var.numpy().copy(), head_var.numpy().copy())
    for _ in range(4):  # equal (unit) gradients for both variables
        optimizer.apply([tf.ones_like(backbone_var), tf.ones_like(head_var)], [backbone_var, head_var])
    moved_backbone = backbone_var.numpy() - start[0]
    moved_head = head_var.numpy() - start[1]
    np.testing.assert_allclose(moved_backbone / moved_head.mean(), 0.1, rtol=1e-5)
    # SGD: after 4 unit-gradient steps each group moved lr * (4 steps' velocity sum)
    velocity_sum = sum(sum(momentum**j for j in range(i + 1)) for i in range(4))
    np.testing.assert_allclose(moved_head, -0.1 * velocity_sum, rtol=1e-5)
    np.testing.assert_allclose(moved_backbone, -0.01 * velocity_sum, rtol=1e-5)


def test_weight_decay_is_applied_per_group(model):
    optimizer = make_optimizer(
        {"name": "sgd", "learning_rate": 0.01, "momentum": 0.0, "weight_decay": 0.5, "head_lr_multiplier": 10}, model
    )
    backbone_var, head_var = _backbone_and_head_kernels(model)
    optimizer.build([backbone_var, head_var])
    before = (backbone_var.numpy().copy(), head_var.numpy().copy())
    optimizer.apply([tf.zeros_like(backbone_var), tf.zeros_like(head_var)], [backbone_var, head_var])
    # decoupled decay: w <- w - lr * wd * w with each group's learning rate
    np.testing.assert_allclose(backbone_var.numpy(), before[0] * (1 - 0.01 * 0.5), rtol=1e-6)
    np.testing.assert_allclose(head_var.numpy(), before[1] * (1 - 0.1 * 0.5), rtol=1e-6)


def test_optimizers_from_config():
    sgd = make_optimizer({"name": "sgd", "learning_rate": 1e-2, "momentum": 0.9, "weight_decay": 2e-5})
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.momentum == 0.9 and sgd.weight_decay == 2e-5
    adam = make_optimizer({"name": "adam", "learning_rate": 2e-4})
    assert isinstance(adam, keras.optimizers.Adam) and np.isclose(float(adam.learning_rate), 2e-4)
    adamw = make_optimizer({"name": "AdamW", "learning_rate": 1e-3, "weight_decay": 1e-4})
    assert isinstance(adamw, keras.optimizers.AdamW)
    with pytest.raises(ValueError, match="RAdam is not available in keras.optimizers"):
        make_optimizer({"name": "radam"})
    with pytest.raises(ValueError, match="optimizer.name: must be one of sgd, adam, adamw, lamb, rmsprop"):
        make_optimizer({"name": "adagrad2"})
    with pytest.raises(ValueError, match="needs a tfdml Embedder"):
        make_optimizer({"head_lr_multiplier": 10}, keras.Sequential([keras.layers.Dense(2)]))
    with pytest.raises(ValueError, match="needs total_steps"):
        make_optimizer({"schedule": "cosine"})


def test_schedules():
    cosine = make_schedule({"learning_rate": 0.1, "schedule": "cosine"}, total_steps=100)
    np.testing.assert_allclose([float(cosine(0)), float(cosine(50)), float(cosine(100))], [0.1, 0.05, 0.0], atol=1e-7)
    step = make_schedule(
        {"learning_rate": 2e-4, "schedule": "step", "boundaries": [0.5], "factor": 0.1}, total_steps=60
    )
    np.testing.assert_allclose([float(step(29)), float(step(30))], [2e-4, 2e-5], rtol=1e-6)
    assert make_schedule({"learning_rate": 0.3}) == 0.3
    with pytest.raises(ValueError, match="optimizer.schedule: must be one of cosine, step"):
        make_schedule({"learning_rate": 0.1, "schedule": "linear"}, total_steps=10)
    # the head group follows the schedule at 10x
    keras.utils.set_random_seed(0)
    small = Embedder("small_cnn", embedding_dim=2, input_shape=SHAPE)
    optimizer = make_optimizer(
        {
            "name": "sgd",
            "learning_rate": 0.1,
            "momentum": 0.0,
            "schedule": "step",
            "boundaries": [2],
            "factor": 0.5,
            "head_lr_multiplier": 10,
        },
        small,
        total_steps=4,
    )
    head_var = small.get_layer("head_H").projection.kernel
    optimizer.build(small.trainable_variables)
    moves = []
    for _ in range(4):
        before = head_var.numpy().copy()
        optimizer.apply([tf.ones_like(v) for v in small.trainable_variables], small.trainable_variables)
        moves.append(float((before - head_var.numpy()).mean()))
    np.testing.assert_allclose(moves, [1.0, 1.0, 0.5, 0.5], rtol=1e-5)


def test_frozen_batchnorm_with_margin_loss_and_head_multiplier(tmp_path):
    keras.utils.set_random_seed(3)
    model = Embedder("small_cnn", embedding_dim=4, input_shape=SHAPE, freeze_batchnorm=True)
    bn = model.backbone.get_layer("block1_bn")
    assert not bn.trainable
    before = {v.path: v.numpy().copy() for v in model.weights}
    model.compile(
        make_optimizer({"name": "adam", "learning_rate": 1e-2, "head_lr_multiplier": 10}, model),
        loss=MarginLoss(sampling="all"),
    )
    rng = np.random.RandomState(0)
    labels = np.repeat(np.arange(4), 4)
    images = rng.rand(16, *SHAPE).astype("float32")
    model.fit(images, labels, batch_size=16, epochs=2, verbose=0)
    for v in bn.weights:  # gamma, beta, moving mean and variance all unchanged
        np.testing.assert_array_equal(v.numpy(), before[v.path])
    conv = model.backbone.get_layer("block1_conv").kernel
    assert not np.array_equal(conv.numpy(), before[conv.path])
    path = str(tmp_path / "frozen.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert not restored.backbone.get_layer("block1_bn").trainable
    # recompiled from the saved compile config: 10x routing, margin loss (beta restored) and optimizer state
    assert isinstance(restored.optimizer, MultiOptimizer) and isinstance(restored.loss, MarginLoss)
    np.testing.assert_array_equal(restored.loss.beta.numpy(), model.loss.beta.numpy())
    assert int(restored.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy()) == 2
    np.testing.assert_array_equal(restored(images).numpy(), model(images).numpy())
    unfrozen = MultiLevelEmbedder("small_cnn", embedding_dim=4, input_shape=SHAPE)
    assert freeze_batchnorm(unfrozen.backbone) == 3


def test_make_embedder_from_config():
    from tfdml.recipes import make_embedder

    multi = make_embedder(
        {
            "type": "multilevel",
            "backbone": "small_cnn",
            "embedding_dim": 4,
            "levels": ["M", "H"],
            "level_weights": [1.0, 2.0],
            "head_filters": 4,
            "head_units": 8,
        },
        SHAPE,
    )
    assert isinstance(multi, MultiLevelEmbedder) and multi.levels == ("M", "H") and multi.output_dim == 8
    assert multi.level_weights == (1.0, 2.0) and multi.taps == ["block2_out", "block3_out"]
    single = make_embedder({"type": "single", "embedding_dim": 3, "num_classes": 5}, SHAPE)
    assert isinstance(single, Embedder) and single.num_classes == 5
    with pytest.raises(
        ValueError,
        match=r"unknown configuration key 'model.embeding_dim' \(did you mean "
        r"'embedding_dim'\?\)",
    ):
        make_embedder({"embeding_dim": 3}, SHAPE)
    with pytest.raises(ValueError, match="model.type: must be one of multilevel, single, got 'triple'"):
        make_embedder({"type": "triple"}, SHAPE)


def test_optimizer_builders_take_plain_values():
    """The configuration names exactly the optimizers `tfdml.optimizers` builds, and the builders refuse
    what they cannot build with the offending value named."""
    assert OPTIMIZERS == OPTIMIZER_NAMES
    sgd = build_optimizer("sgd", 0.05, momentum=0.5, weight_decay=1e-4)
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.momentum == 0.5 and np.isclose(float(sgd.learning_rate), 0.05)
    with pytest.raises(ValueError, match="Unknown optimizer 'adagrad2'; expected one of sgd, adam"):
        build_optimizer("adagrad2")
    with pytest.raises(ValueError, match="Unknown learning-rate schedule 'linear'"):
        build_schedule(0.1, "linear", total_steps=10)
    assert build_schedule(0.3) == 0.3
