"""`tfdml evaluate` and `tfdml search` subcommands (tfdml.cli.evaluate, tfdml.cli.search)."""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from matplotlib import image as mpimg

from tests import cli_process
from tfdml import data
from tfdml.cli import evaluate as evaluate_cli
from tfdml.cli import export as export_cli
from tfdml.cli import search as search_cli
from tfdml.export import export_index, export_saved_model, load_metadata
from tfdml.models.heads import L2Normalize
from tfdml.retrieval import embed_batches, evaluate


def parse(module, argv):
    parser = argparse.ArgumentParser(prog="tfdml")
    module.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


SIZE = 12  # digits are 8 x 8: the serving graph resizes them to 14 and crops 12, as evaluation does


def digits_model(seed=1, name="digits"):
    inputs = keras.Input((SIZE, SIZE, 1))
    h = keras.layers.Flatten()(inputs)
    h = keras.layers.Dense(16, kernel_initializer=keras.initializers.RandomNormal(seed=seed))(h)
    return keras.Model(inputs, keras.layers.UnitNormalization()(h), name=name)


def unit(pixels):
    return pixels / 255.0


@pytest.fixture(scope="module")
def exported_digits(tmp_path_factory):
    """Version 1 of model "digits" with the index of the digits 5-9 (an embedded data set), exported as
    `tfdml train` does: the evaluation source is the gallery, the job's data section is recorded."""
    base = tmp_path_factory.mktemp("models")
    model = digits_model()
    job = {"data": {"source": "digits", "eval_split": "test"}}
    export_saved_model(
        model,
        base,
        preprocess="unit",
        image_size=(SIZE, SIZE),
        training_config=job,
        gallery=data.digits("test"),
        index_mode="exact",
    )
    return model, base


def job_metrics(model, metrics=("recall", "map@r", "r_precision", "nmi", "f1")):
    """What the job reports: the Keras model on tfdml.data.eval_dataset batches of the evaluation source."""
    ds = data.eval_dataset(data.digits("test"), 256, image_size=SIZE, preprocess=unit)
    return evaluate(*embed_batches(model, ds), metrics=metrics)


def write_pngs(folder, images, names):
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for image, name in zip(images, names):
        paths.append(str(folder / name))
        tf.io.write_file(paths[-1], tf.io.encode_png(image))
    return paths


@pytest.mark.parametrize("module", [evaluate_cli, search_cli, export_cli])
def test_every_option_has_help(module):
    parser = argparse.ArgumentParser(prog="tfdml")
    sub = parser.add_subparsers(dest="command")
    command = module.register(sub)
    options = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
    assert options and all(a.help and len(a.help) > 15 for a in options)
    assert command.get_default("func") is module.run


def test_module_entry_point_help():
    out = subprocess.run(
        [sys.executable, "-m", "tfdml.cli.evaluate", "--help"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "--embeddings" in out and "--plot" in out and "Recall@K" in out


def test_evaluate_embeddings_file(tmp_path, capsys):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(6, 8))
    labels = rng.integers(0, 6, 150)
    emb = (centres[labels] + 0.7 * rng.normal(size=(150, 8))).astype(np.float32)
    np.savez(tmp_path / "emb.npz", embeddings=emb, labels=labels)
    args = parse(
        evaluate_cli,
        [
            "evaluate",
            "--embeddings",
            str(tmp_path / "emb.npz"),
            "--ks",
            "1",
            "4",
            "--json",
            str(tmp_path / "m.json"),
            "--plot",
            str(tmp_path / "r.png"),
        ],
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "m.json").read_text())
    assert written == pytest.approx(evaluate(emb, labels, ks=(1, 4)))
    assert re.search(rf"recall@1 +{written['recall@1']:.4f}\n", printed) and "map@r" in printed  # fractions
    assert "%" not in printed
    png = mpimg.imread(tmp_path / "r.png")
    assert png.ndim == 3 and png.shape[0] > 200 and png.shape[1] > 200


