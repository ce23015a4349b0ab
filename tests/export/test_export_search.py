"""The `search` signature (tfdml.export.search): run in a process that imports only TensorFlow, compared with a
NumPy brute force over `serving_default` embeddings of the whole gallery; compressed galleries within their
stated error bounds; calibrated `match`; `saved_model_cli show --all`."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml import data
from tfdml import export as E
from tfdml.export.search import blocked_top_k
from tfdml.retrieval import calibrate

pytestmark = pytest.mark.slow  # the tests share an export with a gallery (about 20 s)

SIZE = 12  # the model's input size; gallery images are 10 x 10, queries 17 x 19 (resized in the graph)
K = 5
CLASSES = ["cup", "fork", "knife", "plate", "crêpe pan ¤"]  # any text: served as UTF-8


def tiny_model():
    inputs = keras.Input((SIZE, SIZE, 3))
    h = keras.layers.Flatten()(inputs)
    return keras.Model(
        inputs, keras.layers.Dense(8, kernel_initializer=keras.initializers.HeNormal(seed=2))(h), name="tiny"
    )


def gallery_images():
    """40 images of 5 classes: a class colour plus noise, so that neighbours mostly share the class."""
    rng = np.random.default_rng(0)
    labels = np.arange(40) % 5
    colours = rng.integers(40, 216, (5, 1, 1, 3))
    images = np.clip(colours[labels] + rng.normal(0, 40, (40, 10, 10, 3)), 0, 255).astype(np.uint8)
    return images, labels


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("search")
    images, labels = gallery_images()
    source = data.array_source(images, labels, name="kitchen")
    source.class_names = CLASSES
    model = tiny_model()
    paths = {}
    # Blocks of 7 rows (the last one ragged) exercise the running top-k merge of the blocked search.
    for version, dtype in enumerate(("float32", "bfloat16", "int8"), start=1):
        paths[dtype] = E.export_saved_model(
            model,
            base,
            name="tiny",
            version=version,
            preprocess="symmetric",
            gallery=source,
            top_k=K,
            gallery_dtype=dtype,
            search_block_rows=7,
            match_precision=0.99,
            index_mode="exact",
        )
    return {"base": base, "paths": paths, "images": images, "labels": labels}


# A fresh interpreter that must not import tfdml or scann: runs `search` on queries of another size than the
# model's and on the gallery images, `serving_default` on both, and `saved_model_cli show --all`.
_FRESH = textwrap.dedent("""
    import contextlib, io, sys, numpy as np, tensorflow as tf
    work, *paths = sys.argv[1:]
    inputs = dict(np.load(f"{work}/inputs.npz"))
    result = {}
    for n, path in enumerate(paths):
        loaded = tf.saved_model.load(path)
        search, serve = loaded.signatures["search"], loaded.signatures["serving_default"]
        for tag in ("queries", "gallery", "gray"):
            found = search(images=tf.constant(inputs[tag]))
            # Strings as fixed-width bytes: np.load reads them back without pickle.
            result.update({f"{n}_{tag}_{k}": v.numpy().astype("S") if v.dtype == tf.string else v.numpy()
                           for k, v in found.items()})
            result[f"{n}_{tag}_served"] = serve(images=tf.constant(inputs[tag]))["embedding"].numpy()
    assert not any(m.split(".")[0] in ("tfdml", "scann") for m in sys.modules), "tfdml or scann was imported"
    np.savez(f"{work}/out.npz", **result)
    from tensorflow.python.tools.saved_model_cli import main
    sys.argv = ["saved_model_cli", "show", "--all", "--dir", paths[0]]
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
    work = tmp_path_factory.mktemp("fresh_search")
    rng = np.random.default_rng(1)
    inputs = {
        "queries": rng.integers(0, 256, (6, 17, 19, 3)).astype(np.uint8),
        "gallery": exported["images"],
        "gray": rng.integers(0, 256, (2, 15, 13, 1)).astype(np.uint8),
    }
    np.savez(work / "inputs.npz", **inputs)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PYTHONPATH="")
    paths = [exported["paths"][d] for d in ("float32", "bfloat16", "int8")]
    subprocess.run([sys.executable, "-c", _FRESH, str(work), *paths], check=True, cwd=str(work), env=env, timeout=300)
    with np.load(work / "out.npz", allow_pickle=False) as loaded:
        outputs = dict(loaded)
    return inputs, outputs, (work / "cli.txt").read_text()


