"""tfdml.export: TF Serving layout, signatures, fresh-process reload, metadata, atomicity, the gallery index."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import ROOT
from tfdml import export as E
from tfdml.retrieval import ScannIndex

pytestmark = pytest.mark.slow  # most tests share an export (a module fixture of about 20 s)

REPO = ROOT
SIZE = 12


def single_output_model():
    inputs = keras.Input((SIZE, SIZE, 3))
    h = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    h = keras.layers.Dense(6)(h)
    out = keras.layers.UnitNormalization()(h)
    return keras.Model(inputs, out, name="single")


def multi_level_model():
    """Stands in for MultiLevelEmbedder: dict output with the concatenation and each level."""
    inputs = keras.Input((SIZE, SIZE, 3))
    h = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    pooled = keras.layers.GlobalAveragePooling2D()(h)
    low, high = keras.layers.Dense(3)(pooled), keras.layers.Dense(5)(pooled)
    return keras.Model(
        inputs, {"embedding": keras.layers.Concatenate()([low, high]), "level_L": low, "level_H": high}, name="multi"
    )


def l2(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def caffe_preprocess(pixels):
    """NumPy ResNet50 ('caffe') preprocessing: RGB -> BGR, minus the ImageNet mean."""
    return pixels[..., ::-1] - np.array([103.939, 116.779, 123.68], np.float32)


def served_pixels(images, size=SIZE):
    """The papers' evaluation geometry, written out: bilinear resize to round(size * 256 / 224), centre crop."""
    side = round(size * 256 / 224)
    resized = tf.image.resize(np.asarray(images, np.float32), (side, side)).numpy()
    top = (side - size) // 2
    return resized[:, top : top + size, top : top + size]


def luma(images):
    return np.asarray(images, np.float32) @ np.array([[0.299], [0.587], [0.114]], np.float32)


def gray_model():
    inputs = keras.Input((SIZE, SIZE, 1))
    out = keras.layers.Dense(3)(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, out, name="gray")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("exports")
    single, multi = single_output_model(), multi_level_model()
    single.compile(optimizer="adam", loss="mse")
    p1 = E.export_saved_model(
        single,
        base,
        preprocess="keras.applications.resnet50.preprocess_input",
        training_config={"loss": "ranked_list", "margin": 0.4},
        metrics={"recall@1": 0.61},
    )
    p2 = E.export_saved_model(multi, base, preprocess="unit")
    gray = gray_model()
    p3 = E.export_saved_model(gray, base, preprocess="unit")
    return {"base": base, "single": (single, p1), "multi": (multi, p2), "gray": (gray, p3)}


# Runs in a fresh interpreter that never imports tfdml: reloads each export, runs both signatures on RGB
# and grayscale images, records the errors of an empty batch and of 4-channel images, and runs
# `saved_model_cli show --all` (the console script's own `main`) on the multi-level export.
_FRESH_PROCESS = textwrap.dedent("""
    import contextlib, io, json, sys, numpy as np, tensorflow as tf
    work, *paths = sys.argv[1:]
    inputs = dict(np.load(f"{work}/inputs.npz"))
    result, errors = {}, {}
    for n, path in enumerate(paths):
        loaded = tf.saved_model.load(path)
        serve, pre = loaded.signatures["serving_default"], loaded.signatures["embed_preprocessed"]
        channels = pre.structured_input_signature[1]["preprocessed"].shape[-1]
        for tag in ("images", "other", "gray"):
            result.update({f"{n}_{tag}_{k}": v.numpy() for k, v in serve(images=tf.constant(inputs[tag])).items()})
        out = pre(preprocessed=tf.constant(inputs[f"floats{channels}"]))
        result.update({f"{n}_float_{k}": v.numpy() for k, v in out.items()})
        for tag in ("empty", "rgba"):
            try:
                serve(images=tf.constant(inputs[tag]))
                errors[f"{n}_{tag}"] = "no error"
            except tf.errors.InvalidArgumentError as error:
                errors[f"{n}_{tag}"] = error.message
    assert not any(m == "tfdml" or m.startswith("tfdml.") for m in sys.modules), "tfdml was imported"
    np.savez(f"{work}/out.npz", **result)
    json.dump(errors, open(f"{work}/errors.json", "w"))
    from tensorflow.python.tools.saved_model_cli import main
    sys.argv = ["saved_model_cli", "show", "--all", "--dir", paths[1]]
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            main()
        except SystemExit as exit:
            assert not exit.code, exit.code
    open(f"{work}/cli.txt", "w").write(text.getvalue())
""")


