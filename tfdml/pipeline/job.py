"""The job: its stages run in order under the report folder's lock, with a stop said as where it happened."""

import dataclasses
import logging
import os
import time

import keras
import numpy as np

from tfdml import durable, interrupts
from tfdml.callbacks import completed_epochs
from tfdml.config import Config, default_config
from tfdml.pipeline.data import (
    check_evaluation_data,
    check_unseen_classes,
    fit_to_data,
    load_sources,
    make_datasets,
    steps_per_epoch,
)
from tfdml.pipeline.evaluate import Evaluation, evaluate, export_once
from tfdml.pipeline.folder import check_outputs, choose_report_dir, lock_report, prepare_report_dir, resolve_paths
from tfdml.pipeline.report import finish_report
from tfdml.pipeline.train import build_model, check_weights, is_chief, strategy_for, train_or_restore

logger = logging.getLogger(__name__)


class JobError(RuntimeError):
    """A failure after training (e.g. the export cannot be written); the message says what was kept.
    `storage`: the storage refused a write (full, read-only, failing), not the job."""

    storage = False

    @classmethod
    def of(cls, cause, message):
        error = cls(message)
        error.storage = isinstance(cause, durable.StorageError)
        return error


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the job; the message says where it stopped and how to go on."""


def _interrupted(stage, config):
    epochs, checkpoints = config.training.epochs, config.training.checkpoint_dir
    done = completed_epochs(checkpoints) if stage == "training" else 0
    if done >= epochs:  # stopped after the last epoch's checkpoint: the rerun trains nothing
        stage = "after training"
    if stage == "training":
        if done:
            return Interrupted(f"interrupted after epoch {done}/{epochs}; run the same command to resume")
        return Interrupted(
            f"interrupted in epoch 1/{epochs}, before its checkpoint: run the same command to start again"
        )
    if stage == "after training":
        return Interrupted(
            f"interrupted after training ({epochs}/{epochs} epochs, kept in {checkpoints}), before the report "
            f"was complete; run the same command to write the report in {config.report.dir}"
        )
    if stage == "reported":
        return Interrupted(f"stopped after the report in {config.report.dir} was complete; nothing was lost")
    return Interrupted("interrupted before training started: run the same command to start")


def run(config=None, verbose=1, restart=False, say=print, fit_classes_per_batch=False, overwrite=False):
    """Runs the whole job; returns the metrics dict also written to `<report_dir>/metrics.json`.

    `config`: a `Config` (default: the embedded default job); `restart`: discard an unfinished run in the
    report directory instead of resuming it; `say`: where the one-line notices (resuming ...) go;
    `fit_classes_per_batch`: train on all the classes of training data that has fewer than
    `data.classes_per_batch` (see `fit_to_data`); `overwrite`: replace a finished run's report instead of
    keeping it (see `choose_report_dir`).

    Output folders are checked and the report folder locked (`tfdml.locks`; `LockedError` when another
    process writes it) before anything is read or trained. The report is written beside its folder and
    moved into place in one step; the checkpoints are cleared only then, so a run stopped after training
    is taken to its report by the same call again. A stop (Ctrl-C, or SIGTERM under the CLI) raises
    `Interrupted`, whose message says how to go on; a failed export raises `JobError` once the report is
    in place."""
    if not isinstance(config, Config):
        config = Config.from_dict(config) if config is not None else default_config()
    _warn_if_ala_learns_from_noisy_labels(config)
    report_dir = choose_report_dir(config, overwrite, say)
    config = resolve_paths(config.replace(report=config.report.replace(dir=report_dir)))
    started = time.perf_counter()
    check_outputs(config)
    lock = lock_report(config, say)
    try:
        return _job(config, verbose, restart, say, fit_classes_per_batch, started)
    finally:
        if lock is not None:
            lock.release()


def _warn_if_ala_learns_from_noisy_labels(config):
    """DML-ALA on labels the job declares noisy, with its validation subsets drawn from those labels: the
    assessor then learns from a validation loss on the same wrong labels (the label-noise benchmark of the
    documentation measures what it does)."""
    if config.ala.enabled and config.ala.val_path is None and config.loss.label_noise is not None:
        logger.warning(
            "ala.enabled with loss.label_noise and no ala.val_path: the validation subsets come from the noisy "
            "training labels, and on them the assessor learned to weigh mislabelled pairs above correct ones and "
            "trained below the plain loss; set ala.val_path to an image folder whose "
            "labels were checked by hand"
        )


def _job(config, verbose, restart, say, fit_classes_per_batch, started):
    stage = ["before training"]  # where a stop found the job (run_stages moves it on)
    try:
        # A stop waits for the next stage, step or batch: raised inside TensorFlow's code (loading data,
        # embedding, exporting) it can abort the process instead of stopping it.
        with interrupts.between_steps():
            strategy_for(config.training.distribute)  # before any TensorFlow op (multi-worker collectives)
            keras.utils.set_random_seed(config.seed)
            train_source, eval_source = load_sources(config.data)
            config = fit_to_data(config, train_source, fit_classes_per_batch, say)
            check_evaluation_data(eval_source)
            check_unseen_classes(train_source, eval_source)
            prepare_report_dir(config, restart, say)
            outcome = run_stages(config, verbose, train_source, eval_source, stage, say)
        if not outcome.summary.get("chief", True):
            return outcome.summary
        summary = finish_report(config, outcome, started, stage)
    except KeyboardInterrupt:
        raise _interrupted(stage[0], config) from None
    if outcome.export_error is not None:
        raise JobError.of(
            outcome.export_error,
            f"the export to {os.path.join(config.export.base_dir, config.export.name)} failed "
            f"({outcome.export_error}); the report is complete in {config.report.dir}",
        )
    return summary


@dataclasses.dataclass
class Outcome:
    """What the job's stages produced, for its report."""

    summary: dict
    history: dict = None
    evaluation: Evaluation = None
    embedder: object = None
    eval_source: object = None
    export_error: object = None  # the export failed (the report is written anyway)


