"""The report folder: where a run's report goes, the paths the job derives, fresh start or resume of an
unfinished run, and the report moved into place in one step (`renameat2(RENAME_EXCHANGE)` where the system
has it)."""

import ctypes
import dataclasses
import errno
import glob
import json
import os
import shutil
import tempfile

import yaml

from tfdml import durable
from tfdml.callbacks import completed_epochs, restore_point
from tfdml.config import ConfigError, default_report_dir, differences, output_dir_problem
from tfdml.locks import FolderLock

# Sections that do not change what is trained: a resumed run may change them.
_RESUMABLE_CHANGES = ("description", "paper_target", "evaluation", "export", "report", "training.eval_every")
CONFIG_SNAPSHOT = "tfdml_config.yaml"


def resolve_paths(config):
    """A copy of `config` with the derived paths filled (report dir, checkpoints, export name) and the image
    folders of `data` made absolute: the report's config.yaml and the export's metadata record where the
    job's evaluation data is, for `tfdml evaluate / export / search` run from any working directory."""
    report_dir = config.report.dir or default_report_dir(config)
    data = config.data
    if data.source == "folder":
        data = data.replace(
            **{
                key: os.path.abspath(getattr(data, key))
                for key in ("path", "eval_path")
                if getattr(data, key) is not None
            }
        )
    ala = config.ala
    if ala.val_path is not None:
        ala = ala.replace(val_path=os.path.abspath(ala.val_path))
    return dataclasses.replace(
        config,
        data=data,
        ala=ala,
        report=config.report.replace(dir=report_dir),
        training=config.training.replace(
            checkpoint_dir=config.training.checkpoint_dir or os.path.join(report_dir, "checkpoints")
        ),
        export=config.export.replace(name=config.export.name or config.name),
    )


def _changed_keys(old, new):
    return [
        key for key in differences(old, new) if not any(key == s or key.startswith(s + ".") for s in _RESUMABLE_CHANGES)
    ]


def finished_report(report_dir):
    """Whether `report_dir` holds the report of a finished run (its metrics.json, and no unfinished run in
    its checkpoints folder)."""
    return os.path.exists(os.path.join(report_dir, "metrics.json")) and not os.path.exists(
        os.path.join(report_dir, "checkpoints", CONFIG_SNAPSHOT)
    )


def choose_report_dir(config, overwrite=False, say=print):
    """Where this run's report goes: a finished run's report is a result and is kept.

    With `report.dir` set, a folder holding a finished report is refused unless `overwrite`; by default
    (`reports/<name>`) the run goes to the first of `reports/<name>`, `reports/<name>-2`, ... that holds no
    finished report (an unfinished run there is resumed), said in one line."""
    if config.report.dir is not None:
        _recover_report(config.report.dir)
        if finished_report(config.report.dir) and not overwrite:
            raise ConfigError(
                f"report.dir: {config.report.dir} holds the report of a finished run, kept as a result; give "
                "another --report-dir, or add --overwrite to replace it"
            )
        return config.report.dir
    base = candidate = default_report_dir(config)
    number = 1
    while True:
        _recover_report(candidate)
        if overwrite or not finished_report(candidate):
            break
        number += 1
        candidate = f"{base}-{number}"
    if candidate != base:
        say(
            f"{base} holds the report of an earlier run (kept); this run's report goes to {candidate} "
            f"(choose with --report-dir; --overwrite replaces {base})"
        )
    return candidate


def prepare_report_dir(config, restart=False, say=print):
    """Creates the report directory and decides between a fresh start and a resume.

    An unfinished run in `training.checkpoint_dir` resumes only with the configuration it was started
    with (apart from evaluation, export and report settings); otherwise this raises a `ConfigError` naming
    the keys that differ. `restart=True` deletes that run's checkpoints first. Returns the number of epochs
    already done."""

    checkpoints = config.training.checkpoint_dir
    done = completed_epochs(checkpoints) if restart else restore_point(checkpoints, say)
    if done and restart:
        shutil.rmtree(checkpoints)
        say(
            f"--restart: removed the unfinished run's checkpoints ({done} epoch(s) done) in {checkpoints}; "
            "training from epoch 1"
        )
        done = 0
    if done:
        snapshot = os.path.join(checkpoints, CONFIG_SNAPSHOT)
        if not os.path.exists(snapshot):
            raise ConfigError(
                f"{checkpoints} holds an unfinished run without a record of its configuration; "
                "start afresh with --restart or use another --report-dir"
            )
        with open(snapshot) as f:
            changed = _changed_keys(yaml.safe_load(f), config.to_dict())
        if changed:
            raise ConfigError(
                f"{checkpoints} holds an unfinished run ({done} epoch(s) done) with another configuration "
                f"({', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'}); run it again unchanged "
                "to resume, add --restart to discard it, or use another --report-dir"
            )
        if done >= config.training.epochs:
            say(
                f"training is complete ({done} epoch(s) in {checkpoints}); the run stopped before its report: "
                "writing the report"
            )
        else:
            say(
                f"resuming from epoch {done + 1}/{config.training.epochs} ({done} epoch(s) restored from {checkpoints})"
            )
    else:
        os.makedirs(checkpoints, exist_ok=True)
        path = os.path.join(checkpoints, CONFIG_SNAPSHOT)
        with durable.storage_errors(path):
            durable.write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))
    return done


