"""`fit_distributed`: a training loop over `strategy.run` for one device, N devices and N machines.

Keras 3 `model.fit` trains under `MirroredStrategy` (one machine, N devices) but fails under
`MultiWorkerMirroredStrategy` (keras-team/keras#20585). This loop trains the same compiled model in both
cases, and on a single device, with the same per-step computation as `fit`: every step runs the model's
own `train_step` (so `tfdml.models.MetricModel` subclasses, `ALAModel` and plain `keras.Model`s with a
tfdml loss behave exactly as in `fit`) inside `strategy.run`, and logs the replica mean of its metrics.

Batch semantics: `dataset` yields *global* batches `(x, y)`, as for `fit` on one device. Every worker
iterates the same dataset and each replica `r` of `N` receives the contiguous rows
`[r * B // N, (r + 1) * B // N)` of each global batch, so a class-balanced batch keeps whole classes per
replica and the tfdml losses (which gather the replicas' shares) see exactly the single-device batch.
The dataset must therefore yield the same batches on every worker (fixed shuffle seeds).

Checkpoints (`tf.train.CheckpointManager`) hold the model, its optimizer, the epoch counter and the
position in the dataset (see `data_position`); the chief writes one at the end of every epoch (under
`MultiWorkerMirroredStrategy` the other workers write to temporary directories that are deleted right
away, as the strategy requires every worker to save). A new call with the same `checkpoint_dir` resumes
from the latest checkpoint: it restores the weights, the optimizer state and the data position and runs
the remaining epochs only. Under several machines `checkpoint_dir` must be on storage every worker can read.
"""

import os
import shutil
import sys
import tempfile
import time
import warnings

import keras
import tensorflow as tf

from tfdml import interrupts

__all__ = ["fit_distributed", "replica_slice"]

_DATA_POSITIONS = ("auto", "iterator", "skip", None)


def replica_slice(batch, replica_id, num_replicas):
    """Rows `[replica_id * B // num_replicas, (replica_id + 1) * B // num_replicas)` of every tensor in `batch`.

    The split `experimental_distribute_dataset` makes of a global batch on one machine; shares differ by at
    most one row when `B` is not a multiple of `num_replicas`.
    """

    def take(tensor):
        size = tf.shape(tensor)[0]
        start = size * replica_id // num_replicas
        end = size * (replica_id + 1) // num_replicas
        return tensor[start:end]

    return tf.nest.map_structure(take, batch)


def _task(strategy):
    """`(task_type, task_id)` of this process; `(None, None)` for single-machine strategies."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return None, None
    return resolver.task_type, resolver.task_id


def _is_chief(task_type, task_id):
    # Without an explicit "chief" task, worker 0 is the chief (MultiWorkerMirroredStrategy's convention).
    return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0)


class _Progress:
    """One line per epoch (verbose=1) or per step (verbose=2) on the chief's stdout."""

    def __init__(self, verbose, enabled, epochs):
        self.verbose = verbose if enabled else 0
        self.epochs = epochs

    def step(self, epoch, step, steps, logs):
        if self.verbose >= 2:
            self._print(f"Epoch {epoch + 1}/{self.epochs} - step {step}/{steps or '?'} - {self._fmt(logs)}")

    def epoch(self, epoch, steps, seconds, logs):
        if self.verbose >= 1:
            self._print(f"Epoch {epoch + 1}/{self.epochs} - {steps} steps - {seconds:.1f}s - {self._fmt(logs)}")

    def message(self, text):
        if self.verbose >= 1:
            self._print(text)

    @staticmethod
    def _fmt(logs):
        return " - ".join(f"{name}: {value:.4f}" for name, value in logs.items())

    @staticmethod
    def _print(text):
        print(text, file=sys.stdout, flush=True)


