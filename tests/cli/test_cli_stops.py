"""Nothing lost, one writer per folder: the real `tfdml train` / `tfdml export` in subprocesses, stopped with
SIGTERM, Ctrl-C or SIGKILL at the points that used to lose work, or started twice on one folder; then started
again to show what was kept.

The training runs are the default job cut to 2 epochs of 10 steps on 6 images per glyph, without export, with a
2 x 2 retrieval grid and 2 worst queries in the report.
"""

import json
import os
import shutil
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests import ROOT, cli_process
from tests.export.test_export import single_output_model
from tfdml import cli, pipeline
from tfdml import export as export_lib
from tfdml.callbacks import completed_epochs
from tfdml.config import default_config

JOB = cli_process.small_job(2, 10)


def _finish(proc, timeout=600):
    return proc.communicate(timeout=timeout)[0]


def _lock_holder(lock):
    """The record of the process holding `lock`, or None while there is none (or it is being written)."""
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.slow
def test_stops_lose_nothing_and_one_run_holds_the_folder(tmp_path):
    """The same command on one folder, five times:

    1. SIGTERM in training checkpoints and says how to resume (exit 143); while that run was stopped (SIGSTOP)
       holding the folder, a second run was refused (exit 2), naming it;
    2. started again, the run resumes; a Ctrl-C after the last epoch, before the report is complete, keeps the
       trained weights and leaves no half report;
    3. a run killed (SIGKILL) while it holds the folder leaves its lock; the same command takes the lock over,
       writes the report from the kept weights without training again, and clears the checkpoints."""
    report, checkpoints, lock = tmp_path / "r", tmp_path / "r" / "checkpoints", tmp_path / ".r.lock"
    first = cli_process.start(tmp_path, *JOB)
    assert cli_process.wait_for(first, cli_process.checkpointed_epoch(checkpoints, 1)), cli_process.shown(
        _finish(first)
    )
    first.send_signal(signal.SIGSTOP)  # holds the folder while the second starts
    try:
        second = cli_process.start(tmp_path, *JOB)
        out = _finish(second)
        holder = _lock_holder(lock)
    finally:
        first.send_signal(signal.SIGTERM)  # delivered once it continues, where it stopped
        first.send_signal(signal.SIGCONT)
    first_out = _finish(first)
    assert second.returncode == 2, cli_process.shown(out)
    assert holder["pid"] == first.pid
    assert (
        f"tfdml train: error: r is in use by tfdml train (pid {first.pid}, started {holder['started']}); wait for "
        "it to finish, stop it (started again, the run resumes), or give another --report-dir" in out
    )
    assert first.returncode == 143, cli_process.shown(first_out)
    assert "tfdml train: interrupted after epoch 1/2; run the same command to resume" in first_out
    assert "Traceback" not in first_out
    assert completed_epochs(checkpoints) == 1

    trained = checkpoints / pipeline.TRAINED_WEIGHTS
    proc = cli_process.start(tmp_path, *JOB)
    assert cli_process.wait_for(proc, trained.exists), cli_process.shown(_finish(proc))
    proc.send_signal(signal.SIGINT)
    out = _finish(proc)
    assert proc.returncode == 130, cli_process.shown(out)
    assert "resuming from epoch 2/2" in out and "Epoch 2/2" in out and "Epoch 1/2" not in out
    assert (
        "tfdml train: interrupted after training (2/2 epochs, kept in r/checkpoints), before the report was "
        "complete; run the same command to write the report in r" in out
    )
    assert not (report / "metrics.json").exists() and not (report / "model.keras").exists()
    assert completed_epochs(checkpoints) == 2 and trained.exists()
    kept = tmp_path / "kept.weights.h5"
    shutil.copy(trained, kept)

    killed = cli_process.start(tmp_path, *JOB)
    try:
        held = cli_process.wait_for(killed, lambda: (_lock_holder(lock) or {}).get("pid") == killed.pid)
        holder = _lock_holder(lock)
    finally:
        killed.kill()  # SIGKILL: no clean-up, the lock file stays
        killed_out = killed.communicate()[0]  # reaps it and closes its pipe
    assert held, cli_process.shown(killed_out)
    assert lock.exists() and completed_epochs(checkpoints) == 2

    proc = cli_process.start(tmp_path, *JOB)
    out = _finish(proc)
    assert proc.returncode == 0, cli_process.shown(out)
    assert (
        f"took over the lock of r left by tfdml train (pid {killed.pid}, started {holder['started']}), "
        "no longer running" in out
    )
    assert "training is complete (2 epoch(s) in r/checkpoints)" in out and "Epoch " not in out
    with open(report / "metrics.json") as f:
        metrics = json.load(f)
    assert len(metrics["history"]["loss"]) == 2 and metrics["epochs_this_run"] == 0
    assert not checkpoints.exists()
    assert sorted(os.listdir(tmp_path)) == ["kept.weights.h5", "r"]  # no half report, no lock left behind
    model = keras.saving.load_model(report / "model.keras", compile=False)
    reference = keras.models.clone_model(model)
    reference.load_weights(kept)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_a_stop_after_the_last_epoch_says_the_report_is_what_is_left(tmp_path, monkeypatch, capsys):
    """A Ctrl-C once the last epoch is checkpointed, before the trained weights are put aside: nothing is left
    to train, and the message says so, as the stopping-and-resuming guide writes it; the same command then
    writes the report without training."""
    import importlib

    train_stage = importlib.import_module("tfdml.pipeline.train")  # the module (tfdml.pipeline.train is a function)
    monkeypatch.chdir(tmp_path)
    real = train_stage.train

    def train_then_ctrl_c(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    job = [*JOB]
    job[job.index("--epochs") + 1] = "1"
    job[job.index("--steps-per-epoch") + 1] = "2"
    monkeypatch.setattr(train_stage, "train", train_then_ctrl_c)
    assert cli.main(job) == 130
    err = capsys.readouterr().err
    with open(os.path.join(ROOT, "docs", "guides", "stopping-and-resuming.md")) as f:
        guide = next(line.strip() for line in f if "tfdml train: interrupted after training" in line)
    assert guide == (
        "tfdml train: interrupted after training (10/10 epochs, kept in reports/glyphs_rll/checkpoints), before "
        "the report was complete; run the same command to write the report in reports/glyphs_rll"
    )
    assert err.endswith(guide.replace("10/10", "1/1").replace("reports/glyphs_rll", "r") + "\n"), err
    assert "after epoch" not in err and completed_epochs(tmp_path / "r" / "checkpoints") == 1
    monkeypatch.setattr(train_stage, "train", real)
    assert cli.main(job) == 0
    out = capsys.readouterr().out
    assert "Epoch " not in out and (tmp_path / "r" / "metrics.json").exists()


def _serves(version_dir):
    """The kept export loads and answers a request."""
    served = tf.saved_model.load(str(version_dir)).signatures["serving_default"]
    assert served(images=tf.zeros((2, 12, 12, 3), tf.uint8))["embedding"].shape == (2, 6)


@pytest.mark.slow
def test_a_second_export_is_refused_and_versions_never_collide(tmp_path):
    model_file = tmp_path / "m.keras"
    single_output_model().save(model_file)
    export = ["export", "--model", str(model_file), "--name", "x", "--base-dir", "ex"]
    lock = tmp_path / "ex" / ".x.lock"

    def lock_written():
        try:
            return json.loads(lock.read_text())
        except (OSError, ValueError):
            return None

    first = cli_process.start(tmp_path, *export)
    holder = cli_process.wait_for(first, lock_written)
    assert holder, cli_process.shown(_finish(first))
    first.send_signal(signal.SIGSTOP)
    try:
        second = cli_process.start(tmp_path, *export)
        out = _finish(second)
    finally:
        first.send_signal(signal.SIGCONT)
    first_out = _finish(first)
    assert second.returncode == 2, cli_process.shown(out)
    assert (
        f"tfdml export: error: ex/x is in use by tfdml export (pid {first.pid}, started {holder['started']}); "
        "wait for it to finish (the next export then takes the next version) or give another --name" in out
    )
    assert first.returncode == 0, first_out[-3000:]
    assert sorted(os.listdir(tmp_path / "ex" / "x")) == ["1"]
    _serves(tmp_path / "ex" / "x" / "1")
    assert cli.main(export[:-2] + ["--base-dir", str(tmp_path / "ex")]) == 0
    _serves(tmp_path / "ex" / "x" / "2")


@pytest.mark.slow
def test_an_export_that_finds_its_version_taken_takes_the_next(tmp_path, monkeypatch):
    """Two exports that chose the same next version (outside the CLI's lock): the second moves on."""
    from tfdml.export import savedmodel

    model = single_output_model()
    first = export_lib.export_saved_model(model, tmp_path, name="m")
    chosen = iter([1])
    real = savedmodel._next_version
    monkeypatch.setattr(savedmodel, "_next_version", lambda folder: next(chosen, None) or real(folder))
    second = export_lib.export_saved_model(model, tmp_path, name="m")
    assert (os.path.basename(first), os.path.basename(second)) == ("1", "2")
    assert export_lib.load_metadata(second)["version"] == 2 and export_lib.load_metadata(first)["version"] == 1


def test_a_stop_after_the_export_is_complete_is_no_failure(tmp_path, monkeypatch, capsys):
    from tfdml.cli import export as export_cli

    model_file = tmp_path / "m.keras"
    single_output_model().save(model_file)
    printed = export_cli._print_export

    def ctrl_c_then_print(*args):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the result is printed
        printed(*args)

    monkeypatch.setattr(export_cli, "_print_export", ctrl_c_then_print)
    rc = cli.main(["export", "--model", str(model_file), "--name", "x", "--base-dir", str(tmp_path / "ex")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert f"stop received after the export {tmp_path / 'ex' / 'x' / '1'} was complete; nothing was lost" in err
    _serves(tmp_path / "ex" / "x" / "1")


def test_a_finished_report_is_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config, said = default_config(), []
    assert pipeline.choose_report_dir(config, say=said.append) == "reports/glyphs_rll" and not said
    os.makedirs("reports/glyphs_rll")
    open("reports/glyphs_rll/metrics.json", "w").close()
    assert pipeline.choose_report_dir(config, say=said.append) == "reports/glyphs_rll-2"
    assert said == [
        "reports/glyphs_rll holds the report of an earlier run (kept); this run's report goes to "
        "reports/glyphs_rll-2 (choose with --report-dir; --overwrite replaces reports/glyphs_rll)"
    ]
    assert pipeline.choose_report_dir(config, overwrite=True, say=said.append) == "reports/glyphs_rll"
    # an unfinished run in the report folder is resumed there, not moved on
    os.makedirs("reports/glyphs_rll-2/checkpoints")
    open("reports/glyphs_rll-2/metrics.json", "w").close()
    open(f"reports/glyphs_rll-2/checkpoints/{pipeline.CONFIG_SNAPSHOT}", "w").close()
    assert pipeline.choose_report_dir(config, say=said.append) == "reports/glyphs_rll-2"

    def no_data(*args, **kwargs):
        raise AssertionError("data read before the report folder was checked")

    monkeypatch.setattr(pipeline.job, "load_sources", no_data)
    assert cli.main(["train", "--report-dir", "reports/glyphs_rll"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "tfdml train: error: report.dir (--report-dir): reports/glyphs_rll holds the report of a finished run, "
        "kept as a result; give another --report-dir, or add --overwrite to replace it\n"
    )


@pytest.mark.parametrize(
    "command, message",
    [
        (["train", "--report-dir", "/proc/tfdml/r"], "tfdml train: error: report.dir (--report-dir): cannot write in"),
        (["train", "--export-dir", "/proc/tfdml"], "tfdml train: error: export.base_dir (--export-dir): cannot write"),
        (["search", "--model", ".", "q.png", "--grid", "/proc/tfdml/g.png"], "tfdml search: error: --grid: cannot"),
        (["evaluate", "--embeddings", "e.npz", "--json", "/proc/tfdml/m.json"], "tfdml evaluate: error: --json: "),
        (["export", "--model", "e.npz", "--base-dir", "/proc/tfdml"], "tfdml export: error: --base-dir: cannot"),
        (["export", "--model", "e.npz", "--top-k", "0"], "tfdml export: error: --top-k: must be an integer in [1, "),
        (["export", "--model", "e.npz", "--match-precision", "1.5"], "tfdml export: error: --match-precision: must be"),
    ],
)
def test_outputs_and_options_are_checked_before_the_work(command, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # an input file that exists and is an .npz archive (its arrays are read only after the checks)
    np.savez(tmp_path / "e.npz", embeddings=np.eye(2, dtype=np.float32), labels=np.arange(2))

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the outputs and options were checked")

    monkeypatch.setattr(pipeline.job, "load_sources", no_work)
    monkeypatch.setattr(keras.saving, "load_model", no_work)
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.parametrize("atomic", [True, False])
def test_the_report_moves_into_place_whole(atomic, tmp_path, monkeypatch):
    """The new report replaces the folder in one step (or, without an atomic exchange, in renames that a rerun
    completes); the old folder and the checkpoints inside it go only afterwards."""
    if not atomic:
        monkeypatch.setattr(pipeline.folder, "_exchange", lambda a, b: False)
    report = tmp_path / "r"
    (report / "checkpoints").mkdir(parents=True)
    (report / "checkpoints" / "state").write_text("trained")
    (report / "old.png").write_text("old")
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "metrics.json").write_text("{}")
    pipeline.publish_report(str(staging), str(report), str(report / "checkpoints"))
    assert sorted(os.listdir(report)) == ["metrics.json"] and sorted(os.listdir(tmp_path)) == ["r"]

    # a stop between the renames of the fallback leaves the old folder aside: the next run puts it back
    aside = tmp_path / ".r.previous"
    os.rename(report, aside)
    assert pipeline.choose_report_dir(
        default_config().replace(report=default_config().report.replace(dir=str(report))), overwrite=True
    ) == str(report)
    assert sorted(os.listdir(report)) == ["metrics.json"] and not aside.exists()
