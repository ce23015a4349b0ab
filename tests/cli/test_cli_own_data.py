"""The own-data path as the README tells it, end to end on generated images: `tfdml train --image-dir DIR`
(class halves) in one working directory, then `tfdml evaluate`, `tfdml export` and `tfdml search` on what it
wrote from another one. Tiny: 6 classes of 16 px images, one epoch of two steps.
"""

import json
import os

import numpy as np
import pytest
from PIL import Image

from tfdml import cli
from tfdml.config import ConfigError, load_config

pytestmark = pytest.mark.slow  # the tests share one `--image-dir` training run (about 12 s)

# A tiny model; data.classes_per_batch is left to the job (the default batch has 22 classes).
TINY = [
    f"--set={item}"
    for item in (
        "model.backbone=small_cnn",  # --image-dir's default is the pretrained EfficientNet-Lite0
        "model.widths=[4,4]",
        "model.embedding_dim=4",
        "data.image_size=16",
        "data.samples_per_class=2",
        "evaluation.ks=[1]",
        "evaluation.metrics=[recall,map@r]",
        "report.grid_queries=2",
        "report.grid_neighbours=2",
        "report.worst_queries=2",
    )
] + ["--epochs", "1", "--steps-per-epoch", "2"]


def _write_classes(root, counts):
    """`root/<class>/<i>.png`, 16 x 16 RGB, each class its own brightness band; `None` writes one
    undecodable file instead."""
    rng = np.random.default_rng(0)
    for label, (name, count) in enumerate(counts.items()):
        (root / name).mkdir(parents=True)
        if count is None:
            (root / name / "0.png").write_bytes(b"not an image")
            continue
        for i in range(count):
            pixels = rng.integers(0, 40, size=(16, 16, 3)) + 35 * label
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """`tfdml train --image-dir ../data/mydata` run in `work/`; gnu's only file is undecodable (class
    dropped) and fox, in the evaluation half, has a single image."""
    base = tmp_path_factory.mktemp("own_data")
    _write_classes(base / "data" / "mydata", {"ant": 4, "bee": 4, "cat": 4, "dog": 4, "eel": 3, "fox": 1, "gnu": None})
    (base / "work").mkdir()
    (base / "elsewhere").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(base / "work")
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["train", "--image-dir", os.path.join("..", "data", "mydata"), *TINY])
    assert rc == 0, err.getvalue()
    return {"base": base, "work": base / "work", "out": out.getvalue(), "err": err.getvalue()}


def _metrics(job):
    with open(job["work"] / "reports" / "mydata" / "metrics.json") as f:
        return json.load(f)


def test_train_splits_the_classes_fits_the_batch_and_says_what_it_left_out(job):
    summary = _metrics(job)
    assert summary["name"] == "mydata"
    # second half of the 6 readable classes: dog (4), eel (3), fox (1)
    assert (summary["eval_classes"], summary["eval_items"]) == (3, 8)
    # 3 training classes, fewer than the default batch's 22: the job says so in one line and uses 3
    notice = [line for line in job["out"].splitlines() if line.startswith("data.classes_per_batch:")]
    assert (
        len(notice) == 1 and "has 3 classes, fewer than the default 22: training on batches of 3 classes" in notice[0]
    ), job["out"]
    config = load_config(str(job["work"] / "reports" / "mydata" / "config.yaml"))
    assert config.data.classes_per_batch == 3
    # the evaluation data is recorded with absolute paths
    assert config.data.path == str(job["base"] / "data" / "mydata") and config.data.eval_path is None
    # classes named by folder: the dropped one and the single-image evaluation class
    assert "gnu (1 file, none decodable)" in job["err"] and "left out" in job["err"]
    assert "single image" in job["err"] and ": fox" in job["err"]
    assert "Traceback" not in job["err"]