def _sibling(report_dir, kind):
    """`<parent>/.<name>.<kind>`: hidden beside the report folder, on the same file system."""
    report_dir = os.path.abspath(report_dir)
    return os.path.join(os.path.dirname(report_dir), f".{os.path.basename(report_dir)}.{kind}")


def _recover_report(report_dir):
    """Puts back a report folder that a stop left aside between the renames of `publish_report` (systems
    without an atomic exchange)."""
    previous = _sibling(report_dir, "previous")
    if os.path.isdir(previous) and not os.path.exists(report_dir):
        os.rename(previous, report_dir)


def staging_dir(report_dir):
    """A fresh folder beside `report_dir` for the report being written; those of stopped runs are removed
    (the caller holds the report folder's lock, so none is being written)."""
    prefix = os.path.basename(_sibling(report_dir, "partial")) + "-"
    parent = os.path.dirname(_sibling(report_dir, "partial"))
    for partial in glob.glob(os.path.join(glob.escape(parent), glob.escape(prefix) + "*")):
        shutil.rmtree(partial, ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=prefix, dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # the report folder's permissions as os.makedirs gives them
    return staging


def _exchange(a, b):
    """Swaps the folders `a` and `b` in one step (Linux `renameat2(RENAME_EXCHANGE)`); False where the
    system cannot."""
    rename = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename is None:
        return False
    at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE
    if rename(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EPERM):  # file system or kernel without it
        return False
    raise OSError(code, os.strerror(code), b)


def publish_report(staging, report_dir, checkpoint_dir):
    """Moves the complete report in `staging` into `report_dir` in one step, then clears the run's
    checkpoints (and what `report_dir` held before): a stop at any point leaves either the unfinished run,
    which a rerun takes to its report, or the complete report. The report's files reach the disk before
    the folder is swapped in (a power cut cannot leave a report of empty files)."""
    durable.sync_tree(staging)
    if not os.path.exists(report_dir):
        os.rename(staging, report_dir)
    elif not _exchange(staging, report_dir):
        previous = _sibling(report_dir, "previous")  # _recover_report puts it back after a stop here
        os.rename(report_dir, previous)
        os.rename(staging, report_dir)
        os.rename(previous, staging)
    durable.sync_folder(os.path.dirname(os.path.abspath(report_dir)))
    shutil.rmtree(staging, ignore_errors=True)  # the old folder, with the checkpoints inside by default
    if os.path.exists(checkpoint_dir):
        shutil.rmtree(checkpoint_dir, ignore_errors=True)


def check_outputs(config):
    """`ConfigError` naming the key for an output folder of the (resolved) job that cannot be written: a
    file in the way or no write permission. Run before anything is trained."""
    outputs = [("report.dir", config.report.dir), ("training.checkpoint_dir", config.training.checkpoint_dir)]
    if config.export.enabled:
        outputs.append(("export.base_dir", os.path.join(config.export.base_dir, config.export.name)))
    for key, path in outputs:
        problem = output_dir_problem(path, writable=True)
        if problem:
            raise ConfigError(f"{key}: {problem}")


def lock_report(config, say):
    """The report folder's lock (None for the non-chief workers of a multi-worker job, which write no
    report)."""
    task = (json.loads(os.environ.get("TF_CONFIG") or "{}") or {}).get("task") or {}
    if task.get("type") not in (None, "chief") and not (task.get("type") == "worker" and task.get("index") == 0):
        return None
    lock = FolderLock(
        config.report.dir,
        "tfdml train",
        say=say,
        advice="wait for it to finish, stop it (started again, the run resumes), or give another --report-dir",
    )
    return lock.acquire()
