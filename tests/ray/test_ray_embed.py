"""`tfdml embed --engine ray` on a real two-node Ray cluster on 127.0.0.1 (no mocks): a folder of good and
corrupt images, every good image embedded exactly once (ids counted), equal to the export's serving
signature (`ExportedEmbedder`, independent of the pipeline) to 1e-5, the corrupt ones skipped and named, the
shard evaluation equal to `tfdml.retrieval.evaluate` on all the embeddings. Skips without the ray extra."""

import json
import os
from collections import Counter

import keras
import numpy as np
import pytest
from PIL import Image

from tests.ray_cluster import two_node_cluster  # before Ray: it sets what Ray reads when imported

pytest.importorskip("ray", reason='the Ray tests need the ray extra: pip install -e ".[ray]"')

pytestmark = pytest.mark.slow  # the tests share one two-node Ray cluster and its embed run

from tfdml import export as E  # noqa: E402
from tfdml.catalogue.files import read_shard, shard_records  # noqa: E402
from tfdml.cli import main  # noqa: E402
from tfdml.retrieval import evaluate  # noqa: E402

CLASSES, PER_CLASS, SIZES = 6, 10, (16, 20)
BAD = {"class_01/empty.png": b"", "class_04/garbage.jpg": b"not an image at all"}


def _model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(8, 3, activation="tanh")(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(12)(h), name="tiny")


def _write_images(folder, rng):
    paths = []
    for c in range(CLASSES):
        os.makedirs(folder / f"class_{c:02d}")
        colour = rng.integers(0, 256, 3)
        for i in range(PER_CLASS):
            size = SIZES[i % len(SIZES)]
            pixels = np.clip(colour + rng.normal(0, 40, (size, size, 3)), 0, 255).astype(np.uint8)
            path = folder / f"class_{c:02d}" / f"{i:03d}.png"
            Image.fromarray(pixels).save(path)
            paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    paths = _write_images(root / "images", np.random.default_rng(0))
    for name, data in BAD.items():
        (root / "images" / name).write_bytes(data)
    version = E.export_saved_model(_model(), root / "exported", preprocess="symmetric")
    output = root / "embeddings"
    with two_node_cluster() as cluster:
        status = main(
            ["embed", "--engine", "ray", "--address", cluster.address, "--actors", "2", "--actor-cpus", "0.25"]
            + ["--model", version, "--image-dir", str(root / "images"), "--output", str(output), "--batch-size", "8"]
            + ["--num-shards", "2", "--index-mode", "exact", "--evaluate", "--ks", "1", "2"]
        )
    assert status == 0
    shards = [read_shard(str(output / record["file"])) for record in shard_records(str(output))]
    return {
        "root": root,
        "version": version,
        "output": output,
        "paths": paths,
        "ids": np.concatenate([s[0] for s in shards]),
        "classes": np.concatenate([s[1] for s in shards]),
        "embeddings": np.concatenate([s[2] for s in shards]),
    }


def test_every_good_image_once_equal_to_the_serving_signature(run):
    counts = Counter(run["ids"].tolist())
    assert sorted(counts) == sorted(os.path.abspath(p) for p in run["paths"])
    assert set(counts.values()) == {1}
    assert all(cls == os.path.basename(os.path.dirname(i)) for i, cls in zip(run["ids"], run["classes"]))
    served = E.ExportedEmbedder(run["version"]).embed([E.read_image(path) for path in run["ids"]])
    np.testing.assert_allclose(run["embeddings"], served, rtol=1e-5, atol=1e-5)


def test_corrupt_images_are_skipped_and_named(run):
    manifest = json.loads((run["output"] / "manifest.json").read_text())
    skipped = [json.loads(line) for line in (run["output"] / "skipped.jsonl").read_text().splitlines()]
    assert sorted(item["id"] for item in skipped) == sorted(str(run["root"] / "images" / name) for name in BAD)
    reasons = {os.path.basename(item["id"]): item["reason"] for item in skipped}
    assert reasons["empty.png"] == "empty file"
    assert "not recognised" in reasons["garbage.jpg"]
    assert (manifest["engine"], manifest["skipped"], manifest["embedded"]) == ("ray", 2, CLASSES * PER_CLASS)
    assert [record["shard"] for record in manifest["shards"]] == [0, 1]


def test_sharded_evaluation_equals_evaluate(run):
    measured = json.loads((run["output"] / "evaluation.json").read_text())
    _, labels = np.unique(run["classes"], return_inverse=True)
    expected = evaluate(
        run["embeddings"], labels, ks=(1, 2), metrics=("recall", "map@r", "r_precision"), distance="dot_product"
    )
    assert measured.pop("queries") == len(labels)
    for key, value in expected.items():
        assert measured[key] == pytest.approx(value, abs=1e-6), key