def test_evaluate_export_and_search_from_another_directory(job, monkeypatch, capsys):
    monkeypatch.chdir(job["base"] / "elsewhere")
    export = str(job["work"] / "exported_models" / "mydata")
    # evaluate finds the job's evaluation half through the export's metadata and reproduces its figures
    assert (
        cli.main(["evaluate", "--model", export, "--ks", "1", "--metrics", "recall", "map@r", "--json", "e.json"]) == 0
    ), capsys.readouterr().err
    captured = capsys.readouterr()
    assert "second half of the classes: 8 images, 3 classes" in captured.out
    with open("e.json") as f:
        assert json.load(f) == pytest.approx(_metrics(job)["model"], abs=1e-5)

    # export from the report folder: named after the job, with the index of the evaluation half
    model_file = str(job["work"] / "reports" / "mydata" / "model.keras")
    assert cli.main(["export", "--model", model_file, "--base-dir", "again"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "ScaNN index of 8 images" in out and "3 classes" in out
    with open(os.path.join("again", "mydata", "1", "tfdml_metadata.json")) as f:
        assert json.load(f)["index"]["size"] == 8

    # search with that index: a gallery image finds itself, by absolute path, in its class
    query = str(job["base"] / "data" / "mydata" / "dog" / "0.png")
    assert (
        cli.main(
            [
                "search",
                "--model",
                os.path.join("again", "mydata"),
                query,
                "--query-label",
                "dog",
                "-k",
                "2",
                "--json",
                "s.json",
            ]
        )
        == 0
    ), capsys.readouterr().err
    with open("s.json") as f:
        first = json.load(f)[0]["neighbours"][0]
    assert (first["id"], first["class"], first["same_class"]) == (query, "dog", True)


def test_a_chosen_batch_larger_than_the_data_is_refused(job, monkeypatch, capsys):
    monkeypatch.chdir(job["base"] / "elsewhere")
    assert (
        cli.main(
            [
                "train",
                "--image-dir",
                str(job["base"] / "data" / "mydata"),
                *TINY,
                "--set",
                "data.classes_per_batch=22",
                "--report-dir",
                "r22",
            ]
        )
        == 2
    )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tfdml train: error: ")]
    assert len(errors) == 1 and "data.classes_per_batch: 22 classes per batch, but the training data" in errors[0]
    assert "has 3 usable class(es) (ant, bee, cat)" in errors[0]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data.samples_per_class=1"], "data.samples_per_class"),
        (["loss.name=triplet", "data.samples_per_class=1"], "data.samples_per_class"),
        (
            [
                "ala.enabled=true",
                "loss.name=triplet",
                "ala.episode.samples_per_class=1",
                "ala.episode.train_size=6",
                "ala.episode.val_size=4",
            ],
            "ala.episode.samples_per_class",
        ),
    ],
)
def test_batches_without_a_positive_pair_are_refused(overrides, key):
    with pytest.raises(ConfigError, match=f"^{key}: .* at least 2 per class .* no positive pair"):
        load_config(overrides=overrides)


def test_one_image_per_class_is_fine_for_proxy_losses():
    assert load_config(overrides=["loss.name=proxy_anchor", "data.samples_per_class=1"]).data.samples_per_class == 1


@pytest.mark.parametrize("name", ["normalized_softmax", "proxy_anchor", "arcface"])
def test_a_proxy_loss_named_on_the_command_line_gets_a_proxy_per_training_class(name):
    """`--set loss.name=normalized_softmax` alone: the job gives the loss a proxy for each class id up to the
    training data's largest and the embedding's width (it failed with a TypeError while building the loss); a caller of
    `build_loss` without the job is told which argument is missing."""
    from tfdml import pipeline, recipes
    from tfdml.data import glyphs

    config = load_config(overrides=[f"loss.name={name}"])
    source = glyphs("train", image_size=8, images_per_class=2)
    fitted = pipeline.fit_to_data(config, source)
    classes = int(source.labels.max()) + 1  # every class id below it (the glyphs' training ids are not 0-149)
    assert fitted.loss.params["num_classes"] == classes and classes >= 150
    loss = recipes.build_loss(fitted.loss, embedding_dim=64)
    assert (loss.num_classes, loss.embedding_dim) == (classes, 64)
    kept = pipeline.fit_to_data(load_config(overrides=[f"loss.name={name}", "loss.params.num_classes=400"]), source)
    assert kept.loss.params["num_classes"] == 400
    with pytest.raises(ConfigError, match=f"loss.params.num_classes: {name} learns one proxy per training class"):
        recipes.build_loss(config.loss, embedding_dim=64)
