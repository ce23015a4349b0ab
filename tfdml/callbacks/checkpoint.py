"""Fault-tolerant training: `keras.callbacks.BackupAndRestore` plus the data position to resume from.

`keras.callbacks.BackupAndRestore(backup_dir)` saves, at the end of every epoch, the model weights, the
optimizer state (step counter, momenta, every inner optimizer of a `MultiOptimizer`), loss variables tracked
by `MetricModel` (the margin loss' beta) and the epoch; after a kill, rerunning the same `fit` call resumes
at the first unfinished epoch. The RLL temperature schedule reads `optimizer.iterations`, so it resumes too.

What Keras cannot restore is the position in an endless input stream (`class_balanced_dataset(...,
seed=s)` with `steps_per_epoch`): the rerun starts a fresh iterator at the stream's first batch. For the
resumed run to see the same batches as an uninterrupted one, skip what the finished epochs consumed:

    train = resume_stream(class_balanced_dataset(source, 8, 4, seed=0), backup_dir, steps_per_epoch)
    model.fit(train, epochs=E, steps_per_epoch=steps_per_epoch,
              callbacks=[keras.callbacks.BackupAndRestore(backup_dir)])

(`skip` reads the skipped batches, so on large image pipelines it costs that much input time once.)
A finite dataset that is re-iterated every epoch (no `steps_per_epoch`) needs nothing: each epoch starts it
anew anyway.
"""

import json
import os
import time

import keras

METADATA_FILE = "training_metadata.json"


def completed_epochs(backup_dir):
    """Number of epochs checkpointed by `BackupAndRestore` in `backup_dir` (0 when there is no backup)."""
    path = os.path.join(os.fspath(backup_dir), METADATA_FILE)
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return int(json.load(f)["epoch"])


def resume_stream(dataset, backup_dir, steps_per_epoch):
    """`dataset` advanced past the batches that the checkpointed epochs consumed."""
    if int(steps_per_epoch) < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}.")
    return dataset.skip(completed_epochs(backup_dir) * int(steps_per_epoch))


HISTORY_FILE = "tfdml_history.json"


class EpochLog(keras.callbacks.Callback):
    """Keeps every epoch's logs and duration in `<backup_dir>/tfdml_history.json`, so that a resumed run
    reports the whole history and training time, not only its last segment.

    List it before `BackupAndRestore`: an epoch is then logged before it is checkpointed, and
    `previous_epochs` drops a logged epoch whose checkpoint was never written.
    """

    def __init__(self, backup_dir):
        super().__init__()
        self.backup_dir = os.fspath(backup_dir)
        self.epochs = previous_epochs(self.backup_dir)
        self.resumed_epochs = len(self.epochs)  # epochs trained by the runs this one resumes
        self._started = None

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - (self._started or time.perf_counter())
        self.epochs = self.epochs[:epoch] + [
            {"epoch": epoch + 1, "seconds": seconds, "logs": {k: float(v) for k, v in (logs or {}).items()}}
        ]
        os.makedirs(self.backup_dir, exist_ok=True)
        with open(os.path.join(self.backup_dir, HISTORY_FILE), "w") as f:
            json.dump(self.epochs, f)

    def history(self):
        """`{metric: [value per epoch]}` over every epoch logged so far (this run and the ones it resumed)."""
        keys = sorted({k for entry in self.epochs for k in entry["logs"]})
        return {k: [entry["logs"].get(k, float("nan")) for entry in self.epochs] for k in keys}

    def seconds(self, this_run=False):
        """Training time of every epoch logged so far, summed (`this_run`: only the epochs this run trained,
        not those of the runs it resumed)."""
        return sum(entry["seconds"] for entry in self.epochs[self.resumed_epochs if this_run else 0 :])


def previous_epochs(backup_dir):
    """The logged epochs that `BackupAndRestore` in `backup_dir` checkpointed (`[]` without a backup)."""
    path = os.path.join(os.fspath(backup_dir), HISTORY_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)[: completed_epochs(backup_dir)]