@pytest.fixture(scope="module")
def fresh(exported, tmp_path_factory):
    work = tmp_path_factory.mktemp("fresh")
    rng = np.random.default_rng(0)
    inputs = {
        "images": rng.integers(0, 256, (4, SIZE, SIZE, 3)).astype(np.uint8),
        "other": rng.integers(0, 256, (3, 20, 17, 3)).astype(np.uint8),  # resized in the graph
        "gray": rng.integers(0, 256, (2, 15, 13, 1)).astype(np.uint8),
        "floats3": rng.normal(size=(2, SIZE, SIZE, 3)).astype(np.float32),
        "floats1": rng.normal(size=(2, SIZE, SIZE, 1)).astype(np.float32),
        "empty": np.zeros((0, SIZE, SIZE, 3), np.uint8),
        "rgba": np.zeros((1, SIZE, SIZE, 4), np.uint8),
    }
    np.savez(work / "inputs.npz", **inputs)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PYTHONPATH="")
    subprocess.run(
        [
            sys.executable,
            "-c",
            _FRESH_PROCESS,
            str(work),
            exported["single"][1],
            exported["multi"][1],
            exported["gray"][1],
        ],
        check=True,
        cwd=str(work),
        env=env,
        timeout=300,
    )
    with np.load(work / "out.npz") as data:
        outputs = dict(data)
    errors = json.loads((work / "errors.json").read_text())
    return inputs, outputs, (work / "cli.txt").read_text(), errors


def test_layout_and_metadata(exported):
    single, path = exported["single"]
    assert path == os.path.join(str(exported["base"]), "single", "1")
    assert sorted(os.listdir(os.path.dirname(path))) == ["1"]  # no temporary directories left
    meta = E.load_metadata(os.path.dirname(path))
    assert meta["embedding_dim"] == 6
    assert meta["image_size"] == [SIZE, SIZE]
    assert meta["preprocessing"] == "keras.applications.resnet50.preprocess_input"
    assert {k: meta["input"][k] for k in ("signature", "name", "dtype", "shape", "channels")} == {
        "signature": "serving_default",
        "name": "images",
        "dtype": "uint8",
        "shape": [None, None, None, 3],
        "channels": 3,
    }
    assert meta["eval_image"] == {"image_size": [SIZE, SIZE], "center_crop": True, "resize": [14, 14]}
    assert meta["training_config"] == {"loss": "ranked_list", "margin": 0.4}
    assert meta["metrics"] == {"recall@1": 0.61}
    assert meta["compile_config"]["loss"] == "mse"
    assert all(value is not None for value in meta.values())
    multi_meta = E.load_metadata(exported["multi"][1])
    assert multi_meta["outputs"] == {"embedding": 8, "level_L": 3, "level_H": 5}
    # Nothing was given for these: the keys are left out rather than written as null.
    assert not {"training_config", "metrics", "compile_config", "index"} & set(multi_meta)
    assert None not in multi_meta.values()


