"""Embedders: small-CNN multi-level and single-level models, heads, losses per level, classifier head,
save/load, error messages. (ResNet50 / InceptionV3 shapes live in test_models_applications.py.)"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml.callbacks import ClassificationPretraining
from tfdml.losses import GroupLoss, RankedListLoss
from tfdml.models import Embedder, MultiLevelEmbedder, backbones, small_cnn
from tfdml.models.heads import AuxiliaryEmbeddingHead, CaffeAveragePooling2D, L2Normalize

SHAPE = (16, 16, 1)
DIM = 8


def _batch(classes=4, per_class=6, seed=0):
    rng = np.random.RandomState(seed)
    labels = np.repeat(np.arange(classes), per_class).astype(np.int32)
    images = (rng.rand(len(labels), *SHAPE) + 0.2 * labels[:, None, None, None]).astype("float32")
    return images, labels


def _normalise(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def multilevel():
    keras.utils.set_random_seed(1)
    return MultiLevelEmbedder("small_cnn", embedding_dim=DIM, input_shape=SHAPE, head_filters=8, head_units=16)


@pytest.fixture(scope="module")
def grouped():
    keras.utils.set_random_seed(2)
    return Embedder("small_cnn", embedding_dim=DIM, input_shape=SHAPE, num_classes=4)


def test_small_cnn_names_its_taps_and_is_small():
    model = small_cnn((32, 32, 1))
    assert [model.get_layer(f"block{i}_out").output.shape[1:] for i in (1, 2, 3)] == [
        (16, 16, 8),
        (8, 8, 16),
        (4, 4, 32),
    ]
    assert model.count_params() < 10_000
    assert backbones.default_taps(model) == {"L": "block1_out", "M": "block2_out", "H": "block3_out"}


@pytest.mark.slow
def test_a_deeper_small_cnn_is_tapped_at_its_last_blocks_and_every_weight_trains():
    """The main job's small CNN has four blocks; taps fixed at blocks 1-3 left block 4 without a gradient
    (Keras' "Gradients do not exist for variables ['block4_conv/kernel', ...]")."""
    assert backbones.default_taps(small_cnn((32, 32, 1), widths=(4, 4, 8, 8))) == {
        "L": "block2_out",
        "M": "block3_out",
        "H": "block4_out",
    }
    keras.utils.set_random_seed(0)
    model = MultiLevelEmbedder("small_cnn", embedding_dim=4, input_shape=SHAPE, weights=None, widths=(4, 4, 8, 8))
    assert model.taps == ["block2_out", "block3_out", "block4_out"]
    model.compile(keras.optimizers.SGD(0.01), loss=RankedListLoss())
    images, labels = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(images, labels, batch_size=len(images), epochs=1, shuffle=False, verbose=0)


def test_multilevel_output_is_unit_norm_concat_of_levels(multilevel):
    images, _ = _batch()
    embedding = multilevel(images, training=False).numpy()
    assert embedding.shape == (len(images), 3 * DIM)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, atol=1e-5)
    raw, logits = multilevel.level_outputs(images, training=False)
    assert logits == []
    # inference embedding = l2_normalize(concat of the un-normalised level outputs)
    np.testing.assert_allclose(embedding, _normalise(np.concatenate([r.numpy() for r in raw], axis=1)), atol=1e-5)
    # each level's slice, renormalised, is that level's own normalised embedding (RLL-L, -M, -H)
    levels = multilevel.split_levels(embedding)
    for level, r in zip("LMH", raw):
        np.testing.assert_allclose(levels[level].numpy(), _normalise(r.numpy()), atol=1e-5)
    outputs = multilevel.export_outputs(images)
    assert sorted(outputs) == ["H", "L", "M", "embedding"]
    np.testing.assert_allclose(outputs["embedding"].numpy(), embedding, atol=1e-6)


