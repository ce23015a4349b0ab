"""Faults beyond a stop: a damaged checkpoint, a full disk, a flipped byte in an export, in-process.

The training runs are `tests.fault_shim.JOB` (the default job cut to 4 epochs of 3 steps, without export); each
damaged or refused run is compared, once rerun, with one uninterrupted run of the same job (its figures and its
training history, equal to the last bit). The disk faults come from `tests.fault_shim.DiskShim`.
"""

import errno
import json
import logging
import os
import re

import pytest

from tests.fault_shim import CODES, JOB, KIND, DiskShim, damage, kept_checkpoints_problem, results
from tfdml import cli, durable
from tfdml.callbacks import checkpoint as checkpoint_lib


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory):
    """`(figures and history, bytes of its durable writes)` of the job run without a stop."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        shim = DiskShim().install(patch)
        assert cli.main(JOB) == 0
    return results(folder / "r"), shim.written


@pytest.fixture(scope="module")
def uninterrupted(measured_run):
    return measured_run[0]


def _stop_after_epoch(monkeypatch, epoch):
    """The checkpoint callback stops the run (Ctrl-C) once `epoch` is checkpointed."""
    real = checkpoint_lib.CheckpointSequence.on_epoch_end

    def on_epoch_end(self, index, logs=None):
        real(self, index, logs)
        if index + 1 == epoch:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_lib.CheckpointSequence, "on_epoch_end", on_epoch_end)


@pytest.mark.slow
def test_a_truncated_latest_checkpoint_resumes_from_the_one_before(uninterrupted, tmp_path, monkeypatch, capsys):
    """Stopped after epoch 3 of 4, its checkpoint cut to half (what a full disk or a power cut leaves): the
    rerun names it in one line, resumes from epoch 2 and ends where the uninterrupted run ends (a flipped
    byte is found the same way: `test_with_no_checkpoint_left_the_run_starts_again`)."""
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patch:
        _stop_after_epoch(patch, 3)
        assert cli.main(JOB) == 130
    checkpoints = tmp_path / "r" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("epoch-*")) == ["epoch-0002.weights.h5", "epoch-0003.weights.h5"]
    latest = checkpoints / "epoch-0003.weights.h5"
    size = latest.stat().st_size
    os.truncate(latest, size // 2)
    problem = f"holds {size // 2} bytes, not the {size} written (truncated or overwritten)"
    capsys.readouterr()
    assert cli.main(JOB) == 0
    out = capsys.readouterr().out
    said = f"the checkpoint of epoch 3, r/checkpoints/epoch-0003.weights.h5, {problem}; resuming from the checkpoint"
    assert f"{said} of epoch 2 before it\n" in out, out
    assert "resuming from epoch 3/4 (2 epoch(s) restored from r/checkpoints)" in out
    assert "Epoch 3/4" in out and "Epoch 2/4" not in out and "Traceback" not in out
    assert results(tmp_path / "r") == uninterrupted


def test_with_no_checkpoint_left_the_run_starts_again(tmp_path, monkeypatch):
    """The only checkpoint damaged: said in one line, the run trains from epoch 1."""
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "epoch-0001.weights.h5").write_bytes(b"weights")
    record = durable.file_record(folder / "epoch-0001.weights.h5")
    manifest = {"epoch": 1, "checkpoints": [dict(record, epoch=1, file="epoch-0001.weights.h5")]}
    (folder / checkpoint_lib.METADATA_FILE).write_text(json.dumps(manifest))
    (folder / "epoch-0001.weights.h5").write_bytes(b"weighTs")
    said = []
    assert checkpoint_lib.restore_point(folder, said.append) == 0
    assert said == [
        f"the checkpoint of epoch 1, {folder}/epoch-0001.weights.h5, differs from its checksum (sha256) recorded "
        "when it was written: it is damaged; no earlier checkpoint is kept: training starts again from epoch 1"
    ]
    assert checkpoint_lib.completed_epochs(folder) == 0 and not (folder / "epoch-0001.weights.h5").exists()


@pytest.mark.slow
def test_a_full_disk_in_training_keeps_the_epochs_done(uninterrupted, tmp_path, monkeypatch, capsys):
    """No space left while epoch 3's checkpoint is written: one line naming the file and the free space, exit
    status 2, epochs 1 and 2 kept; once there is space the same command resumes from epoch 3."""
    monkeypatch.chdir(tmp_path)
    target = "r/checkpoints/epoch-0003.weights.h5"
    real = durable.publish

    def full_disk(written, final):
        if final.endswith("epoch-0003.weights.h5"):
            with open(written, "r+b") as f:
                f.truncate(os.path.getsize(written) // 3)  # what the disk took before it was full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), written)
        real(written, final)

    with monkeypatch.context() as patch:
        patch.setattr(durable, "publish", full_disk)
        assert cli.main(JOB) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"tfdml train: error: cannot write {target}: no space left on the device (")
    assert "MiB free, about " in err and "MiB needed); what was finished is kept: free space" in err
    assert checkpoint_lib.completed_epochs(tmp_path / "r" / "checkpoints") == 2
    assert not list((tmp_path / "r" / "checkpoints").glob(".tmp-*"))  # nothing half-written left
    assert cli.main(JOB) == 0
    assert "resuming from epoch 3/4" in capsys.readouterr().out
    assert results(tmp_path / "r") == uninterrupted


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs mounted at `tmp_path / "disk"` (root only; unmounted afterwards)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); the shim tests above cover the same writes")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
def test_a_real_full_disk_in_training(small_disk, uninterrupted, monkeypatch, capsys):
    """The report folder on a 3 MiB file system: the checkpoint that does not fit is refused in one line
    before it is written, and once the file system is grown the same command resumes and finishes."""
    import subprocess

    monkeypatch.chdir(small_disk)
    assert cli.main(JOB) == 2
    line = _one_error_line(capsys.readouterr().err, "train")
    assert "no space left on the device (" in line and "MiB needed); what was finished is kept" in line, line
    done = checkpoint_lib.completed_epochs(small_disk / "r" / "checkpoints")
    assert 1 <= done < 4 and kept_checkpoints_problem(small_disk / "r" / "checkpoints") is None
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    assert cli.main(JOB) == 0
    assert f"resuming from epoch {done + 1}/4" in capsys.readouterr().out
    assert results(small_disk / "r") == uninterrupted


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Version 1 of model "digits" with the exact index of the digits 5-9 (an embedded data set)."""
    from tests.cli.test_cli_retrieval import SIZE, digits_model
    from tfdml import data
    from tfdml.export import export_saved_model

    base = tmp_path_factory.mktemp("models")
    export_saved_model(
        digits_model(),
        base,
        preprocess="unit",
        image_size=(SIZE, SIZE),
        training_config={"data": {"source": "digits", "eval_split": "test"}},
        gallery=data.digits("test"),
        index_mode="exact",
    )
    return base / "digits" / "1"