def test_fresh_process_outputs_equal_keras(exported, fresh):
    inputs, got, _, _ = fresh
    images, other, gray, floats = inputs["images"], inputs["other"], inputs["gray"], inputs["floats3"]
    single = exported["single"][0]
    expected = single(caffe_preprocess(served_pixels(images))).numpy()
    np.testing.assert_allclose(got["0_images_embedding"], expected, atol=2e-5)
    expected = single(caffe_preprocess(served_pixels(other))).numpy()
    np.testing.assert_allclose(got["0_other_embedding"], expected, atol=2e-5)
    np.testing.assert_allclose(got["0_float_embedding"], single(floats).numpy(), atol=2e-5)
    # A grayscale image sent to an RGB model: the gray value in the three channels.
    expected = single(caffe_preprocess(served_pixels(np.repeat(gray, 3, axis=-1)))).numpy()
    np.testing.assert_allclose(got["0_gray_embedding"], expected, atol=2e-5)

    multi = exported["multi"][0]
    ref = multi(served_pixels(images) / 255.0)
    np.testing.assert_allclose(got["1_images_embedding"], l2(ref["embedding"].numpy()), atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got["1_images_embedding"], axis=1), 1.0, atol=1e-5)
    for level in ("level_L", "level_H"):
        np.testing.assert_allclose(got[f"1_images_{level}"], ref[level].numpy(), atol=2e-5)
    np.testing.assert_allclose(got["1_float_level_H"], multi(floats)["level_H"].numpy(), atol=2e-5)

    # A colour image sent to a grayscale model: its ITU-R 601 luma, as a grayscale decoder gives.
    model = exported["gray"][0]
    np.testing.assert_allclose(
        got["2_images_embedding"], l2(model(served_pixels(luma(images)) / 255.0).numpy()), atol=2e-5
    )
    np.testing.assert_allclose(got["2_gray_embedding"], l2(model(served_pixels(gray) / 255.0).numpy()), atol=2e-5)


def test_serving_errors_name_the_problem(fresh):
    errors = fresh[3]
    for n in range(3):
        assert "empty batch: send at least one image" in errors[f"{n}_empty"]
        assert "images must have 1 (grayscale) or 3 (RGB) channels" in errors[f"{n}_rgba"]
        assert "Got channels:" in errors[f"{n}_rgba"] and "4" in errors[f"{n}_rgba"]


def test_saved_model_cli_lists_signatures(fresh):
    text = fresh[2]
    serving = text[text.index("signature_def['serving_default']") :]
    assert "inputs['images'] tensor_info:\n        dtype: DT_UINT8\n        shape: (-1, -1, -1, -1)" in serving
    for output in ("embedding", "level_L", "level_H"):
        assert f"outputs['{output}']" in serving
    assert "inputs['preprocessed']" in text and f"shape: (-1, {SIZE}, {SIZE}, 3)" in text


def test_predict_request_and_rest_body_use_the_signature_input(exported):
    from tensorflow_serving.apis import predict_pb2

    _, path = exported["single"]
    signature = tf.saved_model.load(path).signatures["serving_default"]
    input_names = list(signature.structured_input_signature[1])
    assert input_names == [E.IMAGE_INPUT]
    images = np.zeros((2, 5, 7, 3), np.uint8)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "single"
    request.model_spec.signature_name = "serving_default"
    request.inputs[input_names[0]].CopyFrom(tf.make_tensor_proto(images))
    parsed = predict_pb2.PredictRequest.FromString(request.SerializeToString())
    assert parsed.inputs["images"].dtype == tf.uint8.as_datatype_enum
    assert [d.size for d in parsed.inputs["images"].tensor_shape.dim] == [2, 5, 7, 3]
    body = E.rest_request_body(images)
    assert list(body["inputs"]) == input_names and body["signature_name"] == "serving_default"
    assert np.array(body["inputs"]["images"]).shape == (2, 5, 7, 3)
    json.dumps(body)
    with pytest.raises(ValueError, match="uint8"):
        E.rest_request_body(images.astype(np.float32))


def test_serving_guide_rest_example_uses_the_real_input_name():
    with open(os.path.join(REPO, "docs", "guides", "export-and-serving.md")) as f:
        guide = f.read()
    bodies = [b for b in re.findall(r"\{.*?\}", guide, flags=re.S) if '"instances"' in b or '"inputs"' in b]
    assert bodies, "the serving guide must show a TF Serving REST request body"
    for body in bodies:
        if '"inputs"' in body:
            assert re.search(r'"inputs"\s*:\s*\{\s*"images"', body), body
        assert '"input_1"' not in body and '"inputs_0"' not in body and '"input"' not in body, body