def brute_force(queries, gallery, k):
    """Top-k by cosine over the whole gallery in float64 (stable: the lower position first on ties)."""
    scores = np.asarray(queries, np.float64) @ np.asarray(gallery, np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def strings(values):
    return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b)(values)


def test_float32_scores_equal_brute_force_over_serving_default(exported, fresh):
    _, out, _ = fresh
    gallery = out["0_gallery_served"]  # serving_default embeddings of the whole gallery
    meta = E.load_metadata(exported["paths"]["float32"])
    threshold = meta["search"]["match_threshold"]
    for tag in ("queries", "gray"):
        expected_scores, positions = brute_force(out[f"0_{tag}_served"], gallery, K)
        np.testing.assert_allclose(out[f"0_{tag}_scores"], expected_scores, atol=1e-5)
        assert np.all(np.diff(out[f"0_{tag}_scores"], axis=1) <= 0)  # descending
        np.testing.assert_array_equal(
            strings(out[f"0_{tag}_ids"]), [[f"kitchen:{p}" for p in row] for row in positions]
        )
        np.testing.assert_array_equal(
            strings(out[f"0_{tag}_labels"]), np.asarray(CLASSES)[exported["labels"][positions]]
        )
        np.testing.assert_allclose(out[f"0_{tag}_embedding"], out[f"0_{tag}_served"], atol=1e-6)
        np.testing.assert_array_equal(out[f"0_{tag}_match"], out[f"0_{tag}_scores"] >= np.float32(threshold))
    assert out["0_queries_scores"].shape == (6, K) and out["0_queries_embedding"].shape == (6, 8)


def test_a_gallery_image_finds_itself_first_with_its_class_name(exported, fresh):
    _, out, _ = fresh
    np.testing.assert_allclose(out["0_gallery_scores"][:, 0], 1.0, atol=1e-5)
    assert strings(out["0_gallery_ids"][:, 0]).tolist() == [f"kitchen:{i}" for i in range(40)]
    assert strings(out["0_gallery_labels"][:, 0]).tolist() == [CLASSES[c] for c in exported["labels"]]


@pytest.mark.parametrize("n,dtype", [(1, "bfloat16"), (2, "int8")])
def test_compressed_gallery_scores_are_within_the_stated_bound(exported, fresh, n, dtype):
    """bfloat16 keeps 8 significant bits: |error| <= 2^-9 |q| |g| (~0.002 for unit vectors); int8 with
    per-row scale s = max|g| / 127: |error| <= s / 2 * ||q||_1. Both are stated in tfdml.export.search."""
    _, out, _ = fresh
    gallery = out[f"{n}_gallery_served"]
    queries = out[f"{n}_queries_served"]
    if dtype == "bfloat16":
        bound = np.full((len(queries), len(gallery)), 2.0**-9)
    else:
        scales = np.abs(gallery).max(axis=1) / 127
        bound = np.abs(queries).sum(axis=1)[:, None] * scales[None, :] / 2
    exact = queries.astype(np.float64) @ gallery.T.astype(np.float64)
    positions = np.array([[int(i.decode().split(":")[1]) for i in row] for row in out[f"{n}_queries_ids"]])
    got = out[f"{n}_queries_scores"]
    slack = 1e-5  # float32 accumulation
    # Each returned score is its item's exact cosine within the bound ...
    assert np.all(
        np.abs(got - np.take_along_axis(exact, positions, 1)) <= np.take_along_axis(bound, positions, 1) + slack
    )
    # ... and the returned list is the exact top-k list within the largest bound (a k-th score can move by
    # at most that much), not an arbitrary one.
    expected, _ = brute_force(queries, gallery, K)
    assert np.all(np.abs(got - expected) <= bound.max() + slack)
    assert np.abs(got - expected).max() > 0 or dtype == "float32"  # really compressed
    # The same values as a brute force over the stored gallery, rebuilt in NumPy from the module docstring's
    # definition (not by `quantize`, which is under test).
    np.testing.assert_allclose(got, brute_force(queries, _stored_gallery(gallery, dtype), K)[0], atol=1e-5)


