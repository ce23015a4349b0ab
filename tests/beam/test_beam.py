"""`tfdml embed` on Beam's DirectRunner: one run over a folder of 3,000 small generated images, shared
by the tests, checked against independent computations: the export's serving signature on the same files
(`ExportedEmbedder`), one NumPy brute-force search over all the embeddings, and `tfdml.retrieval.evaluate`
(what `RetrievalEvaluation` computes) on them. Bad input: unreadable files are skipped, named and counted; a
rerun into the output folder is refused without --overwrite."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from tests import embed_checks as checks

pytest.importorskip("apache_beam", reason='the Beam tests need the beam extra: pip install -e ".[beam]"')

from tfdml.beam import EmbedJob, read_shard, run_embed, shard_records  # noqa: E402
from tfdml.cli import main  # noqa: E402
from tfdml.retrieval import evaluate  # noqa: E402
from tfdml.retrieval.sharded import ShardedIndex  # noqa: E402

pytestmark = pytest.mark.slow  # the tests share one Beam run over 3,000 images

CLASSES, PER_CLASS = 60, 50


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("beam")
    paths, version = checks.prepare(root, CLASSES, PER_CLASS)
    output = root / "embeddings"
    status = main(
        ["embed", "--model", version, "--image-dir", str(root / "images"), "--output", str(output)]
        + ["--num-shards", "3", "--index-mode", "exact", "--evaluate", "--ks", "1", "2", "4"]
    )
    assert status == 0
    return checks.read_output(root, version, output, paths)


def test_embeddings_are_the_serving_signatures(run):
    """Every readable image once, with the class of its folder and the embedding the export serves."""
    checks.check_served(run, atol=1e-6)


def test_unreadable_images_are_skipped_named_and_counted(run):
    manifest = checks.check_skipped(run)
    assert manifest["embedded"] == len(run["paths"]) == CLASSES * PER_CLASS
    assert sum(record["rows"] for record in manifest["shards"]) == manifest["embedded"]
    assert len(manifest["shards"]) == 3


def test_rerun_into_the_output_is_refused(run, capsys):
    before = sorted(os.listdir(run["output"]))
    status = main(
        ["embed", "--model", run["version"], "--image-dir", str(run["root"] / "images")]
        + [
            "--output",
            str(run["output"]),
        ]
    )
    assert status == 2
    assert "--overwrite" in capsys.readouterr().err
    assert sorted(os.listdir(run["output"])) == before


def _brute_force(queries, gallery, k):
    scores = queries @ gallery.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, 1)


def test_sharded_search_equals_one_brute_force_search(run):
    index = ShardedIndex.load(sorted((run["output"] / "indexes").iterdir()))
    queries = np.random.default_rng(1).normal(size=(64, run["embeddings"].shape[1])).astype(np.float32)
    ids, scores = index.search(queries, k=10)
    rows, expected = _brute_force(queries, run["embeddings"], 10)
    np.testing.assert_array_equal(ids, run["ids"][rows])
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
    assert index.loads == 3  # one shard index in memory at a time


def test_sharded_evaluation_equals_evaluate(run):
    measured = json.loads((run["output"] / "evaluation.json").read_text())
    names, labels = np.unique(run["classes"], return_inverse=True)
    expected = evaluate(
        run["embeddings"], labels, ks=(1, 2, 4), metrics=("recall", "map@r", "r_precision"), distance="dot_product"
    )
    assert measured.pop("queries") == len(labels)
    assert measured.keys() == expected.keys()
    # Float rounding: ScaNN and TensorFlow sum the dot products in other orders (~1e-7 apart), and these flat-
    # colour images embed close together, so two neighbours within ~1e-7 of each other may swap. Of the same
    # class it changes nothing; of different classes (the closest such pair in the top 5 is 3e-7 apart on the
    # development machine) it could move one query's Recall@K (1/3,000 = 3.3e-4) or, deep in a list, its
    # average precision (MAP@R by 1e-5 or less). A wrong merge moves many queries.
    for key, value in expected.items():
        assert measured[key] == pytest.approx(value, abs=1e-3 if key.startswith("recall") else 1e-4), key
    assert 0.1 < expected["map@r"] < 0.99  # the classes cluster, but not trivially: the lists matter


def test_tfrecords_to_parquet_and_overwrite(run, tmp_path):
    """TFRecord input (a damaged record skipped and counted), Parquet output, the same embeddings as the
    folder run; a rerun with overwrite replaces the folder."""
    import tensorflow as tf

    chosen = [str(p) for p in run["ids"][:30]]
    records = tmp_path / "images.tfrecord"
    with tf.io.TFRecordWriter(str(records)) as writer:
        for path in chosen:
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[Path(path).read_bytes()])),
                "id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[path.encode()])),
                "class": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"c"])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        writer.write(b"\x00 damaged record")
    job = dict(model=run["version"], output=str(tmp_path / "out"), tfrecords=str(records), file_format="parquet")
    run_embed(EmbedJob(**job, num_shards=2), say=lambda text: None)
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_embed(EmbedJob(**job, num_shards=1), say=lambda text: None)
    manifest = run_embed(EmbedJob(**job, num_shards=1, overwrite=True), say=lambda text: None)
    assert (manifest["embedded"], manifest["skipped"], len(manifest["shards"])) == (30, 1, 1)
    ids, classes, embeddings = read_shard(str(tmp_path / "out" / manifest["shards"][0]["file"]))
    assert sorted(os.listdir(tmp_path / "out")).count("embeddings-00000-of-00001.parquet") == 1
    position = {item: i for i, item in enumerate(run["ids"])}
    np.testing.assert_allclose(embeddings, run["embeddings"][[position[i] for i in ids]], rtol=1e-5, atol=1e-6)
    assert set(classes) == {"c"}


def test_bad_arguments_are_one_line_usage_errors(run, tmp_path, capsys):
    version = run["version"]
    cases = {
        ("--images", str(tmp_path / "nothing" / "*.png")): "no file matches",
        ("--image-dir", str(run["root"] / "images"), "--tfrecords", "x"): "exactly one of",
        ("--image-dir", str(tmp_path / "absent")): "no such folder",
    }
    for arguments, message in cases.items():
        status = main(["embed", "--model", version, *arguments, "--output", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip()
        assert status == 2 and err.startswith("tfdml embed: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_a_damaged_shard_or_index_is_named_before_it_is_read(run, tmp_path):
    """Each shard's record holds its files' sizes and sha256: a bit flipped, or a file cut short, in a drawn
    shard or index file of the output is named before the evaluation reads anything."""
    import shutil

    from tests.fault_shim import damage
    from tfdml.beam import evaluate_output
    from tfdml.durable import DamagedFileError

    records = shard_records(str(run["output"]))
    files = sorted(name for record in records for name in record["files"])
    assert {record["file"] for record in records} < set(files)
    assert any(name.startswith("indexes/shard-00002/") for name in files)
    rng = np.random.default_rng(0)
    for draw in range(3):
        copy = tmp_path / str(draw)
        shutil.copytree(run["output"], copy)
        damaged = copy / files[int(rng.integers(len(files)))]
        damage(damaged, rng)
        with pytest.raises(DamagedFileError, match=f"^{re.escape(str(damaged))} (differs|holds)"):
            evaluate_output(str(copy), ks=(1,))


def test_a_full_disk_during_embed_is_one_line_and_the_rerun_finishes(run, tmp_path, monkeypatch, capsys):
    """The disk fills up, fails or turns read-only after a drawn number of the run's bytes: one line (exit
    status 2), no output folder and no staging folder left; the same command then writes what a run without
    the fault writes."""
    from tests.fault_shim import CODES, KIND, DiskShim

    images = tmp_path / "images"
    checks.write_images(images, np.random.default_rng(3), classes=4, per_class=6)
    command = ["embed", "--model", run["version"], "--image-dir", str(images), "--num-shards", "2"]
    with monkeypatch.context() as patch:
        measured = DiskShim().install(patch)
        assert main([*command, "--output", str(tmp_path / "measured")]) == 0
    capsys.readouterr()
    rng = np.random.default_rng(0)
    for draw in range(2):
        output = tmp_path / f"out{draw}"
        budget, code = int(rng.integers(0, measured.written)), int(CODES[draw])
        with monkeypatch.context() as patch:
            shim = DiskShim(budget, code).install(patch)
            assert main([*command, "--output", str(output)]) == 2, (budget, code)
        err = capsys.readouterr().err
        assert shim.failed is not None and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"tfdml embed: error: cannot write {output}: ") and KIND[code] in err, err
        assert not output.exists() and not list(tmp_path.glob(".tmp-embed-*"))
        assert main([*command, "--output", str(output)]) == 0
        assert [record["files"] for record in shard_records(str(output))] == [
            record["files"] for record in shard_records(str(tmp_path / "measured"))
        ]
