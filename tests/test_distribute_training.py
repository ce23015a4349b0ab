"""Training on N replicas and N machines equals training on one device on the same global batches.

- `model.fit` under `MirroredStrategy` (logical CPUs from `tests/conftest.py`) ends with the single-device
  weights for a `MetricModel` with the margin loss (its mirrored `beta`, trained by its own optimizer) on 2
  replicas and for the multi-level embedder (RLL, Group Loss) on class-balanced digits on 2 replicas;
- `tfdml.training.fit_distributed` gives the same weights as `fit` (without a strategy, on 2 replicas, and
  for `ALAModel` on 4 replicas), follows `fit`'s `steps_per_epoch` semantics, checkpoints and resumes
  mid-dataset;
- two `MultiWorkerMirroredStrategy` worker processes on 127.0.0.1 end with identical weights equal to a
  single-process run, and two new processes resume from the chief's checkpoint (this file doubles as the
  worker script: `python test_distribute_training.py worker OUT_DIR EPOCHS`).
"""

import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

TOLERANCE = 1e-5
IN_DIM = 6
WORKER_TIMEOUT_S = 150


# ------------------------------------------------------------------------------ shared model and data
def _margin_model(run_eagerly=False):
    """A float64 MetricModel with a learnable margin beta (routed to its own SGD by MetricModel).

    Subclassed, not functional: `MetricModel(inputs, outputs)` would make Keras rewrite MetricModel's
    bases to `Functional` for the whole process (keras `inject_functional_model_class`).
    """
    from tfdml.losses import MarginLoss
    from tfdml.models import MetricModel

    class MarginEmbedder(MetricModel):
        def __init__(self):
            super().__init__(name="margin_embedder", dtype="float64")
            self.hidden = keras.layers.Dense(
                5,
                activation="tanh",
                dtype="float64",
                name="hidden",
                kernel_initializer=keras.initializers.GlorotUniform(seed=1),
            )
            self.embedding = keras.layers.Dense(
                4, dtype="float64", name="embedding", kernel_initializer=keras.initializers.GlorotUniform(seed=2)
            )
            self.unit = keras.layers.UnitNormalization(dtype="float64")

        def call(self, inputs):
            return self.unit(self.embedding(self.hidden(inputs)))

    model = MarginEmbedder()
    model(np.zeros((1, IN_DIM)))
    model.compile(
        optimizer=keras.optimizers.SGD(0.3, momentum=0.9),
        loss=MarginLoss(sampling="all", beta=1.0, beta_learning_rate=0.2),
        run_eagerly=run_eagerly,
    )
    return model