def test_head_structure_follows_the_official_prototxt(multilevel):
    head = multilevel.get_layer("head_L")
    assert isinstance(head, AuxiliaryEmbeddingHead)
    # L tap 8x8x8 -> avg pool 5/3 -> 2x2 -> conv 1x1 (8) -> flatten 32 -> fc 16 -> projection 8, no biases
    assert tuple(head.pool.pool_size) == (5, 5) and tuple(head.pool.strides) == (3, 3)
    assert head.fc.kernel.shape == (2 * 2 * 8, 16)
    assert not head.conv.use_bias and not head.fc.use_bias and not head.projection.use_bias
    h_head = multilevel.get_layer("head_H")
    assert [v.shape for v in h_head.trainable_variables] == [(32, DIM)]  # pool -> Dense(D, no bias)
    # a map smaller than the 5x5 pool is pooled whole
    small = AuxiliaryEmbeddingHead(4, filters=2, units=3)
    assert small(tf.zeros([2, 3, 3, 5])).shape == (2, 4)
    assert small.pool.compute_output_shape((2, 3, 3, 5)) == (2, 1, 1, 5)


def _caffe_ave_pool(x, kernel, stride, pad=0):
    """Caffe's PoolingLayer<Dtype>::Forward_cpu, PoolingParameter_PoolMethod_AVE, on one NHWC array: output
    size ceil((H + 2 pad - k) / s) + 1 (minus one if the last window starts in the padding), and the
    divisor `pool_size` taken BEFORE clipping the window to the map, with `hend = min(hstart + k, H + pad)`."""
    n, height, width, c = x.shape
    out_h = int(np.ceil((height + 2 * pad - kernel) / stride)) + 1
    out_w = int(np.ceil((width + 2 * pad - kernel) / stride)) + 1
    if pad and (out_h - 1) * stride >= height + pad:
        out_h -= 1
    if pad and (out_w - 1) * stride >= width + pad:
        out_w -= 1
    out = np.zeros((n, out_h, out_w, c))
    for ph in range(out_h):
        for pw in range(out_w):
            hstart, wstart = ph * stride - pad, pw * stride - pad
            hend, wend = min(hstart + kernel, height + pad), min(wstart + kernel, width + pad)
            pool_size = (hend - hstart) * (wend - wstart)
            hstart, wstart = max(hstart, 0), max(wstart, 0)
            hend, wend = min(hend, height), min(wend, width)
            out[:, ph, pw, :] = x[:, hstart:hend, wstart:wend, :].sum(axis=(1, 2)) / pool_size
    return out


@pytest.mark.parametrize("size, expected", [(7, 2), (14, 4), (8, 2), (12, 4), (6, 2), (5, 1), (9, 3), (17, 5)])
def test_caffe_average_pooling_matches_caffe(size, expected):
    """GoogLeNet's 5x5/3 auxiliary pool rounds the output size up (7x7 -> 2x2, 14x14 -> 4x4; a "valid" pool
    gives 1x1 and 3x3) and averages each clipped border window over the elements it covers."""
    x = np.random.default_rng(size).normal(size=(2, size, size, 3))
    reference = _caffe_ave_pool(x, 5, 3)
    assert reference.shape[1:3] == (expected, expected)
    layer = CaffeAveragePooling2D(5, 3)
    pooled = layer(tf.constant(x))
    assert layer.compute_output_shape(x.shape) == pooled.shape == reference.shape
    np.testing.assert_allclose(pooled.numpy(), reference, rtol=1e-5, atol=1e-6)  # the layer computes in float32
    # Rectangular maps and the head that uses it.
    x = np.random.default_rng(0).normal(size=(1, 7, 14, 2)).astype("float32")
    np.testing.assert_allclose(CaffeAveragePooling2D(5, 3)(x).numpy(), _caffe_ave_pool(x, 5, 3), rtol=1e-6)
    head = AuxiliaryEmbeddingHead(4, filters=2, units=3)
    head.build((None, 14, 14, 6))
    assert head.fc.kernel.shape == (4 * 4 * 2, 3)
    restored = CaffeAveragePooling2D.from_config(layer.get_config())
    assert restored.pool_size == (5, 5) and restored.strides == (3, 3)


