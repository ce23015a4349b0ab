"""Fault-tolerant training: a sequence of checksummed checkpoints plus the data position to resume from.

`CheckpointSequence(backup_dir)` saves, at the end of every epoch, the model weights, the optimizer state
(step counter, momenta, every inner optimizer of a `MultiOptimizer`), loss variables tracked by
`MetricModel` (the margin loss' beta) and the epoch, as `keras.callbacks.BackupAndRestore` does; after a kill,
rerunning the same `fit` call resumes at the first unfinished epoch. The RLL temperature schedule reads
`optimizer.iterations`, so it resumes too. Unlike `BackupAndRestore`, each epoch's weights go to their own
file (`epoch-0003.weights.h5`), flushed to the disk before the manifest (`training_metadata.json`: the epoch,
and each kept file's size and sha256) names it; the latest two are kept. On start a checkpoint that fails its
check (truncated by a full disk or a power cut, a flipped byte) is named in one line and the one before it is
used (`restore_point`).

What Keras cannot restore is the position in an endless input stream (`class_balanced_dataset(...,
seed=s)` with `steps_per_epoch`): the rerun starts a fresh iterator at the stream's first batch. For the
resumed run to see the same batches as an uninterrupted one, skip what the finished epochs consumed:

    train = resume_stream(class_balanced_dataset(source, 8, 4, seed=0), backup_dir, steps_per_epoch)
    model.fit(train, epochs=E, steps_per_epoch=steps_per_epoch,
              callbacks=[CheckpointSequence(backup_dir)])

(`skip` reads the skipped batches, so on large image pipelines it costs that much input time once.)
A finite dataset that is re-iterated every epoch (no `steps_per_epoch`) needs nothing: each epoch starts it
anew anyway.
"""

import glob
import json
import os
import time

import keras

from tfdml import durable

METADATA_FILE = "training_metadata.json"  # the manifest: {"epoch": latest, "checkpoints": [...], "trained": ...}
LEGACY_WEIGHTS = "latest.weights.h5"  # BackupAndRestore's file, resumed unchecked (it records no checksum)
KEEP = 2