@pytest.mark.slow
def test_evaluate_on_the_export_reproduces_the_job(exported_digits, tmp_path, capsys):
    """`tfdml evaluate` on an export = the job's figures (same images, same preprocessing, same metrics)."""
    model, base = exported_digits
    expected = job_metrics(model)
    for extra in ([], ["--dataset", "digits"]):  # default: the evaluation data recorded by the job
        args = parse(
            evaluate_cli, ["evaluate", "--model", str(base / "digits"), *extra, "--json", str(tmp_path / "m.json")]
        )
        assert args.func(args) == 0
        assert json.loads((tmp_path / "m.json").read_text()) == pytest.approx(expected, abs=1e-6)
    printed = capsys.readouterr().out
    assert "on digits(test): 896 images, 5 classes" in printed
    assert re.search(rf"recall@1 +{expected['recall@1']:.4f}\n", printed)


def test_evaluate_reports_bad_arguments(tmp_path, capsys):
    args = parse(evaluate_cli, ["evaluate"])
    assert args.func(args) == 2
    assert "exactly one of --embeddings or --model" in capsys.readouterr().err
    np.savez(tmp_path / "bad.npz", embeddings=np.zeros((3, 2)))
    args = parse(evaluate_cli, ["evaluate", "--embeddings", str(tmp_path / "bad.npz")])
    assert args.func(args) == 2
    assert "lacks arrays ['labels']" in capsys.readouterr().err


@pytest.mark.slow
def test_search_with_index_writes_json_and_grid(exported_digits, tmp_path, capsys):
    _, base = exported_digits
    source = data.digits("test")
    images, labels = source.images, source.labels
    paths = write_pngs(tmp_path / "gallery", images[:40], [f"{labels[i]}_{i}.png" for i in range(40)])
    other = tmp_path / "other"
    export_saved_model(digits_model(), other, preprocess="unit")  # version 1 of the same name elsewhere
    export_index(paths, other, "digits", labels=labels[:40])
    argv = [
        "search",
        "--model",
        str(other / "digits"),
        paths[3],
        paths[7],
        "-k",
        "4",
        "--query-label",
        str(labels[3]),
        "--query-label",
        str(labels[7]),
        "--json",
        str(tmp_path / "n.json"),
        "--grid",
        str(tmp_path / "g.png"),
    ]
    args = parse(search_cli, argv)
    assert args.func(args) == 0
    report = json.loads((tmp_path / "n.json").read_text())
    assert [r["query"] for r in report] == [paths[3], paths[7]]
    for entry, q in zip(report, (3, 7)):
        first = entry["neighbours"][0]
        assert first["id"] == os.path.abspath(paths[q]) and first["score"] == pytest.approx(1.0, abs=1e-5)
        assert first["label"] == labels[q] and first["same_class"] and len(entry["neighbours"]) == 4
        scores = [n["score"] for n in entry["neighbours"]]
        assert scores == sorted(scores, reverse=True)
    grid = mpimg.imread(tmp_path / "g.png")
    assert grid.shape[1] > grid.shape[0] > 100  # 2 rows x 5 columns
    out = capsys.readouterr().out
    assert "retrieval grid written" in out and f"1. {os.path.abspath(paths[3])}  class {labels[3]}" in out
    args = parse(search_cli, argv[:3] + [paths[0], "--query-label", "1", "--query-label", "2"])
    assert args.func(args) == 2
    assert "2 --query-label for 1 query images: give one --query-label CLASS per image" in capsys.readouterr().err
    # a label option before the images takes one value: the images stay queries (and the count is checked)
    args = parse(search_cli, ["search", "--model", str(other / "digits"), "--query-labels", "1", paths[0], paths[1]])
    assert args.queries == [paths[0], paths[1]] and args.query_labels == ["1"]
    assert args.func(args) == 2
    assert "1 --query-label for 2 query images" in capsys.readouterr().err