def test_compute_loss_sums_level_losses_with_weights():
    keras.utils.set_random_seed(3)
    model = MultiLevelEmbedder(
        "small_cnn", embedding_dim=DIM, input_shape=SHAPE, head_filters=8, head_units=16, level_weights=(1.0, 0.5, 2.0)
    )
    model.compile(keras.optimizers.SGD(0.0), loss=RankedListLoss())
    images, labels = _batch()
    prediction = model(images, training=False)
    total = model.compute_loss(x=images, y=labels, y_pred=prediction, training=False)
    raw, _ = model.level_outputs(images, training=False)
    reference = [RankedListLoss()(labels, tf.math.l2_normalize(r, axis=-1)).numpy() for r in raw]
    np.testing.assert_allclose(total.numpy(), reference[0] + 0.5 * reference[1] + 2.0 * reference[2], rtol=1e-4)
    logged = model.evaluate(images, labels, batch_size=len(images), verbose=0, return_dict=True)
    for level, value in zip("LMH", reference):
        np.testing.assert_allclose(logged[f"loss_{level}"], value, rtol=1e-4)


@pytest.mark.slow
def test_multilevel_rll_training_lowers_each_level_loss():
    keras.utils.set_random_seed(4)
    model = MultiLevelEmbedder("small_cnn", embedding_dim=DIM, input_shape=SHAPE, head_filters=8, head_units=16)
    model.compile(keras.optimizers.Adam(1e-2), loss=RankedListLoss())
    images, labels = _batch(classes=4, per_class=8)
    history = model.fit(images, labels, batch_size=len(images), epochs=8, shuffle=False, verbose=0).history
    for level in "LMH":
        assert history[f"loss_{level}"][-1] < 0.5 * history[f"loss_{level}"][0], (level, history[f"loss_{level}"])
    total = np.array(history["loss_L"]) + np.array(history["loss_M"]) + np.array(history["loss_H"])
    np.testing.assert_allclose(history["loss"], total, rtol=1e-4)


@pytest.mark.slow
def test_a_single_level_model_logs_its_loss_once():
    """The loss of the one level is the loss: no `loss_H` beside it, which reads as a multilevel model's; two
    levels log each beside their sum."""
    images, labels = _batch()
    logs = {}
    for name, model in {
        "embedder": Embedder("small_cnn", embedding_dim=DIM, input_shape=SHAPE),
        "one level": MultiLevelEmbedder("small_cnn", embedding_dim=DIM, input_shape=SHAPE, levels=("H",)),
        "two levels": MultiLevelEmbedder(
            "small_cnn", embedding_dim=DIM, input_shape=SHAPE, levels=("M", "H"), head_filters=8, head_units=16
        ),
    }.items():
        model.compile(keras.optimizers.SGD(0.01), loss=RankedListLoss())
        history = model.fit(images, labels, batch_size=len(images), epochs=1, shuffle=False, verbose=0).history
        logs[name] = sorted(history)
    assert logs == {"embedder": ["loss"], "one level": ["loss"], "two levels": ["loss", "loss_H", "loss_M"]}


def test_save_load_round_trip_keeps_outputs(multilevel, grouped, tmp_path):
    images, _ = _batch()
    for model in (multilevel, grouped):
        path = str(tmp_path / f"{model.name}.keras")
        model.save(path)
        restored = keras.saving.load_model(path)
        assert type(restored) is type(model)
        np.testing.assert_array_equal(restored(images, training=False).numpy(), model(images, training=False).numpy())
        assert restored.get_config() == model.get_config()
    restored_outputs = restored.export_outputs(images)
    assert sorted(restored_outputs) == ["embedding"]