def test_versions_overwrite_and_interrupted_export(tmp_path, monkeypatch):
    model = single_output_model()
    first = E.export_saved_model(model, tmp_path, name="m")
    second = E.export_saved_model(model, tmp_path, name="m")
    assert (os.path.basename(first), os.path.basename(second)) == ("1", "2")
    with pytest.raises(FileExistsError, match="already exists"):
        E.export_saved_model(model, tmp_path, name="m", version=2)
    before = os.stat(os.path.join(second, "saved_model.pb")).st_mtime_ns
    E.export_saved_model(model, tmp_path, name="m", version=2, overwrite=True)
    assert E.load_metadata(second)["version"] == 2
    assert os.stat(os.path.join(second, "saved_model.pb")).st_mtime_ns >= before

    def write_half_then_fail(self, filepath, options=None, verbose=True):
        os.makedirs(os.path.join(filepath, "variables"))
        with open(os.path.join(filepath, "saved_model.pb"), "wb") as f:
            f.write(b"partial")
        raise KeyboardInterrupt("interrupted")

    archive_class = type(keras.export.ExportArchive())  # the backend subclass that implements write_out
    monkeypatch.setattr(archive_class, "write_out", write_half_then_fail)
    with pytest.raises(KeyboardInterrupt):
        E.export_saved_model(model, tmp_path, name="m")
    assert sorted(os.listdir(tmp_path / "m")) == ["1", "2"]  # no version 3, no temporary directory
    monkeypatch.undo()

    # A failure while the gallery index is built (after the SavedModel is written) leaves nothing either.
    def fail_in_index(self, directory, arrays=None):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ScannIndex, "save", fail_in_index)
    gallery = np.zeros((3, SIZE, SIZE, 3), np.uint8)
    with pytest.raises(RuntimeError, match="disk full"):
        E.export_saved_model(model, tmp_path, name="m", gallery=gallery)
    assert sorted(os.listdir(tmp_path / "m")) == ["1", "2"]


def test_export_errors(tmp_path):
    inputs = keras.Input((SIZE, SIZE, 3))
    flat = keras.layers.Flatten()(inputs)
    with pytest.raises(ValueError, match="must contain 'embedding'"):
        E.export_saved_model(keras.Model(inputs, {"emb": flat}), tmp_path, name="a")
    with pytest.raises(ValueError, match="list of outputs"):
        E.export_saved_model(keras.Model(inputs, [flat, flat]), tmp_path, name="b")
    with pytest.raises(ValueError, match="unknown preprocessing"):
        E.export_saved_model(single_output_model(), tmp_path, preprocess="imagenet")
    free = keras.Input((None, None, 3))
    pooled = keras.layers.GlobalAveragePooling2D()(free)
    with pytest.raises(ValueError, match="image_size"):
        E.export_saved_model(keras.Model(free, pooled), tmp_path, name="c")
    with pytest.raises(ValueError, match="plain directory name"):
        E.export_saved_model(single_output_model(), tmp_path, name="a/b")
    assert not any(name.isdigit() for d in os.listdir(tmp_path) for name in os.listdir(tmp_path / d))


class ProtocolModel(keras.Model):
    """A subclassed model using the optional protocol: preprocessing_config() and export_outputs() (which
    branches on a tensor in Python, as a user's function may)."""

    def __init__(self):
        super().__init__(name="protocol")
        self.dense = keras.layers.Dense(4)
        self.flatten = keras.layers.Flatten()

    def call(self, x, training=False):
        return self.dense(self.flatten(x))

    def preprocessing_config(self):
        return {"image_size": (6, 6), "preprocessing": "symmetric"}

    def export_outputs(self, x):
        h = self.dense(self.flatten(x))
        if tf.reduce_all(tf.math.is_finite(h)):  # Python `if` on a tensor: the export traces it with AutoGraph
            h = tf.identity(h)
        return {"embedding": h, "level_H": 2.0 * h}


def write_pngs(folder, images, prefix="g"):
    paths = []
    for i, image in enumerate(images):
        paths.append(str(folder / f"{prefix}{i}.png"))
        tf.io.write_file(paths[-1], tf.io.encode_png(image))
    return paths