def _check_model(model, strategy):
    if getattr(model, "optimizer", None) is None:
        raise ValueError(
            "fit_distributed needs a compiled model: call model.compile(optimizer=..., loss=...) "
            "inside strategy.scope() first."
        )
    model_strategy = model.distribute_strategy
    if model_strategy is not strategy:
        raise ValueError(
            f"The model was created under {type(model_strategy).__name__} but fit_distributed got "
            f"{type(strategy).__name__}: create and compile the model inside `strategy.scope()` of the "
            f"strategy you train with."
        )


def _build(model, strategy, batch_spec):
    """Creates the model, metric and optimizer variables (as `fit` does) before any checkpoint restore."""
    with strategy.scope():
        # The symbolic build `fit` runs before its first step (from shapes and dtypes only, so no batch is
        # consumed); variables first made inside `strategy.run` would not be mirrored correctly.
        model._symbolic_build(data_batch=batch_spec)
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)


def _resume(checkpoint, checkpoint_dir, cursor, progress, epoch_counter):
    """Restores the newest checkpoint in `checkpoint_dir`, if any, and puts the data cursor back in place."""
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest is not None:
        _restore(checkpoint, latest)
        progress.message(f"Resumed from {latest} after epoch {int(epoch_counter.numpy())}.")
        cursor.resume()


def _save(manager, epochs_done, chief):
    if manager is None:
        return
    manager.save(checkpoint_number=epochs_done)
    if not chief:  # a worker's copy only makes the collective save possible; the chief's is the checkpoint
        shutil.rmtree(manager.directory, ignore_errors=True)


def fit_distributed(
    model,
    dataset,
    epochs=1,
    steps_per_epoch=None,
    checkpoint_dir=None,
    strategy=None,
    max_checkpoints=3,
    data_position="auto",
    verbose=1,
):
    """Trains a compiled Keras model with `strategy.run`, checkpointing and resuming; returns the history.

    Works with `tf.distribute.MirroredStrategy`, `MultiWorkerMirroredStrategy` (N processes, one per
    machine, each configured by `TF_CONFIG`) and no strategy. Weights after each step equal those of
    `model.fit` on the same global batches (see the module docstring for the batch split).

    Args:
        model: a `keras.Model` created and compiled inside `strategy.scope()`.
        dataset: `tf.data.Dataset` of global batches `(x, y)` (or `(x, y, sample_weight)`), identical on every
            worker.
        epochs: total number of epochs, counting those already done in a checkpoint being resumed.
        steps_per_epoch: steps per epoch; None runs each epoch until the dataset is exhausted. With a
            repeated (infinite) dataset it is required. The dataset iterator carries over from one epoch to
            the next; if it runs out, the epoch ends early (with a warning) and the dataset starts again.
        checkpoint_dir: directory for checkpoints; None disables checkpointing and resuming.
        strategy: the distribution strategy; default the one the model was created under.
        max_checkpoints: number of checkpoints the chief keeps.
        data_position: how a resumed run finds its place in the dataset, so that it sees the batches an
            uninterrupted run would have seen: `"iterator"` stores the tf.data iterator in the checkpoint
            (fast; not possible for datasets with `py_function`/`from_generator`, such as
            `tfdml.data.class_balanced_dataset`), `"skip"` stores the number of batches read and skips them
            on resume (re-reads them: costs input-pipeline time), `"auto"` (default) the first that works,
            None restarts the dataset from its first batch.
        verbose: 0 silent, 1 one line per epoch, 2 one line per step (chief only).

    Returns:
        A dict `{metric_name: [value after each epoch run in this call]}` (Keras' `History.history` layout).

    Example:
        # On each machine, with TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]},
        #                                   "task": {"type": "worker", "index": 0}}'  (index 1 on host2):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = build_model()
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss=tfdml.losses.RankedListLoss())
        tfdml.training.fit_distributed(model, dataset, epochs=10, steps_per_epoch=500, checkpoint_dir="/shared/run1")
    """
    strategy = strategy or model.distribute_strategy
    _check_arguments(model, strategy, dataset, epochs, steps_per_epoch, data_position)
    task_type, task_id = _task(strategy)
    chief = _is_chief(task_type, task_id)
    progress = _Progress(verbose, chief, epochs)
    cursor = _DataCursor(dataset, data_position if checkpoint_dir is not None else None)
    _build(model, strategy, dataset.element_spec)
    epoch_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="epochs_done")
    checkpoint = tf.train.Checkpoint(epochs_done=epoch_counter, **cursor.trackables(), **_training_state(model))
    save = _saver(checkpoint, checkpoint_dir, chief, (task_type, task_id), max_checkpoints, cursor, progress)
    train_step = _distributed_train_step(model, strategy)
    return _train_epochs(model, train_step, cursor, checkpoint, save, epoch_counter, epochs, steps_per_epoch, progress)