def test_serving_attributes(multilevel):
    assert multilevel.image_shape == SHAPE and multilevel.input_shape_hw == SHAPE[:2]
    assert multilevel.preprocessing == "unit"  # the small CNN divides its raw input by 255 itself
    assert multilevel.preprocessing_config() == {
        "image_size": SHAPE[:2],
        "channels": 1,
        "preprocessing": "unit",
        "applied_by_model": True,
    }
    pixels = np.full((1,) + SHAPE, 255, "uint8")
    np.testing.assert_allclose(multilevel.pixel_preprocessing(pixels), np.ones(pixels.shape))
    np.testing.assert_allclose(multilevel(pixels).numpy(), multilevel(pixels.astype("float32")).numpy())
    assert backbones.preprocessing_name("resnet50") == "keras.applications.resnet50.preprocess_input"
    assert backbones.preprocessing_name("EfficientNetV2B0") == "keras.applications.efficientnet_v2.preprocess_input"
    assert backbones.preprocessing_name(keras.Sequential(name="custom")) is None


def test_group_loss_layout_and_evaluation(grouped):
    images, labels = _batch()
    training_output = grouped(images, training=True)
    assert training_output.shape == (len(images), DIM + 4)
    assert grouped(images, training=False).shape == (len(images), DIM)
    raw, logits = grouped.level_outputs(images, training=True)
    np.testing.assert_allclose(training_output[:, DIM:], logits[0], atol=1e-5)
    loss = GroupLoss(num_classes=4, temperature=10.0)
    grouped.compile(keras.optimizers.SGD(0.0), loss=loss)
    value = grouped.compute_loss(x=images, y=labels, y_pred=training_output)
    np.testing.assert_allclose(value.numpy(), loss(labels, training_output).numpy(), rtol=1e-5)
    # evaluation sees only the embedding; the logits are recomputed in inference mode
    inference = grouped(images, training=False)
    value = grouped.compute_loss(x=images, y=labels, y_pred=inference, training=False)
    _, eval_logits = grouped.level_outputs(images, training=False)
    expected = loss(labels, tf.concat([inference, eval_logits[0]], axis=-1))
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-5)


@pytest.mark.slow
def test_classification_pretraining_switches_loss():
    keras.utils.set_random_seed(5)
    model = Embedder("small_cnn", embedding_dim=DIM, input_shape=SHAPE, num_classes=4)
    loss = GroupLoss(num_classes=4, temperature=10.0)
    model.compile(keras.optimizers.SGD(0.0), loss=loss)  # lr 0: the weights stay, only the loss changes
    images, labels = _batch()
    history = model.fit(
        images,
        labels,
        batch_size=len(images),
        epochs=3,
        shuffle=False,
        verbose=0,
        callbacks=[ClassificationPretraining(epochs=2)],
    ).history
    assert history["pretraining"] == [1.0, 1.0, 0.0]
    output = model(images, training=True)
    cross_entropy = keras.losses.sparse_categorical_crossentropy(labels, output[:, DIM:], from_logits=True)
    np.testing.assert_allclose(history["loss"][:2], [float(np.mean(cross_entropy))] * 2, rtol=1e-4)
    np.testing.assert_allclose(history["loss"][2], loss(labels, output).numpy(), rtol=1e-4)
    assert model.classification_pretraining is False
    with pytest.raises(ValueError, match="num_classes"):
        no_classifier = Embedder("small_cnn", embedding_dim=DIM, input_shape=SHAPE)
        no_classifier.compile("sgd", loss=RankedListLoss())
        no_classifier.fit(images, labels, epochs=1, verbose=0, callbacks=[ClassificationPretraining(1)])


def test_custom_backbone_tapped_by_layer_name():
    inputs = keras.Input((12, 12, 3))
    a = keras.layers.Conv2D(4, 3, padding="same", name="low")(inputs)
    b = keras.layers.Conv2D(6, 3, strides=2, padding="same", name="mid")(a)
    c = keras.layers.Conv2D(8, 3, strides=2, padding="same", name="high")(b)
    backbone = keras.Model(inputs, c, name="custom")
    model = MultiLevelEmbedder(
        backbone, taps={"L": "low", "M": "mid", "H": "high"}, embedding_dim=4, head_filters=4, head_units=8
    )
    images = np.random.RandomState(0).rand(3, 12, 12, 3).astype("float32")
    assert model(images).shape == (3, 12)
    # the config carries the custom backbone, so from_config rebuilds the same architecture
    clone = MultiLevelEmbedder.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(images).numpy(), model(images).numpy(), atol=1e-6)
    single = Embedder(backbone, embedding_dim=5)  # no taps needed for the single level
    assert single(images).shape == (3, 5)