def test_protocol_model_and_export_index(tmp_path):
    model = ProtocolModel()
    model(np.zeros((1, 6, 6, 3), np.float32))
    path = E.export_saved_model(model, tmp_path)
    meta = E.load_metadata(path)
    assert meta["image_size"] == [6, 6] and meta["preprocessing"] == "symmetric"
    assert meta["outputs"] == {"embedding": 4, "level_H": 4}

    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (7, 6, 6, 3)).astype(np.uint8)
    paths = write_pngs(tmp_path, images)
    index = E.export_index(paths, tmp_path, "protocol", labels=np.arange(7) % 2)
    index_dir = tmp_path / "protocol" / "1" / "assets.extra" / "tfdml_index"  # inside the version
    loaded = ScannIndex.load(index_dir)
    assert {k: loaded.metadata[k] for k in ("model_version", "model_name")} == {
        "model_version": 1,
        "model_name": "protocol",
    }
    assert loaded.metadata["model_fingerprint"] == tf.saved_model.experimental.read_fingerprint(path).singleprint()
    embedder = E.ExportedEmbedder(tmp_path / "protocol")
    emb = embedder.embed(images)
    np.testing.assert_allclose(emb, l2(model(served_pixels(images, 6) / 127.5 - 1.0).numpy()), atol=2e-5)
    found, scores = loaded.search(emb, k=1)
    assert found[:, 0].tolist() == [os.path.abspath(p) for p in paths]
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    np.testing.assert_array_equal(loaded.labels, np.arange(7) % 2)
    assert index.size == 7
    # A tf.data gallery: unbatched {"image", "label"} dicts, and batched (images, labels) tuples.
    dicts = tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(7) % 3})
    from_dicts = E.export_index(dicts, tmp_path, "protocol")
    np.testing.assert_array_equal(from_dicts.labels, np.arange(7) % 3)
    assert from_dicts.ids is None and from_dicts.search(emb[4], k=1)[0][0] == 4
    tuples = tf.data.Dataset.from_tensor_slices((images, np.arange(7))).batch(3)
    assert E.export_index(tuples, tmp_path, "protocol").labels.tolist() == list(range(7))


def test_each_version_keeps_its_index_and_a_foreign_index_is_refused(tmp_path):
    """The silent wrong result of a shared index: version 1 must keep answering with version 1's gallery."""
    rng = np.random.default_rng(3)
    # Noise tinted per image and channel: untinted noise images of one size embed within 1e-6 of each other
    # in the untrained model (its pooled features are means), and the nearest neighbour is then down to chance.
    first, second = (
        (rng.integers(0, 256, (5, SIZE, SIZE, 3)) * rng.uniform(0.05, 1.0, (5, 1, 1, 3))).astype(np.uint8)
        for _ in range(2)
    )
    keras.utils.set_random_seed(0)
    folder_1, folder_2 = tmp_path / "g1", tmp_path / "g2"
    folder_1.mkdir(), folder_2.mkdir()
    paths_1, paths_2 = write_pngs(folder_1, first), write_pngs(folder_2, second)
    model = single_output_model()
    v1 = E.export_saved_model(model, tmp_path, name="m", gallery=paths_1)
    v2 = E.export_saved_model(single_output_model(), tmp_path, name="m", gallery=paths_2)
    assert E.load_metadata(v2)["index"]["size"] == 5 and E.load_metadata(v2)["index"]["ids"] == "paths"
    embedder, index = E.load_index(tmp_path / "m", version=1)
    assert embedder.version == 1 and index.metadata["model_version"] == 1
    found, scores = index.search(embedder.embed(first), k=1)
    assert found[:, 0].tolist() == [os.path.abspath(p) for p in paths_1]  # not version 2's gallery
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    assert E.load_index(tmp_path / "m")[1].ids[0] == os.path.abspath(paths_2[0])  # latest: version 2's

    # Version 2's index copied into version 1: its files fail version 1's checksums; without them (a version
    # exported before the metadata recorded them) it is refused, naming both versions.
    shutil.rmtree(os.path.join(v1, E.INDEX_DIR))
    shutil.copytree(os.path.join(v2, E.INDEX_DIR), os.path.join(v1, E.INDEX_DIR))
    with pytest.raises(ValueError, match=r"tfdml_index/\S+ (differs from its checksum|holds \d+ bytes)"):
        E.load_index(tmp_path / "m", version=1)
    metadata = E.load_metadata(v1)
    del metadata["files"]
    with open(os.path.join(v1, E.METADATA_FILE), "w") as f:
        json.dump(metadata, f)
    with pytest.raises(E.IndexMismatchError, match="built with version 2, not 1"):
        E.load_index(tmp_path / "m", version=1)
    # Version 1 re-exported with other weights under the same number: its old index is refused too.
    E.export_index(paths_1, tmp_path, "m", version=1)
    old_index = tmp_path / "old_index"
    shutil.copytree(os.path.join(v1, E.INDEX_DIR), old_index)
    E.export_saved_model(single_output_model(), tmp_path, name="m", version=1, overwrite=True)
    with pytest.raises(FileNotFoundError, match="has no gallery index: build one with 'tfdml export"):
        E.load_index(tmp_path / "m", version=1)
    with pytest.raises(E.IndexMismatchError, match="fingerprint differs"):
        E.load_index(tmp_path / "m", version=1, index_dir=old_index)
    # TF Serving's loader sees a plain SavedModel: assets.extra is not part of the graph (the gallery's
    # `search` signature holds its own copy of the gallery, in variables).
    assert set(tf.saved_model.load(v2).signatures) == {"serving_default", "embed_preprocessed", "search"}


