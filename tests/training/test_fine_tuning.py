"""Fine-tuning controls: freezing the backbone, its first stages or its batch norm; heads trained on features
computed once (`tfdml.training.fit_heads`), equal to the embedder they train; the epoch time estimate; and
`tfdml train --image-dir`'s pretrained defaults."""

import re

import keras
import numpy as np
import pytest

import tfdml
from tfdml import cli
from tfdml.callbacks import EpochTimeEstimate
from tfdml.config import ConfigError, load_config

SIZE = 32  # EfficientNet-Lite runs at any size; small images keep the tests fast


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TFDML_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tfdml-cache"))


def _pixels(n, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (n, SIZE, SIZE, 3)).astype(np.float32)


def _lite(weights=None, **kwargs):  # freezing does not depend on the weights: none loaded, faster
    return tfdml.models.Embedder(
        "efficientnet_lite0", embedding_dim=8, input_shape=(SIZE, SIZE, 3), weights=weights, **kwargs
    )


@pytest.mark.slow
def test_frozen_stages_leave_exactly_those_layers_untrained():
    model = _lite(frozen_stages=3)
    layers = model.backbone.layers
    end = [layer.name for layer in layers].index("block3b_out")
    assert all(not layer.trainable for layer in layers[: end + 1])
    assert all(layer.trainable for layer in layers[end + 1 :])
    before = [v.numpy().copy() for v in model.backbone.weights]
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="multi_similarity")
    model.fit(_pixels(16), np.repeat(np.arange(4), 4), batch_size=16, epochs=1, verbose=0)
    changed = {v.path.split("/")[0] for v, b in zip(model.backbone.weights, before) if not np.array_equal(v.numpy(), b)}
    frozen_layers = {layer.name for layer in layers[: end + 1]}
    assert changed and not changed & frozen_layers  # later stages trained, the frozen ones (BN statistics too) not
    assert "block4a_expand_conv" in changed
    with pytest.raises(ValueError, match="stages 1-7; got frozen_stages=8"):
        _lite(frozen_stages=8)
    with pytest.raises(ValueError, match="knows the stages of EfficientNet-Lite and the small CNN, not of"):
        tfdml.models.Embedder("mobilenetv3small", weights=None, input_shape=(SIZE, SIZE, 3), frozen_stages=2)


