"""Callbacks: retrieval evaluation during fit, kill-and-resume checkpoints."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import ROOT
from tfdml.callbacks import RetrievalEvaluation
from tfdml.losses import RankedListLoss
from tfdml.models import MultiLevelEmbedder


def _reference_metrics(embeddings, labels, ks):
    """Loop-by-loop Recall@K, R-precision and MAP@R (Musgrave et al.) from their definitions."""
    n = len(labels)
    recalls = {k: [] for k in ks}
    map_r, r_prec = [], []
    for q in range(n):
        others = [j for j in range(n) if j != q]
        dist = [float(np.sum((embeddings[q] - embeddings[j]) ** 2)) for j in others]
        ranked = [others[i] for i in sorted(range(len(others)), key=lambda i: (dist[i], i))]
        rel = [labels[j] == labels[q] for j in ranked]
        r = sum(rel)
        if r == 0:
            continue
        for k in ks:
            recalls[k].append(any(rel[:k]))
        r_prec.append(sum(rel[:r]) / r)
        hits, ap = 0, 0.0
        for i in range(r):
            if rel[i]:
                hits += 1
                ap += hits / (i + 1)
        map_r.append(ap / r)
    out = {f"recall@{k}": float(np.mean(v)) for k, v in recalls.items()}
    out.update({"map@r": float(np.mean(map_r)), "r_precision": float(np.mean(r_prec))})
    return out


def test_retrieval_metrics_match_their_definitions():
    from tfdml.retrieval import evaluate

    rng = np.random.RandomState(0)
    labels = rng.randint(0, 5, 40)
    labels[-1] = 9  # a singleton class: no relevant item, skipped as a query
    embeddings = rng.randn(40, 6).astype("float32") + 0.8 * labels[:, None]
    ks = (1, 2, 4, 8)
    result = evaluate(embeddings, labels, ks=ks, metrics=("recall", "map@r", "r_precision"))
    for key, value in _reference_metrics(embeddings, labels, ks).items():
        np.testing.assert_allclose(result[key], value, rtol=1e-5, err_msg=key)


@pytest.mark.slow
def test_retrieval_evaluation_logs_every_n_epochs(tmp_path):
    keras.utils.set_random_seed(0)
    model = MultiLevelEmbedder("small_cnn", embedding_dim=4, input_shape=(16, 16, 1), head_filters=4, head_units=8)
    # uniform: the configuration these expected metrics were written for (inference embeddings lie ~0.01
    # apart after 5 epochs, so neighbour ties decide MAP@R; the callback is what is under test here)
    model.compile(keras.optimizers.Adam(1e-2), loss=RankedListLoss(query_weighting="uniform"))
    rng = np.random.RandomState(1)
    labels = np.repeat(np.arange(4), 5)
    images = (rng.rand(20, 16, 16, 1) + 0.2 * labels[:, None, None, None]).astype("float32")
    held_out = tf.data.Dataset.from_tensor_slices((images, labels)).batch(7)
    arrays = RetrievalEvaluation((images, labels), every_n_epochs=2, ks=(1, 4), prefix="val_")
    dataset = RetrievalEvaluation(held_out, every_n_epochs=3, ks=(1,), prefix="ds_", log_dir=str(tmp_path))
    history = model.fit(images, labels, batch_size=20, epochs=5, verbose=0, callbacks=[arrays, dataset])
    assert len(history.history["val_recall@1"]) == 3  # epochs 2, 4 and the last one (5)
    assert len(history.history["ds_recall@1"]) == 2  # epochs 3 and 5
    assert set(arrays.last_results) == {"recall@1", "recall@4", "map@r"}
    expected = _reference_metrics(model.predict(images, verbose=0), labels, ks=(1, 4))
    for key in arrays.last_results:
        value = expected[key]
        np.testing.assert_allclose(arrays.last_results[key], value, rtol=1e-5)
        np.testing.assert_allclose(history.history["val_" + key][-1], value, rtol=1e-5)
    np.testing.assert_allclose(dataset.last_results["recall@1"], expected["recall@1"], rtol=1e-5)
    assert any(name.startswith("events") for name in os.listdir(tmp_path / "retrieval"))
    with pytest.raises(ValueError, match="every_n_epochs must be >= 1"):
        RetrievalEvaluation((images, labels), every_n_epochs=0)


def _worker(backup_dir, out, kill_epoch, *reference):
    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    arguments = [str(backup_dir), str(out), str(kill_epoch), *map(str, reference)]
    return subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "resume_worker.py"), *arguments],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_weights(tmp_path):
    # the uninterrupted run, then the killed run in the same process; then the resumed run in a fresh one
    killed = _worker(tmp_path / "backup", tmp_path / "killed.npz", 2, tmp_path / "ref_backup", tmp_path / "ref.npz")
    killed_log = killed.communicate(timeout=240)[0].decode()
    assert (tmp_path / "ref.npz").exists(), killed_log  # the reference ran to its end
    assert killed.returncode == -9, killed_log  # SIGKILL in the middle of epoch 2 (0-based)
    assert not (tmp_path / "killed.npz").exists()
    with open(tmp_path / "backup" / "training_metadata.json") as f:
        assert json.load(f)["epoch"] == 2  # epochs 0 and 1 were checkpointed
    resumed = _worker(tmp_path / "backup", tmp_path / "resumed.npz", -1)
    resumed_log = resumed.communicate(timeout=240)[0].decode()
    assert resumed.returncode == 0, resumed_log
    expected, actual = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "resumed.npz")
    assert int(actual["first_epoch"]) == 2 and int(expected["first_epoch"]) == 0
    assert int(actual["iterations"]) == int(expected["iterations"]) == 10
    weight_keys = [key for key in expected.files if key.startswith("w")]
    assert weight_keys and sorted(weight_keys) == sorted(k for k in actual.files if k.startswith("w"))
    for key in weight_keys:
        np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)


def test_resume_stream_skips_checkpointed_epochs(tmp_path):
    from tfdml.callbacks import completed_epochs, resume_stream

    stream = tf.data.Dataset.range(100)
    assert completed_epochs(tmp_path) == 0
    assert int(next(iter(resume_stream(stream, tmp_path, 3)))) == 0
    with open(tmp_path / "training_metadata.json", "w") as f:
        json.dump({"epoch": 4, "batch": -1}, f)
    assert completed_epochs(tmp_path) == 4
    assert int(next(iter(resume_stream(stream, tmp_path, 3)))) == 12
    with pytest.raises(ValueError, match="steps_per_epoch must be >= 1"):
        resume_stream(stream, tmp_path, 0)


@pytest.mark.slow
def test_retrieval_evaluation_takes_a_source_and_refuses_what_it_cannot_embed():
    from tfdml import data
    from tfdml.models import Embedder

    keras.utils.set_random_seed(0)
    model = Embedder("small_cnn", embedding_dim=8, input_shape=(16, 16, 1))
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (24, 20, 20, 1)).astype(np.uint8)  # another size: resized to the model's
    labels = np.repeat(np.arange(6), 4)
    source = RetrievalEvaluation(data.array_source(images, labels), ks=(1, 2), center_crop=False)
    source.set_model(model)
    resized = tf.image.resize(images.astype(np.float32), (16, 16)).numpy()
    arrays = RetrievalEvaluation((resized, labels), ks=(1, 2))
    arrays.set_model(model)
    assert source.evaluate() == pytest.approx(arrays.evaluate(), abs=1e-6)
    reference = _reference_metrics(model.predict(resized, verbose=0), labels, (1, 2))
    results = source.evaluate()
    assert set(results) == {"recall@1", "recall@2", "map@r"}
    assert results == pytest.approx({key: reference[key] for key in results}, abs=1e-6)
    with pytest.raises(
        TypeError,
        match=r"takes \(images, labels\) arrays, a tf.data.Dataset .* or a "
        r"tfdml.data.Source; got str",
    ):
        RetrievalEvaluation("glyphs")
    with pytest.raises(ValueError, match="24 images but 23 labels"):
        RetrievalEvaluation((images, labels[:-1]))