def _stored_gallery(gallery, dtype):
    """The gallery as the signature stores it, in float64: bfloat16 keeps the top 16 bits of each float32,
    rounded to nearest (ties to even); int8 is symmetric per row, `round(x / s)` with `s = max|x| / 127`."""
    gallery = np.asarray(gallery, np.float32)
    if dtype == "float32":
        return gallery.astype(np.float64)
    if dtype == "bfloat16":
        bits = gallery.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    scale = np.abs(gallery).max(axis=1, keepdims=True).astype(np.float64) / 127
    return np.round(gallery / scale) * scale


def test_stored_gallery_reference_matches_known_values():
    """The reference itself, on values whose storage is known by hand."""
    bf16 = _stored_gallery(np.array([[1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.140625]], np.float32), "bfloat16")
    np.testing.assert_array_equal(bf16, [[1.0, 1.0, 1.0 + 2**-6, 3.140625]])  # ties to even, exact stays
    int8 = _stored_gallery(np.array([[254.0, -127.0, 0.9]], np.float32), "int8")
    np.testing.assert_allclose(int8, [[254.0, -128.0, 0.0]])  # s = 2: 0.9 / 2 rounds to 0


def test_saved_model_cli_lists_the_search_signature(fresh):
    text = fresh[2]
    search = text[text.index("signature_def['search']") :]
    search = search[: search.index("Method name is")]
    assert "inputs['images'] tensor_info:\n        dtype: DT_UINT8\n        shape: (-1, -1, -1, -1)" in search
    for name, dtype, width in (
        ("scores", "DT_FLOAT", K),
        ("labels", "DT_STRING", K),
        ("ids", "DT_STRING", K),
        ("match", "DT_BOOL", K),
        ("embedding", "DT_FLOAT", 8),
    ):
        assert f"outputs['{name}'] tensor_info:\n        dtype: {dtype}\n        shape: (-1, {width})" in search, name


def test_metadata_records_the_search_and_the_calibration(exported, fresh):
    _, out, _ = fresh
    meta = E.load_metadata(exported["paths"]["float32"])
    assert meta["signatures"]["search"]["outputs"]["labels"] == f"string [batch, {K}]"
    search = meta["search"]
    assert {k: search[k] for k in ("top_k", "gallery_size", "gallery_dtype", "gallery_bytes", "block_rows")} == {
        "top_k": K,
        "gallery_size": 40,
        "gallery_dtype": "float32",
        "gallery_bytes": 40 * 8 * 4,
        "block_rows": 7,
    }
    assert E.load_metadata(exported["paths"]["int8"])["search"]["gallery_bytes"] == 40 * 8 + 40 * 4
    # The threshold is the calibration of the gallery's own served embeddings (leave-one-out) at 0.99 ...
    cal = calibrate(out["0_gallery_served"], exported["labels"], target_precision=0.99)
    assert cal.reached and 0 < cal.recall < 1
    assert search["match_threshold"] == pytest.approx(cal.threshold, abs=1e-6)
    assert meta["calibration"]["target_precision"] == 0.99
    assert [row["target_precision"] for row in meta["calibration"]["thresholds"]] == [0.5, 0.8, 0.9, 0.95, 0.99]
    # ... and it gives at least that precision on those pairs: the second neighbour of a gallery image is its
    # leave-one-out top-1 (the first is itself).
    second = np.array([int(i.decode().split(":")[1]) for i in out["0_gallery_ids"][:, 1]])
    accepted = out["0_gallery_scores"][:, 1] >= search["match_threshold"]
    assert accepted.any() and (exported["labels"][second][accepted] == exported["labels"][accepted]).mean() >= 0.99