@pytest.mark.slow
def test_frozen_backbone_trains_only_the_head_and_round_trips(tmp_path):
    model = _lite(freeze_backbone=True)
    assert [v.path for v in model.trainable_variables] == [v.path for v in model.head_variables]
    path = str(tmp_path / "frozen.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.freeze_backbone and not loaded.backbone.trainable_variables


@pytest.mark.slow
def test_heads_on_cached_features_equal_the_embedder_and_train_it():
    images, labels = _pixels(32), np.repeat(np.arange(8), 4)
    # ImageNet weights: a random backbone's features of small images are all but zero
    for model in (_lite("imagenet", freeze_backbone=True), _multilevel()):
        features = tfdml.training.backbone_features(model, images, batch_size=10)
        assert len(features) == len(model.levels) and all(len(f) == 32 for f in features)
        heads = tfdml.training.FeatureHeads(model)
        np.testing.assert_allclose(heads(features).numpy(), model(images).numpy(), atol=1e-5)
        before = model(images).numpy()
        history = tfdml.training.fit_heads(
            model, features, labels, loss="margin", optimizer=keras.optimizers.Adam(1e-2), steps=4,
            classes_per_batch=4, samples_per_class=4,
        )  # fmt: skip
        assert np.isfinite(history.history["loss"]).all()
        after = model(images).numpy()  # the embedder itself carries the trained heads
        assert not np.allclose(after, before, atol=1e-4)
        np.testing.assert_allclose(heads(features).numpy(), after, atol=1e-5)


def test_classification_pretraining_without_classifiers_is_refused_by_name():
    """Pre-training needs logits: an embedder built without `num_classes` says so in the loss, on the embedder
    and on its heads over cached features, instead of adding nothing."""
    model = _multilevel()
    images, labels = _pixels(4), np.arange(4)
    features = tfdml.training.backbone_features(model, images, batch_size=4)
    for trained, inputs in ((model, images), (tfdml.training.FeatureHeads(model), features)):
        trained.compile(optimizer="adam", loss="margin")
        trained.classification_pretraining = True
        with pytest.raises(ValueError, match="^classification pre-training needs an embedder built with num_classes$"):
            trained.compute_loss(inputs, labels, trained(inputs, training=True), training=True)


def _multilevel():
    return tfdml.models.MultiLevelEmbedder(
        "efficientnet_lite0",
        embedding_dim=4,
        input_shape=(SIZE, SIZE, 3),
        freeze_backbone=True,
        head_units=8,
        weights=None,
    )


@pytest.mark.slow
def test_heads_on_features_train_the_margin_loss_beta():
    model = _lite("imagenet", freeze_backbone=True)
    features = tfdml.training.backbone_features(model, _pixels(16))
    loss = tfdml.losses.MarginLoss()
    beta = float(loss.beta.numpy())
    tfdml.training.fit_heads(
        model, features, np.repeat(np.arange(4), 4), loss=loss, optimizer=keras.optimizers.Adam(1e-2), steps=3,
        classes_per_batch=4, samples_per_class=4,
    )  # fmt: skip
    assert float(loss.beta.numpy()) != beta


def test_balanced_batches_hold_c_classes_of_k():
    labels = np.repeat(np.arange(6), [5, 5, 5, 5, 5, 2])
    index = tfdml.training.balanced_batches(labels, 3, 4, steps=8, seed=1)
    assert index.shape == (8, 12)
    for row in index:
        classes = labels[row].reshape(3, 4)
        assert (classes == classes[:, :1]).all() and len(set(classes[:, 0])) == 3
        for group in row.reshape(3, 4):  # without replacement where the class has K items
            if np.sum(labels == labels[group[0]]) >= 4:
                assert len(set(group)) == 4
    seen = labels[index[:2].reshape(-1)].reshape(-1, 4)[:, 0]  # the first pass draws every class once
    assert sorted(seen) == list(range(6))
    with pytest.raises(ValueError, match="only 6 classes"):
        tfdml.training.balanced_batches(labels, 7, 2, steps=1)


@pytest.mark.slow
def test_heads_on_features_train_group_loss_after_its_cross_entropy_stage():
    model = _lite("imagenet", freeze_backbone=True, num_classes=4)
    images, labels = _pixels(16), np.repeat(np.arange(4), 4)
    features = tfdml.training.backbone_features(model, images)
    heads = tfdml.training.FeatureHeads(model)
    # the training layout is the embedder's: concat([embedding, logits]), what Group Loss reads
    np.testing.assert_allclose(heads(features, training=True).numpy(), model(images, training=True).numpy(), atol=1e-5)
    heads.compile(optimizer="sgd", loss=tfdml.losses.GroupLoss(4))
    heads.classification_pretraining = True
    y_pred = heads(features, training=True)
    expected = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, y_pred[:, 8:])
    np.testing.assert_allclose(heads.compute_loss(y=labels, y_pred=y_pred).numpy(), expected.numpy(), rtol=1e-5)
    classifier = model.classifiers[0].kernel.numpy().copy()
    history = tfdml.training.fit_heads(
        model, features, labels, loss=tfdml.losses.GroupLoss(4), optimizer=keras.optimizers.Adam(1e-2), steps=2,
        pretrain_steps=3, classes_per_batch=4, samples_per_class=4,
    )  # fmt: skip
    assert np.isfinite(history.history["loss"]).all()
    assert not np.allclose(model.classifiers[0].kernel.numpy(), classifier)
    with pytest.raises(ValueError, match="pretrain_steps=3 trains classifier logits: build the embedder with num_c"):
        tfdml.training.fit_heads(_lite(), features, labels, loss="margin", optimizer="sgd", steps=1, pretrain_steps=3)


