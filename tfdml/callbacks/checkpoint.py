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