def test_an_export_records_the_checksum_of_every_file(exported):
    from tfdml.export import METADATA_FILE, load_metadata

    files = load_metadata(exported)["files"]
    on_disk = sorted(
        os.path.relpath(os.path.join(folder, name), exported).replace(os.sep, "/")
        for folder, _, names in os.walk(exported)
        for name in names
    )
    assert sorted(files) == [name for name in on_disk if name != METADATA_FILE]
    assert "saved_model.pb" in files and "assets.extra/tfdml_index/tfdml_index.json" in files
    for name, record in files.items():
        assert durable.file_record(exported / name) == record, name


@pytest.mark.parametrize("command", ["search", "evaluate"])
def test_a_flipped_byte_in_the_index_is_refused_by_name(command, exported, tmp_path, capsys):
    """One bit of the index's labels flipped after the export: `tfdml search` and `tfdml evaluate` name the
    file in one line (exit status 2) and load nothing."""
    import shutil

    version = tmp_path / "digits" / "1"
    shutil.copytree(exported, version)
    damaged = version / "assets.extra" / "tfdml_index" / "labels.npy"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0x01
    damaged.write_bytes(data)
    query = tmp_path / "q.png"
    query.write_bytes(b"not read: the export is checked first")
    argv = {
        "search": ["search", "--model", str(version), str(query)],
        "evaluate": ["evaluate", "--model", str(version)],
    }
    assert cli.main(argv[command]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"tfdml {command}: error: {damaged} differs from its checksum (sha256) recorded when it was written: it is "
        f"damaged; the exported version {version} is not loaded: export it again\n"
    )
    assert "Traceback" not in captured.out


# ---- the seeded fault suite: drawn moments, drawn errors --------------------------------------------------------

SEED = 0


def _one_error_line(err, command):
    """The one error line of a refused write, the last on stderr (notes may come before it)."""
    lines = err.strip().splitlines()
    assert [line for line in lines if ": error: " in line] == lines[-1:], err
    assert lines[-1].startswith(f"tfdml {command}: error: cannot write ") and "Traceback" not in err, err
    return lines[-1]