def _saver(checkpoint, checkpoint_dir, chief, task, max_checkpoints, cursor, progress):
    """`save(epochs done)`, after restoring the checkpoint of an earlier run in `checkpoint_dir` (a no-op
    without one)."""
    manager = None
    if checkpoint_dir is not None:
        manager = _checkpoint_manager(checkpoint, checkpoint_dir, chief, *task, max_checkpoints)
        _resume(checkpoint, checkpoint_dir, cursor, progress, checkpoint.epochs_done)
    return lambda epochs_done: _save(manager, epochs_done, chief)


def _train_epochs(model, train_step, cursor, checkpoint, save, epoch_counter, epochs, steps_per_epoch, progress):
    """The epochs from the first not done to `epochs`, each saved by `save(epochs done)`; the history of those
    run."""
    history = {}
    for epoch in range(int(epoch_counter.numpy()), epochs):
        model.reset_metrics()
        start = time.time()
        step, logs, out_of_data = _run_epoch(train_step, cursor, checkpoint, epoch, steps_per_epoch, progress)
        if step > 0:
            epoch_counter.assign(epoch + 1)
            for name, value in logs.items():
                history.setdefault(name, []).append(value)
            progress.epoch(epoch, step, time.time() - start, logs)
            save(epoch + 1)
        if out_of_data:
            warnings.warn(
                f"The dataset ran out of data after {step} steps of epoch {epoch + 1} (steps_per_epoch="
                f"{steps_per_epoch}): the epoch ends early and the next one starts the dataset again, as in "
                "`fit`. Repeat the dataset (`.repeat()`) or lower steps_per_epoch.",
                stacklevel=3,  # the caller of fit_distributed
            )
    return history


def _check_arguments(model, strategy, dataset, epochs, steps_per_epoch, data_position):
    _check_model(model, strategy)
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}.")
    if steps_per_epoch is not None and steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1 or None, got {steps_per_epoch}.")
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset of global batches, got {type(dataset).__name__}.")
    if data_position not in _DATA_POSITIONS:
        raise ValueError(f"data_position must be one of {_DATA_POSITIONS}, got {data_position!r}.")


class _DataCursor:
    """The dataset iterator and the run's position in it, as a checkpoint stores and restores it.

    `data_position` (see `fit_distributed`): "iterator" checkpoints the tf.data iterator itself, "skip" the
    number of batches read (skipped again on resume), "auto" the first that works, None neither.
    """

    def __init__(self, dataset, data_position):
        self.dataset = dataset
        self.iterator = iter(dataset)
        if data_position == "auto":
            data_position = "iterator" if _is_checkpointable(self.iterator) else "skip"
        self.data_position = data_position
        self.batches_read = tf.Variable(0, dtype=tf.int64, trainable=False, name="batches_read")

    def trackables(self):
        state = {"batches_read": self.batches_read}
        if self.data_position == "iterator":
            state["data_iterator"] = self.iterator
        return state

    def resume(self):
        """After a checkpoint restore: continue where the checkpointed run stopped reading."""
        if self.data_position == "skip" and int(self.batches_read.numpy()) > 0:
            self.iterator = iter(self.dataset.skip(int(self.batches_read.numpy())))
        elif self.data_position is None:
            self.batches_read.assign(0)

    def next(self, checkpoint):
        """The next batch, or None at the end of the data (the dataset then starts again)."""
        try:
            batch = next(self.iterator)
        except StopIteration:
            self.iterator = iter(self.dataset)
            self.batches_read.assign(0)
            if self.data_position == "iterator":  # the checkpoint tracks the new iterator from now on
                checkpoint.data_iterator = self.iterator
            return None
        self.batches_read.assign_add(1)
        return batch