def _manifest(backup_dir):
    path = os.path.join(os.fspath(backup_dir), METADATA_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _entries(manifest):
    """The manifest's checkpoints, oldest first; a BackupAndRestore state is one entry without a record."""
    if manifest is None:
        return []
    if "checkpoints" not in manifest:
        return [{"epoch": int(manifest["epoch"]), "file": LEGACY_WEIGHTS}] if int(manifest["epoch"]) else []
    return manifest["checkpoints"]


def _write_manifest(backup_dir, entries, trained=None):
    manifest = {"epoch": entries[-1]["epoch"] if entries else 0, "checkpoints": entries}
    if trained is not None:
        manifest["trained"] = trained
    durable.write_json(os.path.join(os.fspath(backup_dir), METADATA_FILE), manifest)


def completed_epochs(backup_dir):
    """Number of epochs checkpointed in `backup_dir` (0 when there is no checkpoint)."""
    entries = _entries(_manifest(backup_dir))
    return int(entries[-1]["epoch"]) if entries else 0


def restore_point(backup_dir, say=print):
    """Checks the checkpoints in `backup_dir`, latest first, against their sizes and checksums; one that fails
    is named in one line by `say` and dropped, and the one before it is used (with none left, the run starts
    again from epoch 1, said so). Returns the number of epochs the checkpoint kept restores."""
    backup_dir = os.fspath(backup_dir)
    manifest = _manifest(backup_dir)
    entries = list(_entries(manifest))
    dropped = False
    while entries and "sha256" in entries[-1]:
        path = os.path.join(backup_dir, entries[-1]["file"])
        problem = durable.file_problem(path, entries[-1])
        if problem is None:
            break
        bad = entries.pop()
        dropped = True
        if entries:
            following = f"resuming from the checkpoint of epoch {entries[-1]['epoch']} before it"
        else:
            following = "no earlier checkpoint is kept: training starts again from epoch 1"
        say(f"the checkpoint of epoch {bad['epoch']}, {path}, {problem}; {following}")
    if dropped:
        trained = (manifest or {}).get("trained")
        if trained is not None and os.path.exists(os.path.join(backup_dir, trained["file"])):
            os.remove(os.path.join(backup_dir, trained["file"]))  # trained after the dropped epoch: trained again
        _write_manifest(backup_dir, entries)
        _remove_unlisted(backup_dir, entries)
    return int(entries[-1]["epoch"]) if entries else 0


def _remove_unlisted(backup_dir, entries):
    listed = {entry["file"] for entry in entries}
    for path in glob.glob(os.path.join(glob.escape(backup_dir), "epoch-*.weights.h5")):
        if os.path.basename(path) not in listed:
            os.remove(path)


def save_checked_weights(model, backup_dir, file_name):
    """Saves `model`'s weights as `file_name` in `backup_dir` durably and records its checksum in the manifest
    (as `trained`); `checked_weights` reads it back only if it passes."""
    backup_dir = os.fspath(backup_dir)
    path = os.path.join(backup_dir, file_name)
    with durable.storage_errors(path, _latest_size(backup_dir)), durable.replacing(path) as written:
        model.save_weights(written)
    manifest = _manifest(backup_dir)
    with durable.storage_errors(os.path.join(backup_dir, METADATA_FILE)):
        _write_manifest(backup_dir, list(_entries(manifest)), dict(durable.file_record(path), file=file_name))


def checked_weights(backup_dir, file_name, say=print):
    """The path of the weights `save_checked_weights` kept as `file_name`, or None when there are none or they
    fail their check (named in one line by `say`, and removed: the last epoch's checkpoint is used instead)."""
    backup_dir = os.fspath(backup_dir)
    path = os.path.join(backup_dir, file_name)
    if not os.path.exists(path):
        return None
    record = (_manifest(backup_dir) or {}).get("trained")
    problem = "has no checksum recorded" if record is None else durable.file_problem(path, record)
    if problem is None:
        return path
    say(f"the trained weights {path} {problem}; taking the last epoch's checkpoint instead")
    os.remove(path)
    return None


def _latest_size(backup_dir):
    entries = _entries(_manifest(backup_dir))
    return entries[-1].get("size") if entries else None


class CheckpointSequence(keras.callbacks.Callback):
    """Saves the training state at the end of every epoch as its own checksummed file and keeps the latest
    `keep`; restores the latest that passes its check when training begins (see the module's docstring).

    Args:
      backup_dir: the folder of the checkpoints and their manifest.
      keep: how many epochs' checkpoints are kept (2: a damaged latest one leaves the one before it).
      say: where the line naming a damaged checkpoint goes.
    """

    def __init__(self, backup_dir, keep=KEEP, say=print):
        super().__init__()
        if int(keep) < 1:
            raise ValueError(f"keep must be >= 1, got {keep}.")
        self.backup_dir, self.keep, self.say = os.fspath(backup_dir), int(keep), say

    def on_train_begin(self, logs=None):
        epoch = restore_point(self.backup_dir, self.say)
        if not epoch:
            return
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)  # its variables exist before loading
        self.model.load_weights(os.path.join(self.backup_dir, _entries(_manifest(self.backup_dir))[-1]["file"]))
        self.model._initial_epoch = epoch  # what BackupAndRestore sets: fit starts at the first unfinished epoch

    def on_epoch_end(self, epoch, logs=None):
        os.makedirs(self.backup_dir, exist_ok=True)
        name = f"epoch-{epoch + 1:04d}.weights.h5"
        path = os.path.join(self.backup_dir, name)
        with durable.storage_errors(path, _latest_size(self.backup_dir)), durable.replacing(path) as written:
            self.model.save_weights(written)
        entries = [entry for entry in _entries(_manifest(self.backup_dir)) if entry["epoch"] <= epoch]
        entries = [*entries, dict(durable.file_record(path), epoch=epoch + 1, file=name)][-self.keep :]
        with durable.storage_errors(os.path.join(self.backup_dir, METADATA_FILE)):
            _write_manifest(self.backup_dir, [e for e in entries if e["file"] != LEGACY_WEIGHTS])
        _remove_unlisted(self.backup_dir, entries)


def resume_stream(dataset, backup_dir, steps_per_epoch):
    """`dataset` advanced past the batches that the checkpointed epochs consumed."""
    if int(steps_per_epoch) < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}.")
    return dataset.skip(completed_epochs(backup_dir) * int(steps_per_epoch))


HISTORY_FILE = "tfdml_history.json"


class EpochLog(keras.callbacks.Callback):
    """Keeps every epoch's logs and duration in `<backup_dir>/tfdml_history.json`, so that a resumed run
    reports the whole history and training time, not only its last segment.

    List it before `CheckpointSequence`: an epoch is then logged before it is checkpointed, and
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
        path = os.path.join(self.backup_dir, HISTORY_FILE)
        with durable.storage_errors(path):
            durable.write_json(path, self.epochs)

    def history(self):
        """`{metric: [value per epoch]}` over every epoch logged so far (this run and the ones it resumed)."""
        keys = sorted({k for entry in self.epochs for k in entry["logs"]})
        return {k: [entry["logs"].get(k, float("nan")) for entry in self.epochs] for k in keys}

    def seconds(self, this_run=False):
        """Training time of every epoch logged so far, summed (`this_run`: only the epochs this run trained,
        not those of the runs it resumed)."""
        return sum(entry["seconds"] for entry in self.epochs[self.resumed_epochs if this_run else 0 :])


def previous_epochs(backup_dir):
    """The logged epochs that `CheckpointSequence` in `backup_dir` checkpointed (`[]` without a backup)."""
    path = os.path.join(os.fspath(backup_dir), HISTORY_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)[: completed_epochs(backup_dir)]
