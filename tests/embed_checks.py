"""What the tests of `tfdml embed` share, whatever the engine (Beam's `tests/beam/test_beam.py`, Ray's
`tests/ray/test_ray_embed.py`): a folder of generated images with two corrupt files, an export of a tiny
model, the output folder read back, and the checks against what no part of the pipeline computed (the
export's serving signature on the same files, the files that were written)."""

import json
import os

import keras
import numpy as np
from PIL import Image

from tfdml import export as E
from tfdml.catalogue.files import read_shard, shard_records

BAD = {"class_01/empty.png": b"", "class_04/garbage.jpg": b"not an image at all"}


def tiny_model():
    """Symmetric pixels and tanh: embeddings spread over the sphere (a ReLU model of flat colours puts them all
    within 1e-5 of one direction, where float rounding alone reorders neighbours)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(8, 3, activation="tanh")(inputs)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(12)(h), name="tiny")


def write_images(folder, rng, classes, per_class, sizes=(16, 20, 24)):
    """Images of a class share a colour (plus noise), so that classes cluster; `sizes` in turn in each class.
    Returns their paths."""
    paths = []
    for c in range(classes):
        os.makedirs(folder / f"class_{c:02d}")
        colour = rng.integers(0, 256, 3)
        for i in range(per_class):
            size = sizes[i % len(sizes)]
            pixels = np.clip(colour + rng.normal(0, 40, (size, size, 3)), 0, 255).astype(np.uint8)
            path = folder / f"class_{c:02d}" / f"{i:03d}.png"
            Image.fromarray(pixels).save(path)
            paths.append(str(path))
    return paths


def prepare(root, classes, per_class, sizes=(16, 20, 24)):
    """`(image paths, export version)`: the images under `root/images` (`BAD`'s corrupt files among them, not
    in the paths) and the tiny model exported under `root/exported`."""
    paths = write_images(root / "images", np.random.default_rng(0), classes, per_class, sizes)
    for name, data in BAD.items():
        (root / "images" / name).write_bytes(data)
    return paths, E.export_saved_model(tiny_model(), root / "exported", preprocess="symmetric")


def read_output(root, version, output, paths):
    """The run's record the tests read: its folders, and every shard's ids, classes and embeddings."""
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


def check_served(run, atol):
    """Every readable image exactly once, with the class of its folder and the embedding the export serves."""
    assert sorted(run["ids"]) == sorted(os.path.abspath(p) for p in run["paths"])
    assert all(cls == os.path.basename(os.path.dirname(i)) for i, cls in zip(run["ids"], run["classes"]))
    served = E.ExportedEmbedder(run["version"]).embed([E.read_image(path) for path in run["ids"]])
    np.testing.assert_allclose(run["embeddings"], served, rtol=1e-5, atol=atol)


def check_skipped(run):
    """The corrupt files are skipped, each named with its reason and counted; returns the manifest."""
    manifest = json.loads((run["output"] / "manifest.json").read_text())
    skipped = [json.loads(line) for line in (run["output"] / "skipped.jsonl").read_text().splitlines()]
    assert sorted(item["id"] for item in skipped) == sorted(str(run["root"] / "images" / name) for name in BAD)
    reasons = {os.path.basename(item["id"]): item["reason"] for item in skipped}
    assert reasons["empty.png"] == "empty file"
    assert "not recognised" in reasons["garbage.jpg"]
    assert manifest["skipped"] == len(BAD)
    return manifest