def test_exported_embedder_search_and_the_rest_body(exported):
    embedder = E.ExportedEmbedder(exported["paths"]["float32"])
    found = embedder.search([exported["images"][3], exported["images"][7]])
    assert found["ids"][:, 0].tolist() == ["kitchen:3", "kitchen:7"]
    assert found["labels"][:, 0].tolist() == [CLASSES[3], CLASSES[2]]
    body = E.rest_request_body(exported["images"][:2], signature_name=E.SEARCH_SIGNATURE)
    signature = tf.saved_model.load(exported["paths"]["float32"]).signatures["search"]
    assert list(body["inputs"]) == list(signature.structured_input_signature[1]) == ["images"]
    assert body["signature_name"] == "search"
    json.dumps(body)


def test_no_search_no_labels_and_bad_settings(tmp_path):
    model = tiny_model()
    images, labels = gallery_images()
    plain = E.export_saved_model(model, tmp_path, name="m", gallery=images[:6], search=False)
    assert set(tf.saved_model.load(plain).signatures) == {"serving_default", "embed_preprocessed"}
    assert "search" not in E.load_metadata(plain) and "search" not in E.load_metadata(plain)["signatures"]
    with pytest.raises(ValueError, match="has no 'search' signature"):
        E.ExportedEmbedder(plain).search(images[:1])
    # No labels: nothing can be calibrated, so nothing is a match; a gallery smaller than top_k returns all.
    unlabelled = E.export_saved_model(model, tmp_path, name="m", gallery=images[:6], top_k=10)
    found = E.ExportedEmbedder(unlabelled).search(images[:2])
    assert found["scores"].shape == (2, 6) and not found["match"].any()
    assert found["ids"][:, 0].tolist() == ["0", "1"] and set(found["labels"].ravel()) == {""}
    meta = E.load_metadata(unlabelled)
    assert meta["search"]["match_threshold"] is None and "uncalibrated" in meta["search"]["match"]
    for bad, message in (
        ({"gallery_dtype": "fp8"}, "gallery_dtype must be one of float32, bfloat16, int8"),
        ({"top_k": 0}, "top_k must be a positive integer"),
        ({"match_precision": 0}, r"match_precision must be in \(0, 1\]"),
    ):
        with pytest.raises(ValueError, match=message):
            E.export_saved_model(model, tmp_path, name="bad", gallery=images[:3], **bad)
    assert not os.path.exists(tmp_path / "bad" / "1")


@pytest.mark.parametrize("block_rows", [1, 3, 7, 50])
def test_blocked_top_k_equals_one_top_k(block_rows):
    rng = np.random.default_rng(block_rows)
    gallery = rng.normal(size=(23, 6)).astype(np.float32)
    gallery[10] = gallery[4]  # a tie: the lower position comes first, as in one top_k over all rows
    queries = np.concatenate([rng.normal(size=(3, 6)), gallery[4:5]]).astype(np.float32)
    for k in (1, 4, 23):
        scores, positions = tf.function(lambda q, k=k: blocked_top_k(q, tf.constant(gallery), k, block_rows))(queries)
        expected, order = brute_force(queries, gallery, k)
        np.testing.assert_allclose(scores.numpy(), expected, atol=1e-5)
        np.testing.assert_array_equal(positions.numpy(), order)
    with pytest.raises(ValueError, match="k must be in"):
        blocked_top_k(queries, tf.constant(gallery), 24, block_rows)