def _checkpoint_manager(checkpoint, checkpoint_dir, chief, task_type, task_id, max_checkpoints):
    # MultiWorkerMirroredStrategy needs every worker to save: the others write to a temporary directory
    # that is deleted right after each save.
    write_dir = (
        checkpoint_dir
        if chief
        else os.path.join(tempfile.gettempdir(), f"tfdml_worker_{task_type}_{task_id}_{os.getpid()}")
    )
    return tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=max_checkpoints if chief else 1)


def _distributed_train_step(model, strategy):
    """`train_step(global_batch) -> logs`: the model's own `train_step` on each replica's rows, whose metrics
    are reduced as `fit` reports them."""
    num_replicas = strategy.num_replicas_in_sync

    def split(batch):
        def value_fn(context):
            return replica_slice(batch, context.replica_id_in_sync_group, num_replicas)

        return strategy.experimental_distribute_values_from_function(value_fn)

    def replicated_step(per_replica_batch):
        logs = strategy.run(model.train_step, args=(per_replica_batch,))
        # Metric results are already synchronised; MEAN is what `fit` reports.
        return {name: strategy.reduce("MEAN", value, axis=None) for name, value in logs.items()}

    if not model.run_eagerly:  # as in `fit`: `compile(run_eagerly=True)` is for debugging
        replicated_step = tf.function(replicated_step, reduce_retracing=True)
    return lambda batch: replicated_step(split(batch))


def _run_epoch(train_step, cursor, checkpoint, epoch, steps_per_epoch, progress):
    """Runs one epoch; returns `(steps run, last logs, whether the data ran out before steps_per_epoch)`."""
    step, logs = 0, {}
    while steps_per_epoch is None or step < steps_per_epoch:
        interrupts.stop_point()  # a Ctrl-C held by interrupts.between_steps() stops here
        batch = cursor.next(checkpoint)
        if batch is None:
            # The epoch ends with the data; with steps_per_epoch it ends early, as in `fit`.
            if step == 0 and steps_per_epoch is None:
                raise ValueError("The dataset yields no batch.")
            return step, logs, steps_per_epoch is not None
        logs = {name: float(value) for name, value in train_step(batch).items()}
        step += 1
        progress.step(epoch, step, steps_per_epoch, logs)
    return step, logs, False


def _training_state(model):
    """The variables a resumed run needs, as lists of `tf.Variable`s in a fixed order.

    Keras 3 objects are not tracked completely by `tf.train.Checkpoint` (the inner optimizers of a
    `MultiOptimizer` and the optimizer's momentum slots are left out), so the checkpoint lists the
    variables explicitly: the model's (weights, loss variables such as `beta`, carried states, seeds)
    and the optimizer's (iterations, slots, inner optimizers). The same model code gives the same order.
    """

    def tf_variables(variables):
        return [variable.value if isinstance(variable, keras.Variable) else variable for variable in variables]

    return {
        "model_variables": tf_variables(model.variables),
        "optimizer_variables": tf_variables(model.optimizer.variables),
    }


def _is_checkpointable(iterator):
    """Whether tf.data can save this iterator (not with `py_function` or `from_generator` in the pipeline)."""
    with tempfile.TemporaryDirectory() as directory:
        try:
            tf.train.Checkpoint(iterator=iterator).write(os.path.join(directory, "probe"))
        except (tf.errors.OpError, TypeError, ValueError):
            return False
    return True


def _restore(checkpoint, path):
    try:
        checkpoint.restore(path).assert_consumed()
    except AssertionError as error:
        raise ValueError(
            f"The checkpoint {path} does not match this model and optimizer (different architecture, loss "
            f"variables, optimizer or data_position?). Use a new checkpoint_dir for a different model. "
            f"Details: {error}"
        ) from None