@pytest.mark.slow
def test_disk_faults_at_drawn_moments_of_training(measured_run, tmp_path, monkeypatch, capsys):
    """SQLite's way, a handful of draws: the disk fills up, fails or turns read-only after a drawn number of
    the run's bytes; each time one line (exit status 2), then the rerun with the disk back ends where the
    uninterrupted run ends (`benchmarks/faults/` runs hundreds of draws)."""
    import numpy as np

    uninterrupted, total = measured_run
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(SEED)
    for draw in range(1):  # each draw is a run and its rerun: the benchmark runs hundreds
        folder = f"r{draw}"
        budget, code = int(rng.integers(0, total)), int(rng.choice(CODES))
        with monkeypatch.context() as patch:
            shim = DiskShim(budget, code).install(patch)
            assert cli.main([*JOB[:-1], folder]) == 2, (budget, code)
        line = _one_error_line(capsys.readouterr().err, "train")
        assert KIND[code] in line and shim.failed is not None, line
        assert kept_checkpoints_problem(os.path.join(folder, "checkpoints")) is None
        assert not os.path.exists(os.path.join(folder, "metrics.json"))  # no report, or no half one
        assert cli.main([*JOB[:-1], folder]) == 0, (budget, code)
        assert results(tmp_path / folder) == uninterrupted, (budget, code)


@pytest.mark.slow
def test_disk_faults_at_drawn_moments_of_an_export(tmp_path, monkeypatch, capsys):
    """`tfdml export` on a disk that fails after a drawn number of its bytes: one line (exit status 2), no
    version and no temporary folder left; the same command then writes version 1, which loads."""
    import numpy as np

    from tests.export.test_export import single_output_model
    from tfdml.export import ExportedEmbedder

    single_output_model().save(tmp_path / "m.keras")
    export = ["export", "--model", str(tmp_path / "m.keras"), "--name", "x", "--base-dir", str(tmp_path / "ex")]
    with monkeypatch.context() as patch:
        measured = DiskShim().install(patch)
        assert cli.main([*export[:-1], str(tmp_path / "measured")]) == 0
    assert measured.written > 0
    budget, code = int(np.random.default_rng(SEED).integers(0, measured.written)), int(CODES[SEED % 3])
    with monkeypatch.context() as patch:
        DiskShim(budget, code).install(patch)
        assert cli.main(export) == 2
    line = _one_error_line(capsys.readouterr().err, "export")
    assert KIND[code] in line, line
    assert os.listdir(tmp_path / "ex" / "x") == []
    assert cli.main(export) == 0
    assert ExportedEmbedder(tmp_path / "ex" / "x").version == 1


def test_a_refused_write_of_a_beam_worker_is_one_line(tmp_path, monkeypatch, capsys, caplog):
    """A shard's write refused inside a Beam worker: `tfdml embed` says it in its one line, and Beam's log of
    the worker's error (its traceback, on stderr before the runner raises it again) is left out."""
    pytest.importorskip("apache_beam", reason='tfdml embed needs the beam extra: pip install -e ".[beam]"')
    import numpy as np

    from tests.embed_checks import write_images
    from tests.export.test_export import single_output_model
    from tfdml.export import export_saved_model

    version = export_saved_model(single_output_model(), tmp_path / "exported")
    write_images(tmp_path / "images", np.random.default_rng(0), classes=2, per_class=3)
    output = tmp_path / "out"
    embed = ["embed", "--model", version, "--image-dir", str(tmp_path / "images"), "--output", str(output)]
    with monkeypatch.context() as patch:
        shim = DiskShim(0, errno.EIO).install(patch)  # the first write, a shard's in a worker, fails
        assert cli.main(embed) == 2
    assert shim.failed.endswith(".tfrecord.tmp"), shim.failed
    line = _one_error_line(capsys.readouterr().err, "embed")
    assert line.startswith(f"tfdml embed: error: cannot write {output}: input/output error"), line
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
    assert not output.exists()


def test_drawn_damage_to_an_export_is_named(exported, tmp_path):
    """A byte flipped, or the file cut short, in a drawn file of the export at a drawn place: loading it names
    that file, each time."""
    import shutil

    import numpy as np

    from tfdml.export import ExportedEmbedder, load_metadata

    files = sorted(load_metadata(exported)["files"])
    rng = np.random.default_rng(SEED)
    for draw in range(12):
        version = tmp_path / str(draw) / "digits" / "1"
        shutil.copytree(exported, version)
        damaged = version / files[int(rng.integers(len(files)))]
        damage(damaged, rng)
        with pytest.raises(durable.DamagedFileError, match=f"^{re.escape(str(damaged))} (differs|holds)"):
            ExportedEmbedder(version)