def _margin_dataset():
    """3 global batches of 16 = 4 classes x 4, class-major (whole classes per replica share)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, IN_DIM))
    y = np.concatenate([np.repeat(rng.permutation(8)[:4], 4) for _ in range(3)]).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)


def _weights(model):
    """Weights by path, without the auto-numbered prefix of the outer model (`sequential_3/...`)."""
    return {v.path.split("/", 1)[-1] if v.path.count("/") > 1 else v.path: np.asarray(v) for v in model.weights}


def _assert_same_weights(got, want, start=None):
    assert sorted(got) == sorted(want)
    for path in want:
        np.testing.assert_allclose(got[path], want[path], rtol=0, atol=TOLERANCE, err_msg=path)
    if start is not None:  # the comparison is only meaningful if training moved the weights
        assert max(np.abs(want[p] - start[p]).max() for p in want) > 1e-3


def _strategy(replicas):
    from tfdml.distribute import mirrored_strategy

    return mirrored_strategy([f"/cpu:{i}" for i in range(replicas)])


@pytest.fixture(scope="module")
def margin_reference():
    """Single-device `fit` (eager: no tracing cost): weights after 1 and after 2 epochs (3 steps each)."""
    model = _margin_model(run_eagerly=True)
    start = _weights(model)
    model.fit(_margin_dataset(), epochs=1, verbose=0, shuffle=False)
    after_one = _weights(model)
    model.fit(_margin_dataset(), epochs=1, verbose=0, shuffle=False)
    return start, after_one, _weights(model)


# ------------------------------------------------------------------------------ MirroredStrategy
@pytest.mark.slow
def test_fit_on_two_replicas_matches_one_device_with_learnable_beta(margin_reference):
    start, after_one, _ = margin_reference
    with _strategy(2).scope():
        model = _margin_model()
    model.fit(_margin_dataset(), epochs=1, verbose=0, shuffle=False)
    _assert_same_weights(_weights(model), after_one, start)
    beta = [p for p in after_one if "beta" in p]
    assert beta and abs(after_one[beta[0]] - 1.0) > 1e-3  # beta was trained, identically


@pytest.mark.slow
def test_fit_distributed_matches_fit_and_resumes_from_its_checkpoint(margin_reference, tmp_path, capsys):
    from tfdml.training import fit_distributed

    start, after_one, after_two = margin_reference
    strategy = _strategy(2)
    with strategy.scope():
        model = _margin_model()
    history = fit_distributed(model, _margin_dataset(), epochs=1, checkpoint_dir=str(tmp_path))
    _assert_same_weights(_weights(model), after_one, start)
    assert list(history) == ["loss"] and len(history["loss"]) == 1
    assert "Epoch 1/1 - 3 steps" in capsys.readouterr().out

    with strategy.scope():  # a fresh process would do the same: new model, same checkpoint_dir
        resumed = _margin_model()
    history = fit_distributed(resumed, _margin_dataset(), epochs=2, checkpoint_dir=str(tmp_path))
    assert "Resumed from" in capsys.readouterr().out and len(history["loss"]) == 1
    _assert_same_weights(_weights(resumed), after_two)
    assert int(np.asarray(resumed.optimizer.iterations)) == 6
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")


def test_fit_distributed_without_strategy_equals_fit(margin_reference):
    from tfdml.training import fit_distributed

    start, after_one, _ = margin_reference
    model = _margin_model()
    fit_distributed(model, _margin_dataset(), epochs=1, verbose=0)
    _assert_same_weights(_weights(model), after_one, start)


@pytest.mark.slow
@pytest.mark.parametrize("loss_name", ["ranked_list", "group"])
def test_multi_level_embedder_on_replicas_matches_one_device_on_class_balanced_batches(loss_name):
    """One class per replica (2 classes x 4 digits on 2 replicas): alone, a replica would see no negative.

    Group Loss runs on the embedder's classifier heads (`y_pred = concat([e_l, logits_l])` per level).

    With global BatchNorm statistics (`synchronize_batch_normalization`) the conv embedder trains exactly as
    on one device; float64 so that RLL's mining thresholds cannot flip on rounding differences. Both run
    eagerly (tracing a conv net per replica costs tens of seconds; the traced path is tested above).
    """
    from tfdml.data import class_balanced_dataset, digits
    from tfdml.distribute import synchronize_batch_normalization
    from tfdml.losses import GroupLoss, RankedListLoss
    from tfdml.models import MultiLevelEmbedder

    dataset = class_balanced_dataset(
        digits("train"), classes_per_batch=2, samples_per_class=4, image_size=12, seed=0, num_replicas=2, prefetch=False
    ).take(1)
    dataset = dataset.map(lambda images, labels: (tf.cast(images, "float64"), labels)).cache()
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(1))  # `fit` then knows the epoch length

    def make():
        keras.utils.set_random_seed(4)
        group = loss_name == "group"
        model = MultiLevelEmbedder(
            "small_cnn",
            embedding_dim=4,
            input_shape=(12, 12, 1),
            head_filters=4,
            head_units=6,
            num_classes=5 if group else None,
        )  # digits 0-4
        assert synchronize_batch_normalization(model) > 0
        loss = GroupLoss(5, temperature=2.0) if group else RankedListLoss()
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, run_eagerly=True)
        return model

    policy = keras.config.dtype_policy()  # layers take their dtype from the global policy, not floatx
    keras.config.set_dtype_policy("float64")
    try:
        single = make()
        start = _weights(single)
        single.fit(dataset, epochs=1, verbose=0, shuffle=False)
        with _strategy(2).scope():
            mirrored = make()
        _assert_same_weights(_weights(mirrored), start)
        mirrored.fit(dataset, epochs=1, verbose=0, shuffle=False)
    finally:
        keras.config.set_dtype_policy(policy)
    _assert_same_weights(_weights(mirrored), _weights(single), start)


@pytest.mark.slow
def test_ala_model_in_fit_distributed_on_four_replicas_matches_one_device():
    from tfdml.models import ALAModel
    from tfdml.training import fit_distributed

    rng = np.random.default_rng(2)
    train_y = np.repeat(np.arange(4), 3).astype(np.int32)
    val_y = np.repeat(np.arange(4, 8), 2).astype(np.int32)
    episodes = tf.data.Dataset.from_tensor_slices(
        (
            rng.normal(size=(2, 12, IN_DIM)),
            np.stack([train_y] * 2),
            rng.normal(size=(2, 8, IN_DIM)),
            np.stack([val_y] * 2),
        )
    )

    def make(run_eagerly=False):
        keras.utils.set_random_seed(0)  # the assessor's LSTM initialisers are unseeded
        embedder = keras.Sequential(
            [
                keras.Input((IN_DIM,), dtype="float64"),
                keras.layers.Dense(
                    3, dtype="float64", name="projection", kernel_initializer=keras.initializers.GlorotUniform(seed=5)
                ),
                keras.layers.UnitNormalization(dtype="float64"),
            ]
        )
        model = ALAModel(
            embedder,
            base_loss="triplet",
            assessor_units=3,
            assessor_steps=1,
            inner_learning_rate=0.5,
            assessor_learning_rate=0.5,
            dtype="float64",
        )
        model.compile(optimizer=keras.optimizers.SGD(0.5), run_eagerly=run_eagerly)
        return model

    single = make(run_eagerly=True)
    start = _weights(single)
    single.fit(episodes, epochs=1, verbose=0, shuffle=False)
    with _strategy(4).scope():
        mirrored = make(run_eagerly=True)  # tracing ALA's meta-step on 4 replicas takes ~30 s
    _assert_same_weights(_weights(mirrored), start)
    fit_distributed(mirrored, episodes, epochs=1, verbose=0)
    _assert_same_weights(_weights(mirrored), _weights(single), start)


def test_steps_per_epoch_carries_the_iterator_over_and_restarts_exhausted_data_as_fit_does():
    """3 batches, steps_per_epoch=2, epochs=3: batches 1-2 | 3 (data ends: short epoch) | 1-2 again."""
    from tfdml.training import fit_distributed

    reference = _margin_model(run_eagerly=True)
    with pytest.warns(UserWarning, match="ran out of data"):
        reference.fit(_margin_dataset(), epochs=3, steps_per_epoch=2, verbose=0, shuffle=False)
    model = _margin_model(run_eagerly=True)
    with pytest.warns(UserWarning, match="ran out of data after 1 steps of epoch 2"):
        history = fit_distributed(model, _margin_dataset(), epochs=3, steps_per_epoch=2, verbose=0)
    assert len(history["loss"]) == 3
    assert int(np.asarray(model.optimizer.iterations)) == int(np.asarray(reference.optimizer.iterations)) == 5
    _assert_same_weights(_weights(model), _weights(reference))


@pytest.mark.slow
@pytest.mark.parametrize("data_position", ["iterator", "skip"])
def test_resumed_run_continues_mid_dataset_like_an_uninterrupted_one(data_position, tmp_path):
    """A repeated 3-batch dataset, 2 steps per epoch: the resumed epoch 2 must train on batches 3, 1."""
    from tfdml.training import fit_distributed

    dataset = _margin_dataset()
    if data_position == "skip":  # a py_function: tf.data cannot save this iterator, "auto" picks "skip"
        dataset = dataset.map(lambda x, y: (x, tf.py_function(lambda t: t, [y], tf.int32)))
        dataset = dataset.map(lambda x, y: (x, tf.ensure_shape(y, [16])))
    dataset = dataset.repeat()
    reference = _margin_model(run_eagerly=True)
    reference.fit(_margin_dataset().repeat(), epochs=2, steps_per_epoch=2, verbose=0, shuffle=False)

    fit_distributed(
        _margin_model(run_eagerly=True), dataset, epochs=1, steps_per_epoch=2, verbose=0, checkpoint_dir=str(tmp_path)
    )
    resumed = _margin_model(run_eagerly=True)
    fit_distributed(resumed, dataset, epochs=2, steps_per_epoch=2, verbose=0, checkpoint_dir=str(tmp_path))
    _assert_same_weights(_weights(resumed), _weights(reference))
    names = {name for name, _ in tf.train.list_variables(str(tmp_path))}
    assert any(name.startswith("data_iterator") for name in names) == (data_position == "iterator")


def test_fit_distributed_rejects_bad_arguments():
    from tfdml.training import fit_distributed

    model = keras.Sequential([keras.Input((IN_DIM,)), keras.layers.Dense(2)])
    dataset = _margin_dataset()
    with pytest.raises(ValueError, match="compiled model"):
        fit_distributed(model, dataset)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="created under"):
        fit_distributed(model, dataset, strategy=_strategy(2))
    with pytest.raises(ValueError, match="epochs"):
        fit_distributed(model, dataset, epochs=0)
    with pytest.raises(ValueError, match="data_position"):
        fit_distributed(model, dataset, data_position="restart")
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        fit_distributed(model, [1, 2, 3])


# ------------------------------------------------------------------------------ MultiWorkerMirroredStrategy
def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _run_workers(out_dir, epochs, num_workers=2):
    """Starts the workers, waits (bounded) and kills every one still running if anything fails."""
    ports = _free_ports(num_workers)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    try:
        for index in range(num_workers):
            env = dict(
                os.environ,
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
                TF_CPP_MIN_LOG_LEVEL="2",
                CUDA_VISIBLE_DEVICES="",
            )
            log = open(os.path.join(out_dir, f"worker{index}.log"), "w")
            command = [sys.executable, os.path.abspath(__file__), "worker", out_dir, str(epochs)]
            processes.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        for process, _ in processes:
            process.wait(timeout=WORKER_TIMEOUT_S)
    finally:
        for process, log in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    logs = []
    for i in range(num_workers):
        with open(os.path.join(out_dir, f"worker{i}.log")) as f:
            logs.append(f.read())
    for index, (process, _) in enumerate(processes):
        assert process.returncode == 0, f"worker {index} failed:\n{logs[index][-4000:]}"
    weights = [dict(np.load(os.path.join(out_dir, f"worker{i}.npz"))) for i in range(num_workers)]
    return logs, weights


def _assert_workers_match(weights, reference):
    for path in reference:  # npz keys cannot hold "/"
        key = path.replace("/", "|")
        np.testing.assert_array_equal(weights[1][key], weights[0][key], err_msg=path)
        np.testing.assert_allclose(weights[0][key], reference[path], rtol=0, atol=TOLERANCE, err_msg=path)


@pytest.mark.slow
def test_two_worker_processes_train_like_one_process_and_resume_after_a_restart(margin_reference, tmp_path):
    _, after_one, after_two = margin_reference
    logs, weights = _run_workers(str(tmp_path), epochs=1)
    _assert_workers_match(weights, after_one)
    # The chief reports progress; the other worker stays silent.
    assert "Epoch 1/1 - 3 steps" in logs[0] and "Epoch" not in logs[1]

    logs, weights = _run_workers(str(tmp_path), epochs=2)  # new processes resume from the checkpoint
    _assert_workers_match(weights, after_two)
    assert "Resumed from" in logs[0] and "Epoch 2/2 - 3 steps" in logs[0] and "Epoch 1/" not in logs[0]
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-2")


def _worker_main(out_dir, epochs):
    """One MultiWorkerMirroredStrategy worker: trains (or resumes) up to `epochs`, then saves its weights."""
    from tfdml.training import fit_distributed

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = _margin_model()
    fit_distributed(model, _margin_dataset(), epochs=epochs, checkpoint_dir=os.path.join(out_dir, "checkpoints"))
    index = strategy.cluster_resolver.task_id
    np.savez(
        os.path.join(out_dir, f"worker{index}.npz"),
        **{path.replace("/", "|"): value for path, value in _weights(model).items()},
    )


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker_main(sys.argv[2], int(sys.argv[3]))
