"""One preprocessing, in one place: the embedder's first layer (`tfdml.models.preprocessing`).

The Keras model on raw pixels, the exported SavedModel on the same pixels, `RetrievalEvaluation` on raw
uint8 arrays and `tfdml evaluate` on the export all agree; the data pipelines feed raw pixels; a model file
written before the layer existed loads with its preprocessing inside."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import REFERENCES
from tfdml import data
from tfdml import export as E
from tfdml.callbacks import RetrievalEvaluation
from tfdml.models import Embedder
from tfdml.models.preprocessing import PixelPreprocessing, resolve_preprocessing
from tfdml.retrieval import evaluate

DATA = REFERENCES
SIZE = 16
IMAGENET_MEAN_BGR = np.array([103.939, 116.779, 123.68], np.float32)


def pixels(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)


@pytest.mark.parametrize(
    "spec, reference",
    [
        (None, lambda x: x),
        ("unit", lambda x: x / 255.0),
        ("symmetric", lambda x: x / 127.5 - 1.0),
        # Caffe mode (ResNet50, VGG): RGB -> BGR, minus the ImageNet mean; "tf" mode (InceptionV3): [-1, 1].
        ("keras.applications.resnet50.preprocess_input", lambda x: x[..., ::-1] - IMAGENET_MEAN_BGR),
        ("keras.applications.inception_v3.preprocess_input", lambda x: x / 127.5 - 1.0),
    ],
)
def test_layer_applies_the_spec_to_uint8_pixels(spec, reference):
    images = pixels((2, 4, 5, 3))
    layer = PixelPreprocessing(spec)
    out = layer(images)
    assert out.dtype == "float32"
    np.testing.assert_allclose(out, reference(images.astype(np.float64)), rtol=1e-6, atol=1e-4)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert restored.spec == layer.spec == (None if spec in (None, "none") else spec)
    np.testing.assert_array_equal(restored(images), out)


def test_layer_refuses_what_it_cannot_save_or_resolve():
    with pytest.raises(ValueError, match="cannot be saved with the model"):
        PixelPreprocessing(lambda x: x / 255.0)
    with pytest.raises(ValueError, match="unknown preprocessing 'imagenet'"):
        PixelPreprocessing("imagenet")
    # A module-level function is stored by its dotted name, which imports back.
    layer = PixelPreprocessing(keras.applications.resnet50.preprocess_input)
    assert layer.spec.endswith("preprocess_input")
    assert resolve_preprocessing(layer.spec)[0] is keras.applications.resnet50.preprocess_input


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(3)
    embedder = Embedder("small_cnn", embedding_dim=8, input_shape=(SIZE, SIZE, 1))
    # Non-zero BatchNorm statistics: otherwise the untrained CNN is positively homogeneous and the
    # normalised embedding would not see whether the pixels were divided by 255.
    rng = np.random.default_rng(1)
    for layer in embedder.backbone.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(rng.normal(0, 0.5, layer.moving_mean.shape).astype("float32"))
            layer.beta.assign(rng.normal(0, 0.5, layer.beta.shape).astype("float32"))
    return embedder


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    base = tmp_path_factory.mktemp("exports")
    whole = E.export_saved_model(model, base, name="whole", center_crop=False)
    cropped = E.export_saved_model(model, base, name="cropped")
    return whole, cropped


@pytest.mark.slow
def test_model_on_raw_pixels_equals_the_served_model(model, exported):
    whole, cropped = exported
    images = pixels((6, SIZE, SIZE, 1))
    served = E.ExportedEmbedder(whole).embed(images)
    np.testing.assert_allclose(model.predict(images, verbose=0), served, atol=1e-5)
    np.testing.assert_allclose(model(images).numpy(), served, atol=1e-5)
    # The pixel preprocessing is the model's: dividing by 255 outside gives another embedding.
    assert np.abs(model(images.astype(np.float32) / 255.0).numpy() - served).max() > 1e-2
    # With the evaluation geometry (resize 18, centre crop 16) the graph only resizes and crops.
    other = pixels((3, 23, 19, 1), seed=1)
    side = round(SIZE * 256 / 224)
    resized = tf.image.resize(other.astype(np.float32), (side, side)).numpy()
    top = (side - SIZE) // 2
    expected = model(resized[:, top : top + SIZE, top : top + SIZE]).numpy()
    np.testing.assert_allclose(E.ExportedEmbedder(cropped).embed(other), expected, atol=1e-5)
    meta = E.load_metadata(whole)
    assert meta["preprocessing"] == "unit" and meta["preprocessing_in_model"] is True


@pytest.mark.slow
def test_export_refuses_a_second_preprocessing(model, tmp_path):
    with pytest.raises(ValueError, match=r"applies its own pixel preprocessing \('unit'\).*a second time"):
        E.export_saved_model(model, tmp_path, name="twice", preprocess="symmetric")
    assert not os.path.exists(tmp_path / "twice" / "1")
    # Naming the model's own spec is not a second one.
    path = E.export_saved_model(model, tmp_path, name="same", preprocess="unit", center_crop=False)
    images = pixels((2, SIZE, SIZE, 1), seed=2)
    np.testing.assert_allclose(E.ExportedEmbedder(path).embed(images), model(images).numpy(), atol=1e-5)


@pytest.mark.slow
def test_retrieval_evaluation_on_raw_uint8_equals_the_export(model, exported):
    images = pixels((40, SIZE, SIZE, 1), seed=4)
    labels = np.repeat(np.arange(8), 5)
    callback = RetrievalEvaluation((images, labels), ks=(1, 2), metrics=("recall", "map@r"))
    callback.set_model(model)
    served = evaluate(E.ExportedEmbedder(exported[0]).embed(images), labels, ks=(1, 2), metrics=("recall", "map@r"))
    assert callback.evaluate() == pytest.approx(served, abs=1e-6)


@pytest.mark.slow
def test_pipelines_feed_raw_pixels():
    images = pixels((8, SIZE, SIZE, 1), seed=5)
    source = data.array_source(images, np.repeat(np.arange(4), 2))
    batch, labels = next(iter(data.class_balanced_dataset(source, 2, 2, seed=0)))
    assert batch.dtype == tf.float32
    for image, label in zip(batch.numpy(), labels.numpy()):
        assert any(np.array_equal(image, images[i]) for i in np.flatnonzero(source.labels == label))
    evaluated, _ = next(iter(data.eval_dataset(source, 8, image_size=SIZE, center_crop=False)))
    np.testing.assert_array_equal(evaluated.numpy(), images.astype(np.float32))
    episode = next(iter(data.episode_dataset(source, train_size=4, val_size=2, train_classes=2, val_classes=1, seed=0)))
    assert float(tf.reduce_max(episode[0])) > 1.0  # 0-255, not [0, 1]


def test_a_model_saved_before_the_layer_loads_with_its_preprocessing():
    """`legacy_embedder.keras` was saved by tfdml e4aa43b, whose embedders took pixels / 255 from the data
    pipeline and the serving graph; its config names the spec, so it loads with the layer and gives on raw
    pixels what it gave then on pixels / 255 (tests/references/README.md)."""
    with open(os.path.join(DATA, "legacy_embedder.json")) as f:
        reference = json.load(f)
    model = keras.saving.load_model(os.path.join(DATA, "legacy_embedder.keras"))
    assert model.preprocessing == "unit"
    images = np.asarray(reference["pixels"], np.uint8)
    np.testing.assert_allclose(model.predict(images, verbose=0), reference["embedding"], atol=1e-5)