def test_epoch_time_estimate_says_the_pace_once():
    lines = []
    estimate = EpochTimeEstimate(steps_per_epoch=20, epochs=3, say=lines.append, warmup_steps=1, measured_steps=2)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.zeros((40, 2)), np.zeros((40, 1)), batch_size=2, epochs=1, verbose=0, callbacks=[estimate])
    assert len(lines) == 1
    match = re.fullmatch(r"\nabout (\S+) s a step: \d+ s an epoch of 20 steps, \d+ s for 3 epochs", lines[0])
    assert match and float(match.group(1)) == pytest.approx(estimate.seconds_per_step, rel=0.05)


def test_image_dir_defaults_are_the_pretrained_backbone(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "0.png").write_bytes(b"")
    args = cli.build_parser().parse_args(["train", "--image-dir", str(tmp_path)])
    config = cli.train.resolve(args)
    model, data = config.model, config.data
    assert (model.backbone, model.weights, model.freeze_backbone) == ("efficientnet_lite0", "imagenet", True)
    assert data.image_size == 160 and data.augment and config.training.head_warmup_steps == 300
    assert model.type == "multilevel" and model.levels == ["L", "M", "H"]
    own = cli.build_parser().parse_args(["train", "--image-dir", str(tmp_path), "--set", "model.backbone=small_cnn"])
    assert cli.train.resolve(own).model.weights is None  # another backbone: its own defaults
    with pytest.raises(ConfigError, match="efficientnet_lite1 takes imagenet"):
        load_config(None, [("model.backbone", "efficientnet_lite1"), ("model.weights", "/tmp/x.h5")])
    with pytest.raises(ConfigError, match="model.frozen_stages: the stages of resnet50 are not known"):
        load_config(None, [("model.backbone", "resnet50"), ("model.frozen_stages", 2)])


@pytest.mark.slow
def test_image_dir_defaults_train_a_few_steps(tmp_path, capsys):
    """The defaults as a user runs them (EfficientNet-Lite0's ImageNet features, 160 px, the head's warm-up on
    features computed once, then augmented images), for 3 steps after the warm-up."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, name in enumerate(["ant", "bee", "cat", "dog"]):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 60, size=(40, 40, 3)) + 60 * label
            Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / "photos" / name / f"{i}.png")
    rc = cli.main(
        ["train", "--image-dir", str(tmp_path / "photos"), "--report-dir", str(tmp_path / "r"), "--no-export",
         "--epochs", "1", "--steps-per-epoch", "3", "--set", "data.classes_per_batch=2", "--set",
         "data.samples_per_class=2", "--set", "report.grid_queries=2", "--set", "report.worst_queries=2",
         "--set", "evaluation.ks=[1]"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert re.search(r"about \S+ s a step: \d+ s an epoch of 3 steps", out.out)
    config = load_config(str(tmp_path / "r" / "config.yaml"))
    assert config.model.backbone == "efficientnet_lite0" and config.model.weights == "imagenet"
    assert config.training.head_warmup_steps == 300


@pytest.mark.slow
def test_the_pretrained_backbone_trains_under_mixed_precision():
    """Under `mixed_bfloat16` (what a GPU or a recent CPU runs) the ImageNet weights load into bfloat16 layers,
    the embedding stays float32 and unit-norm, close to the float32 model's, and a fine-tuning step is finite."""
    images, labels = _pixels(16, seed=2), np.repeat(np.arange(4), 4)
    float32 = _lite("imagenet")
    reference = float32(images).numpy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = _lite("imagenet", frozen_stages=5)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.level_heads[0].set_weights(float32.level_heads[0].get_weights())  # the same new head in both
    assert model.backbone.get_layer("stem_conv").compute_dtype == "bfloat16"
    embeddings = model(images).numpy()
    assert embeddings.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    assert np.min(np.sum(embeddings * reference, axis=1)) > 0.95  # cosine to the float32 embedding
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="multi_similarity")
    history = model.fit(images, labels, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