def test_search_an_embedded_gallery_prints_items_and_classes_and_draws_the_grid(exported_digits, tmp_path, capsys):
    _, base = exported_digits
    source = data.digits("test")
    query = write_pngs(tmp_path, source.images[[0]], ["q.png"])[0]
    args = parse(
        search_cli,
        [
            "search",
            "--model",
            str(base / "digits"),
            query,
            "-k",
            "3",
            "--query-label",
            str(source.labels[0]),
            "--grid",
            str(tmp_path / "grid.png"),
        ],
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"  1. item 0  class {source.labels[0]}  score 1.0000" in out
    assert "gallery of 896 images" in out and "retrieval grid written" in out
    assert mpimg.imread(tmp_path / "grid.png").shape[0] > 100


def test_search_exact_answers_with_the_signature_as_the_index_does(exported_digits, tmp_path, capsys):
    """`--exact`: the version's search signature (no ScaNN) gives the exact index's neighbours and scores,
    with class names, ids `<data set>:<item>` and the calibrated match decision."""
    _, base = exported_digits
    source = data.digits("test")
    queries = write_pngs(tmp_path, source.images[[0, 9]], ["a.png", "b.png"])
    common = [
        "search",
        "--model",
        str(base / "digits"),
        *queries,
        "-k",
        "3",
        "--query-label",
        str(source.labels[0]),
        "--query-label",
        str(source.labels[9]),
    ]
    args = parse(search_cli, [*common, "--json", str(tmp_path / "scann.json")])
    assert args.func(args) == 0
    args = parse(
        search_cli, [*common, "--exact", "--json", str(tmp_path / "exact.json"), "--grid", str(tmp_path / "exact.png")]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "exact search signature (float32)" in out and "retrieval grid written" in out
    threshold = load_metadata(base / "digits")["search"]["match_threshold"]
    scann, exact = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("scann", "exact"))
    for a, b in zip(scann, exact):
        assert [f"digits(test):{n['id']}" for n in a["neighbours"]] == [n["id"] for n in b["neighbours"]]
        assert [n["score"] for n in a["neighbours"]] == pytest.approx([n["score"] for n in b["neighbours"]], abs=1e-5)
        assert [n["class"] for n in a["neighbours"]] == [n["class"] for n in b["neighbours"]]
        # The index names the gallery's classes only (digits 5-9), its labels numbering them from 0.
        assert [n["class"] for n in a["neighbours"]] == [str(n["label"] + 5) for n in a["neighbours"]]
        assert [n["same_class"] for n in a["neighbours"]] == [n["same_class"] for n in b["neighbours"]]
        assert [n["match"] for n in b["neighbours"]] == [n["score"] >= threshold for n in b["neighbours"]]
    assert exact[0]["neighbours"][0]["id"] == "digits(test):0" and exact[0]["neighbours"][0]["same_class"]
    assert mpimg.imread(tmp_path / "exact.png").shape[0] > 100
    args = parse(search_cli, ["search", "--model", str(base / "digits"), queries[0], "-k", "30", "--exact"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert "returns 10 neighbours" in captured.err and " 10. digits(test):" in captured.out
    assert " 11. " not in captured.out


@pytest.mark.slow
def test_search_old_version_uses_its_own_index(exported_digits, tmp_path, capsys):
    """`--version 1` after a newer export answers with version 1's gallery, or refuses a foreign index."""
    _, base = exported_digits
    source = data.digits("test")
    newer = base / "newer"
    shutil.copytree(base / "digits" / "1", newer / "digits" / "1")
    gallery = write_pngs(tmp_path / "g", source.images[100:110], [f"n{i}.png" for i in range(10)])
    v2 = export_saved_model(digits_model(seed=7), newer, name="digits", preprocess="unit", gallery=gallery)
    query = write_pngs(tmp_path, source.images[[5]], ["q.png"])[0]
    args = parse(
        search_cli,
        [
            "search",
            "--model",
            str(newer / "digits"),
            "--version",
            "1",
            query,
            "-k",
            "1",
            "--json",
            str(tmp_path / "s.json"),
        ],
    )
    assert args.func(args) == 0
    assert json.loads((tmp_path / "s.json").read_text())[0]["neighbours"][0]["id"] == 5
    assert "model digits version 1" in capsys.readouterr().out
    args = parse(
        search_cli,
        [
            "search",
            "--model",
            str(newer / "digits"),
            "--version",
            "1",
            query,
            "--index",
            os.path.join(v2, "assets.extra", "tfdml_index"),
        ],
    )
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "was built with version 2, not 1" in err and "neighbours would be wrong" in err


def test_corrupt_queries_are_skipped_and_named(exported_digits, tmp_path, capsys):
    _, base = exported_digits
    good = write_pngs(tmp_path, data.digits("test").images[[0]], ["good.png"])[0]
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    bad = [str(tmp_path / "empty.png"), str(tmp_path / "broken.jpg")]
    args = parse(search_cli, ["search", "--model", str(base / "digits"), bad[0], good, bad[1], "-k", "1"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert f"{good}:" in captured.out and "empty.png:" not in captured.out
    assert "skipped 2 of 3 images that cannot be decoded" in captured.err
    assert f"{bad[0]} (empty file)" in captured.err and bad[1] in captured.err
    assert "Traceback" not in captured.err
    args = parse(search_cli, ["search", "--model", str(base / "digits"), *bad])
    assert args.func(args) == 2
    assert "none of the 2 image files can be decoded" in capsys.readouterr().err


@pytest.mark.slow
def test_evaluate_and_export_an_image_folder_with_corrupt_files(tmp_path, capsys):
    """A report folder's model.keras: metadata filled from config.yaml / metrics.json; the gallery's
    undecodable files are skipped and named, in export and evaluate alike, with an accurate count."""
    source = data.digits("test")
    folder = tmp_path / "gallery"
    for c in range(5, 10):
        rows = np.flatnonzero(source.labels == c)[:6]
        write_pngs(folder / f"digit_{c}", source.images[rows], [f"{i}.png" for i in rows])
    (folder / "digit_5" / "zz_empty.png").write_bytes(b"")
    (folder / "digit_7" / "zz_cut.png").write_bytes(
        (folder / "digit_7" / os.listdir(folder / "digit_7")[0]).read_bytes()[:40]
    )
    report = tmp_path / "report"
    report.mkdir()
    digits_model(name="folder_model").save(report / "model.keras")
    (report / "config.yaml").write_text(f"data:\n  source: folder\n  eval_path: {folder}\n")
    (report / "metrics.json").write_text(json.dumps({"model": {"recall@1": 0.5}}))
    args = parse(
        export_cli,
        [
            "export",
            "--model",
            str(report / "model.keras"),
            "--name",
            "f",
            "--base-dir",
            str(tmp_path / "models"),
            "--gallery-dir",
            str(folder),
            "--top-k",
            "3",
            "--gallery-dtype",
            "int8",
            "--match-precision",
            "0.8",
        ],
    )
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert "search signature: top 3 of 30 items (int8), match: " in captured.out
    assert "skipped 2 of 32 images that cannot be decoded" in captured.err
    assert "zz_empty.png (empty file)" in captured.err and "zz_cut.png" in captured.err
    assert re.search(r"ScaNN index of 30 images of image_folder\(.*gallery\), 5 classes", captured.out)
    metadata = load_metadata(tmp_path / "models" / "f")
    assert metadata["training_config"]["data"]["source"] == "folder"
    assert metadata["metrics"] == {"recall@1": 0.5} and metadata["index"]["size"] == 30
    assert None not in metadata.values()
    assert {k: metadata["search"][k] for k in ("top_k", "gallery_dtype", "match_precision")} == {
        "top_k": 3,
        "gallery_dtype": "int8",
        "match_precision": 0.8,
    }
    assert tf.saved_model.load(os.path.join(tmp_path, "models", "f", "1")).signatures["search"].structured_outputs[
        "ids"
    ].shape.as_list() == [None, 3]
    # Without --gallery-dir, a report's model is indexed on the job's evaluation data (config.yaml);
    # --no-search leaves the signature out.
    args = parse(
        export_cli,
        [
            "export",
            "--model",
            str(report / "model.keras"),
            "--name",
            "f",
            "--base-dir",
            str(tmp_path / "models"),
            "--no-search",
        ],
    )
    assert args.func(args) == 0
    assert load_metadata(tmp_path / "models" / "f", version=2)["index"]["size"] == 30
    assert "search" not in load_metadata(tmp_path / "models" / "f", version=2)
    assert "skipped 2 of 32 images" in capsys.readouterr().err
    worst = tmp_path / "worst"
    args = parse(
        evaluate_cli,
        ["evaluate", "--model", str(tmp_path / "models" / "f"), "--metrics", "recall", "--worst-queries", str(worst)],
    )
    assert args.func(args) == 0  # the job's evaluation folder, recorded in the metadata
    captured = capsys.readouterr()
    assert "skipped 2 of 32 images" in captured.err and "30 images, 5 classes" in captured.out
    # the worst queries' page leads to each query's file, relative to the folder, under its own class
    page = (worst / "worst_queries.html").read_text(encoding="utf-8")
    queries = re.findall(r'class="item the-query">.*?<bdi>(.*?)</bdi>.*?class="file" dir="ltr">(.*?)</span>', page)
    assert len(queries) == 12 and "zz_" not in page
    for name, file in queries:
        file = file.replace("<wbr>", "")
        assert name.replace("<wbr>", "") == file.split("/")[0] and (folder / file).is_file(), (name, file)


@pytest.mark.slow
def test_exported_index_names_only_the_classes_of_its_gallery(tmp_path):
    """A gallery that leaves classes out (the training half of a job's folder, a class folder
    without a readable image) is exported with the names of its own classes only, each item's label naming
    its folder: in the index (the real `tfdml export`, in a subprocess), its metadata and the search signature."""
    source = data.digits("test")
    folder = tmp_path / "images"
    for name, digit in zip("01235", range(5, 10)):  # class folders named by numbers, "4" left out
        rows = np.flatnonzero(source.labels == digit)[:4]
        write_pngs(folder / name, source.images[rows], [f"{i}.png" for i in rows])
    (folder / "4").mkdir()
    (folder / "4" / "broken.png").write_bytes(b"")  # a class folder left out: nothing in it decodes
    report = tmp_path / "report"
    report.mkdir()
    # A tfdml layer in the model: the fresh process finds it registered by `import tfdml`'s hook alone.
    inputs = keras.Input((SIZE, SIZE, 1))
    dense = keras.layers.Dense(16, kernel_initializer=keras.initializers.RandomNormal(seed=1))
    model = keras.Model(inputs, L2Normalize()(dense(keras.layers.Flatten()(inputs))), name="halves")
    model.save(report / "model.keras")
    (report / "config.yaml").write_text(f"name: halves\ndata:\n  source: folder\n  path: {folder}\n")
    # No eval_path: the job evaluated the second half of the classes with images (2, 3, 5), the gallery.
    done = subprocess.run(
        [sys.executable, "-m", "tfdml", "export", "--model", str(report / "model.keras"), "--base-dir", "models"],
        cwd=tmp_path,
        env=cli_process.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"ScaNN index of 12 images of .*, 3 classes", done.stdout), done.stdout
    version = tmp_path / "models" / "halves" / "1"
    index_dir = version / "assets.extra" / "tfdml_index"
    stored = json.loads((index_dir / "tfdml_index.json").read_text())
    labels = np.load(index_dir / "labels.npy")
    ids = np.load(index_dir / "ids.npy")
    assert stored["class_names"] == ["2", "3", "5"]
    assert sorted(set(labels.tolist())) == [0, 1, 2]
    assert [stored["class_names"][label] for label in labels] == [os.path.basename(os.path.dirname(i)) for i in ids]
    assert load_metadata(version)["index"]["classes"] == 3
    # The search signature answers each gallery image with its own item, labelled with its folder's name.
    search = tf.saved_model.load(str(version)).signatures["search"]
    images = np.stack([np.asarray(tf.io.decode_png(tf.io.read_file(i), channels=1)) for i in ids.tolist()])
    found = search(images=tf.constant(images))
    top_ids = [i.decode() for i in found["ids"].numpy()[:, 0]]
    top_labels = [label.decode() for label in found["labels"].numpy()[:, 0]]
    assert set(top_labels) == {"2", "3", "5"}
    assert top_labels == [os.path.basename(os.path.dirname(i)) for i in top_ids]
    # `--query-label 2` is class "2" (a stored name before a label number) for the index and the signature.
    query = str(ids[labels == 0][0])
    for exact in ([], ["--exact"]):
        argv = ["search", "--model", str(tmp_path / "models" / "halves"), query, "-k", "1", "--query-label", "2"]
        args = parse(search_cli, [*argv, *exact, "--json", str(tmp_path / "s.json")])
        assert args.func(args) == 0
        (neighbour,) = json.loads((tmp_path / "s.json").read_text())[0]["neighbours"]
        assert neighbour["class"] == "2" and neighbour["same_class"], (exact, neighbour)


def test_export_index_keeps_the_names_of_the_labelled_classes_only(tmp_path):
    """The Python API as the CLI: a Source whose class names cover classes it has no item of (a subset) is
    indexed with its own classes' names, labels renumbered in the same order."""
    source = data.digits("test")  # class names "0".."9", items of 5-9 only
    rows = np.flatnonzero(np.isin(source.labels, [6, 8]))[:10]
    gallery = source.subset(rows)
    export_saved_model(digits_model(), tmp_path, name="two", preprocess="unit", image_size=(SIZE, SIZE))
    index = export_index(gallery, tmp_path, "two", mode="exact")
    assert index.class_names == ["6", "8"]
    assert [index.class_name(p) for p in range(index.size)] == [str(label) for label in source.labels[rows]]


def test_export_takes_match_mode_and_target_recall_from_the_job_unless_given(tmp_path, monkeypatch):
    """`export.match_mode` and `export.target_recall` of a report's config.yaml are `tfdml export`'s
    defaults, as `top_k` is; the options override them (`--target-recall none`: unmeasured)."""
    source = data.digits("test")
    folder = tmp_path / "gallery"
    for c in range(5, 10):
        rows = np.flatnonzero(source.labels == c)[:2]
        write_pngs(folder / f"digit_{c}", source.images[rows], [f"{i}.png" for i in rows])
    report = tmp_path / "report"
    report.mkdir()
    digits_model(name="job_model").save(report / "model.keras")
    (report / "config.yaml").write_text("name: job\nexport:\n  match_mode: closed\n  target_recall: 0.8\n")
    given = {}

    def capture(model, **settings):
        given.update(settings)
        raise ValueError("captured")

    monkeypatch.setattr("tfdml.export.export_saved_model", capture)
    common = ["export", "--model", str(report / "model.keras"), "--base-dir", str(tmp_path / "m")]
    for options, mode, recall in (
        ([], "closed", 0.8),
        (["--match-mode", "open", "--target-recall", "none"], "open", None),
        (["--target-recall", "0.9"], "closed", 0.9),
    ):
        given.clear()
        args = parse(export_cli, [*common, "--gallery-dir", str(folder), *options])
        assert args.func(args) == 2  # the capture's stop
        assert given["match_mode"] == mode and given["index_settings"] == {"target_recall": recall}, options
    (report / "config.yaml").write_text("name: job\n")  # a job without the keys: the section's defaults
    args = parse(export_cli, [*common, "--gallery-dir", str(folder)])
    assert args.func(args) == 2
    assert given["match_mode"] == "auto" and given["index_settings"] == {"target_recall": 0.95}