def run_stages(config, verbose, train_source, eval_source, stage, say=print):
    steps = steps_per_epoch(config, train_source)
    input_shape = (config.data.image_size, config.data.image_size, getattr(train_source, "channels", 3))
    check_weights(config, train_source)

    strategy = strategy_for(config.training.distribute)
    with strategy.scope():
        model, embedder = build_model(config, input_shape, config.training.epochs * steps)
    datasets = make_datasets(config, train_source, eval_source, strategy.num_replicas_in_sync)
    interrupts.stop_point()
    stage[0] = "training"
    trained = train_or_restore(config, model, embedder, datasets, strategy, steps, verbose, say)
    stage[0] = "after training"
    summary = {
        "name": config.name,
        "train_seconds": round(trained.seconds, 2),  # every epoch, across resumed runs
        "train_seconds_this_run": round(trained.seconds_this_run, 2),
        "epochs_this_run": int(trained.epochs_this_run),
    }
    if not is_chief(strategy):
        return Outcome(dict(summary, chief=False))

    evaluation = evaluate(config, embedder, datasets)
    summary.update(
        {
            "report_dir": config.report.dir,
            "paper_target": config.paper_target,
            "model": evaluation.results,
            "raw_pixels": evaluation.baseline,
            "eval_items": int(len(evaluation.labels)),
            "eval_classes": int(len(np.unique(evaluation.labels))),
            "match_calibration": evaluation.calibration.to_dict() if evaluation.calibration else None,
            "steps_per_epoch": int(steps),
            "history": {k: [float(v) for v in vs] for k, vs in trained.history.items()},
        }
    )
    error = None
    interrupts.stop_point()
    if config.export.enabled:
        added, error = export_once(config, embedder, evaluation, eval_source)
        summary.update(added)
    return Outcome(summary, trained.history, evaluation, embedder, eval_source, error)
