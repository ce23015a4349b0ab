"""`tfdml evaluate` and `tfdml search` subcommands (tfdml.cli.evaluate, tfdml.cli.search)."""

import argparse
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from matplotlib import image as mpimg

from tfdml.cli import evaluate as evaluate_cli
from tfdml.cli import search as search_cli
from tfdml.export import export_index, export_saved_model
from tfdml.retrieval import evaluate


def parse(module, argv):
    parser = argparse.ArgumentParser(prog="tfdml")
    module.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def digits_model():
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Flatten()(inputs)
    h = keras.layers.Dense(16, kernel_initializer=keras.initializers.RandomNormal(seed=1))(h)
    return keras.Model(inputs, keras.layers.UnitNormalization()(h), name="digits")


@pytest.fixture(scope="module")
def exported_digits(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    model = digits_model()
    export_saved_model(model, base, preprocess="unit")
    return model, base


@pytest.mark.parametrize("module", [evaluate_cli, search_cli])
def test_every_option_has_help(module):
    parser = argparse.ArgumentParser(prog="tfdml")
    sub = parser.add_subparsers(dest="command")
    command = module.register(sub)
    options = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
    assert options and all(a.help and len(a.help) > 15 for a in options)
    assert command.get_default("func") is module.run


def test_module_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "tfdml.cli.evaluate", "--help"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    assert "--embeddings" in out and "--plot" in out and "Recall@K" in out


def test_evaluate_embeddings_file(tmp_path, capsys):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(6, 8))
    labels = rng.integers(0, 6, 150)
    emb = (centres[labels] + 0.7 * rng.normal(size=(150, 8))).astype(np.float32)
    np.savez(tmp_path / "emb.npz", embeddings=emb, labels=labels)
    args = parse(evaluate_cli, ["evaluate", "--embeddings", str(tmp_path / "emb.npz"), "--ks", "1", "4",
                                "--json", str(tmp_path / "m.json"), "--plot", str(tmp_path / "r.png")])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "m.json").read_text())
    assert written == pytest.approx(evaluate(emb, labels, ks=(1, 4)))
    assert f"{100 * written['recall@1']:9.2f}" in printed and "map@r" in printed
    png = mpimg.imread(tmp_path / "r.png")
    assert png.ndim == 3 and png.shape[0] > 200 and png.shape[1] > 200


def test_evaluate_model_on_digits(exported_digits, tmp_path):
    model, base = exported_digits
    args = parse(evaluate_cli, ["evaluate", "--model", str(base / "digits"), "--dataset", "digits",
                                "--metrics", "recall", "map@r", "--json", str(tmp_path / "m.json")])
    assert args.func(args) == 0
    images, labels = evaluate_cli.load_digits_split()
    assert set(np.unique(labels)) == {5, 6, 7, 8, 9} and 850 < len(labels) < 950
    expected = evaluate(model(images.astype(np.float32) / 255.0).numpy(), labels, metrics=("recall", "map@r"))
    assert json.loads((tmp_path / "m.json").read_text()) == pytest.approx(expected, abs=1e-6)


def test_evaluate_reports_bad_arguments(tmp_path, capsys):
    args = parse(evaluate_cli, ["evaluate"])
    assert args.func(args) == 2
    assert "exactly one of --embeddings or --model" in capsys.readouterr().err
    np.savez(tmp_path / "bad.npz", embeddings=np.zeros((3, 2)))
    args = parse(evaluate_cli, ["evaluate", "--embeddings", str(tmp_path / "bad.npz")])
    assert args.func(args) == 2
    assert "lacks arrays ['labels']" in capsys.readouterr().err


def test_search_with_index_writes_json_and_grid(exported_digits, tmp_path, capsys):
    _, base = exported_digits
    images, labels = evaluate_cli.load_digits_split()
    paths = []
    for i in range(40):
        paths.append(str(tmp_path / f"{labels[i]}_{i}.png"))
        tf.io.write_file(paths[-1], tf.io.encode_png(images[i]))
    export_index(paths, base, "digits", labels=labels[:40])
    argv = ["search", "--model", str(base / "digits"), paths[3], paths[7], "-k", "4", "--query-labels",
            str(labels[3]), str(labels[7]), "--json", str(tmp_path / "n.json"), "--grid", str(tmp_path / "g.png")]
    args = parse(search_cli, argv)
    assert args.func(args) == 0
    report = json.loads((tmp_path / "n.json").read_text())
    assert [r["query"] for r in report] == [paths[3], paths[7]]
    for entry, q in zip(report, (3, 7)):
        first = entry["neighbours"][0]
        assert first["id"] == os.path.abspath(paths[q]) and first["score"] == pytest.approx(1.0, abs=1e-5)
        assert first["label"] == labels[q] and len(entry["neighbours"]) == 4
        scores = [n["score"] for n in entry["neighbours"]]
        assert scores == sorted(scores, reverse=True)
    grid = mpimg.imread(tmp_path / "g.png")
    assert grid.shape[1] > grid.shape[0] > 100  # 2 rows x 5 columns
    assert "retrieval grid written" in capsys.readouterr().out
    args = parse(search_cli, argv[:3] + [paths[0], "--query-labels", "1", "2"])
    assert args.func(args) == 2
    assert "--query-labels has 2 entries for 1 queries" in capsys.readouterr().err