def test_errors_name_the_problem():
    backbone = small_cnn((16, 16, 1))
    with pytest.raises(ValueError, match="no layer named 'nope'"):
        MultiLevelEmbedder(backbone, taps={"L": "nope", "M": "block2_out", "H": "block3_out"})
    with pytest.raises(ValueError, match=r"no layer for the levels \['M'\]"):
        MultiLevelEmbedder(backbone, taps={"L": "block1_out", "H": "block3_out"})
    custom = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(2, 3, name="c")], name="seq")
    with pytest.raises(ValueError, match="no default taps"):
        MultiLevelEmbedder(custom)
    with pytest.raises(ValueError, match="Unknown backbone 'resnet5'"):
        Embedder("resnet5", weights=None)
    with pytest.raises(ValueError, match="Unknown levels"):
        MultiLevelEmbedder("small_cnn", levels=("L", "X"))
    with pytest.raises(ValueError, match="small CNN has no pretrained weights"):
        backbones.get_backbone("small_cnn", weights="imagenet")
    model = MultiLevelEmbedder("small_cnn", embedding_dim=4, input_shape=SHAPE, head_filters=4, head_units=4)
    images, labels = _batch()
    with pytest.raises(ValueError, match="one loss to every level"):
        model.compile("sgd", loss=[RankedListLoss()])
        model.compute_loss(x=images, y=labels, y_pred=model(images))


# Keras' own advice for ImageNet weights at 32 px (not 224), expected here: the test is about the download.
@pytest.mark.filterwarnings("ignore:`input_shape` is undefined or non-square:UserWarning")
def test_imagenet_download_failure_names_cause_and_fix(monkeypatch):
    from keras.src.utils import file_utils

    def offline(*args, **kwargs):
        raise Exception(
            "URL fetch failure on https://storage.googleapis.com/...: None -- [Errno -3] "
            "Temporary failure in name resolution"
        )

    monkeypatch.setattr(file_utils, "get_file", offline)
    with pytest.raises(RuntimeError) as error:
        backbones.get_backbone("mobilenetv3small", input_shape=(32, 32, 3), weights="imagenet")
    message = str(error.value)
    assert "mobilenetv3small" in message and "Temporary failure in name resolution" in message
    assert "weights=None" in message and "weights='/path/to/" in message


def test_imagenet_weights_on_grayscale_input_say_the_channel_count():
    # keras.applications' own channel error would be reported as a failed download
    with pytest.raises(ValueError, match="take 3-channel \\(RGB\\) images, got input_shape \\(32, 32, 1\\)"):
        backbones.get_backbone("resnet50", input_shape=(32, 32, 1), weights="imagenet")


def test_l2_normalize_layer():
    layer = L2Normalize()
    np.testing.assert_allclose(layer(tf.constant([[3.0, 4.0], [0.0, 0.0]])).numpy(), [[0.6, 0.8], [0.0, 0.0]])
    assert L2Normalize.from_config(layer.get_config()).epsilon == layer.epsilon