def test_source_gallery_stores_ids_class_names_and_pixels(tmp_path):
    from tfdml import data

    images = np.random.default_rng(4).integers(0, 256, (6, 8, 8, 1)).astype(np.uint8)
    source = data.array_source(images, [0, 0, 1, 1, 2, 2])
    source.class_names = ["zero", "one", "two"]
    inputs = keras.Input((SIZE, SIZE, 1))
    model = keras.Model(inputs, keras.layers.Dense(5)(keras.layers.Flatten()(inputs)), name="src")
    path = E.export_saved_model(model, tmp_path, preprocess="unit", gallery=source)
    _, index = E.load_index(path)
    assert index.ids.tolist() == list(range(6)) and index.class_names == ["zero", "one", "two"]
    assert [index.class_name(p) for p in range(6)] == ["zero", "zero", "one", "one", "two", "two"]
    np.testing.assert_array_equal(index.load_array(E.GALLERY_IMAGES_FILE), images)
    assert E.load_metadata(path)["index"] == {
        "path": E.INDEX_DIR,
        "size": 6,
        "distance": "dot_product",
        "mode": "exact",
        "ids": "indices",
        "has_labels": True,
        "classes": 3,
    }


def test_grayscale_model_takes_one_channel(tmp_path):
    model = gray_model()
    path = E.export_saved_model(model, tmp_path, preprocess="unit")
    assert E.load_metadata(path)["input"]["shape"] == [None, None, None, 1]
    embedder = E.ExportedEmbedder(path)
    images = np.random.default_rng(2).integers(0, 256, (2, SIZE, SIZE, 1)).astype(np.uint8)
    np.testing.assert_allclose(embedder.embed(images), l2(model(served_pixels(images) / 255.0).numpy()), atol=2e-5)
    assert np.array(E.rest_request_body(images)["inputs"]["images"]).shape == (2, SIZE, SIZE, 1)


def test_generated_exports_are_not_tracked():
    """Running the README (tfdml train, tfdml export) must not modify tracked files."""
    git = shutil.which("git")
    if git is None or not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        [git, "ls-files", "exported_models"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked == ["exported_models/README.md"]
    generated = [
        "exported_models/digits_rll/1/saved_model.pb",
        "exported_models/x/2/assets.extra/tfdml_index/ids.npy",
        "exported_models/x/.tmp-export-abc/model/saved_model.pb",
        "reports/digits_rll/metrics.json",
    ]
    ignored = subprocess.run([git, "check-ignore", *generated], cwd=REPO, capture_output=True, text=True).stdout
    assert ignored.split() == generated
    with open(os.path.join(REPO, "exported_models", "README.md")) as f:
        layout = f.read()
    assert "assets.extra/tfdml_index/" in layout and "tfdml_metadata.json" in layout