@pytest.mark.slow
def test_unprojected_embedder_is_the_pooled_feature_with_the_classifier_on_it(tmp_path):
    """Group Loss's official layout (`embedding_dim=None`): the L2-normalised global average pool of the
    backbone is the embedding, and the classifier reads that pooled feature directly."""
    keras.utils.set_random_seed(5)
    model = Embedder("small_cnn", embedding_dim=None, input_shape=SHAPE, num_classes=4)
    images, labels = _batch()
    preprocessed = images / 255.0  # the model's first layer: the small CNN's pixels / 255
    feature_map = model.backbone(preprocessed, training=False).numpy()  # small CNN: 2x2x32
    pooled = feature_map.mean(axis=(1, 2))
    assert model.embedding_dim == model.output_dim == 32 and model.get_layer("head_H").projection is None
    np.testing.assert_allclose(model(images, training=False).numpy(), _normalise(pooled), atol=1e-5)
    classifier = model.classifiers[0]
    assert classifier.kernel.shape == (32, 4)
    training_output = model(images, training=True).numpy()
    assert training_output.shape == (len(images), 32 + 4)
    pooled_train = model.backbone(preprocessed, training=True).numpy().mean(axis=(1, 2))  # BatchNorm in training mode
    np.testing.assert_allclose(training_output[:, :32], _normalise(pooled_train), atol=1e-5)
    np.testing.assert_allclose(training_output[:, 32:], classifier(pooled_train).numpy(), rtol=1e-4, atol=1e-5)
    # No layer between the backbone and the classifier: the heads own only the classifier's variables.
    assert [v.shape for v in model.head_variables] == [(32, 4), (4,)]
    model.compile(keras.optimizers.Adam(1e-3), loss=GroupLoss(4, temperature=2.0))
    assert np.isfinite(model.fit(images, labels, batch_size=len(images), epochs=1, verbose=0).history["loss"][0])
    path = str(tmp_path / "unprojected.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert restored.get_config()["embedding_dim"] is None
    np.testing.assert_array_equal(restored(images, training=False).numpy(), model(images, training=False).numpy())
    with pytest.raises(ValueError, match="embedding_dim=None .* needs the single level"):
        MultiLevelEmbedder("small_cnn", embedding_dim=None, input_shape=SHAPE)


def test_embedder_takes_the_small_cnn_widths():
    """`Embedder("small_cnn", widths=...)` builds the main job's CNN (16-32-64-128) without a config file."""
    model = Embedder("small_cnn", embedding_dim=4, input_shape=SHAPE, widths=(4, 6, 10))
    convs = [layer.filters for layer in model.backbone.layers if isinstance(layer, keras.layers.Conv2D)]
    assert convs == [4, 6, 10] and model.get_config()["widths"] == [4, 6, 10]
    restored = Embedder.from_config(model.get_config())
    assert [layer.filters for layer in restored.backbone.layers if isinstance(layer, keras.layers.Conv2D)] == convs
    with pytest.raises(ValueError, match="widths sets the small CNN's block widths; backbone 'resnet50'"):
        Embedder("resnet50", weights=None, widths=(4, 6))


def test_embeddings_are_unit_norm_under_mixed_precision_for_large_activations():
    """Under `mixed_float16` the L2 normalisation computes in float32: head outputs in the hundreds have
    squares past float16's 65504 (a float16 sum of squares is inf, the embedding 0 or NaN)."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(3)
        model = Embedder("small_cnn", embedding_dim=DIM, input_shape=SHAPE, num_classes=4)
        layer = L2Normalize()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    np.testing.assert_allclose(layer(tf.constant([[3e3, 4e3]], tf.float16)).numpy(), [[0.6, 0.8]], atol=1e-6)
    projection = model.level_heads[0].projection
    images = _batch()[0] * 150.0  # pixels up to 255
    scale = 1000.0 / float(np.abs(model.level_outputs(images)[0][0]).max())
    projection.kernel.assign(projection.kernel * scale)  # head outputs up to 1000, in float16
    raw = model.level_outputs(images)[0][0]
    assert raw.dtype == tf.float16 and 300 < float(tf.reduce_max(tf.abs(raw))) < 2000
    embeddings = model(images, training=False)
    assert embeddings.dtype == tf.float32 and np.isfinite(embeddings.numpy()).all()
    np.testing.assert_allclose(np.linalg.norm(embeddings.numpy(), axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(embeddings.numpy(), _normalise(raw.numpy()), atol=1e-3)
    trained = model(images, training=True).numpy()  # with the classifier's logits beside the embedding
    assert trained.shape == (len(images), DIM + 4) and np.isfinite(trained).all()
    np.testing.assert_allclose(np.linalg.norm(trained[:, :DIM], axis=1), 1.0, atol=1e-5)
