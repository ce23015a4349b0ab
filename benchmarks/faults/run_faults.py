"""Fault injection at hundreds of drawn moments, SQLite's way: each draw breaks a run, then checks what is left.

Kinds of draw (seeded; each draw gets its own generator from the seed and its number):

- `train_disk`: `tfdml train` (`tests.fault_shim.JOB`, in this process) on a disk that fails after a drawn
  number of the run's bytes (uniform over the uninterrupted run's durable writes) with a drawn error (ENOSPC,
  EIO, EROFS; `tests.fault_shim.DiskShim`). Passes when the run ends in one `cannot write` line naming the
  error with exit status 2, every checkpoint its manifest lists passes its checksum, no report is in place,
  and the rerun on a sound disk ends with the uninterrupted run's figures and training history, equal to the
  last bit.
- `train_kill`: `python -m tfdml train` in a subprocess, SIGKILLed after a drawn delay (uniform over the
  uninterrupted run's time in a subprocess). Passes when the rerun ends with the uninterrupted run's results
  (where the kill came once the report was in place, which a rerun keeps as a result: that report's).
- `checkpoint_damage`: `tfdml train` stopped after a drawn epoch (1-3 of 4); the latest checkpoint is cut at a
  drawn length or has a drawn bit flipped. Passes when the rerun names it in one line, resumes from the epoch
  before it and ends with the uninterrupted run's results.
- `export_damage`: a drawn file of an export (SavedModel, variables, index, gallery arrays) cut at a drawn
  length or with a drawn bit flipped. Passes when `ExportedEmbedder` (what `tfdml search` and `tfdml evaluate`
  load) refuses it naming that file.
- `export_disk`: `tfdml export` of a small saved Keras model (in this process) on a disk that fails after a
  drawn number of the export's bytes with a drawn error. Passes when it ends in one `cannot write` line
  naming the error with exit status 2, no version and no temporary folder is left in the model's folder, and
  the same command then writes version 1, which `ExportedEmbedder` loads.
- `export_kill`: `python -m tfdml export` of that model in a subprocess, SIGKILLed after a drawn delay
  (uniform over the uninterrupted export's time in a subprocess). Passes when every version the kill left
  loads (none half-written is ever a version), the rerun's newest version loads and no staging folder of
  the killed export is left (the rerun removes it).
- `embed_disk`: `tfdml embed` (Beam's DirectRunner, in this process) of a small folder of generated images
  with that export into 2 shards, on a disk that fails after a drawn number of the run's bytes with a drawn
  error. Passes when it ends in one `cannot write` line naming the error with exit status 2, no output
  folder and no staging folder is left, and the rerun writes the uninterrupted run's shards (ids and
  embeddings, equal to the last bit).
- `embed_kill`: `python -m tfdml embed` in a subprocess, SIGKILLed after a drawn delay (uniform over the
  uninterrupted run's time in a subprocess). Passes when the output folder is absent or complete (its
  manifest written, its shards the uninterrupted run's) and the rerun (with `--overwrite` where the output
  exists) writes the uninterrupted run's shards, removing the killed run's staging folder. The two `embed`
  kinds need the beam extra; without it they
  are left out, which is said.

    nice -n 15 python -m benchmarks.faults.run_faults --minutes 26 --draws 5000 --out benchmarks/faults/results.json
    python -m benchmarks.faults.run_faults --table benchmarks/faults/results.json > benchmarks/faults/table.md

The draws cycle through the kinds in the proportions `--mix` gives (one count per kind, each kind's draws
spread evenly over the cycle) until `--draws` or `--minutes` is reached; `results.json` records each kind's
draws, failures, seconds and every failure's draw, and is rewritten after each draw (a stopped run keeps what
it counted).
"""

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from tests import cli_process
from tests.fault_shim import CODES, JOB, KIND, DiskShim, damage, kept_checkpoints_problem, results
from tfdml import cli, durable
from tfdml.callbacks import checkpoint as checkpoint_lib

TRAIN_KINDS = ("train_disk", "train_kill", "checkpoint_damage")
EMBED_KINDS = ("embed_disk", "embed_kill")
CLI_EXPORT_KINDS = ("export_disk", "export_kill", *EMBED_KINDS)  # those that need `tfdml export`'s reference
KINDS = (*TRAIN_KINDS, "export_damage", "export_disk", "export_kill", *EMBED_KINDS)
MIX = (2, 2, 2, 100, 6, 6, 6, 6)


def _cli(reference, argv, shim=None):
    """`tfdml ARGV` in this process, in the work folder, on `shim`'s disk: `(exit status, stdout, stderr)`, the
    log records that reach the root logger (a library's, shown on stderr) in stderr."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        patch.chdir(reference.work)
        patch.setattr(logging.root, "handlers", [logging.StreamHandler(err)])
        if shim is not None:
            shim.install(patch)
        status = cli.main(argv)
    return status, out.getvalue(), err.getvalue()


def _killed(reference, argv, delay):
    """`python -m tfdml ARGV` in a subprocess, SIGKILLed after `delay` seconds unless it ended first: its exit
    status (`-SIGKILL` when killed)."""
    proc = cli_process.start(reference.work, *argv)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return proc.returncode


def _process_seconds(reference, argv):
    """The time `python -m tfdml ARGV` takes in a subprocess, run to its end."""
    started = time.perf_counter()
    proc = cli_process.start(reference.work, *argv)
    out = proc.communicate()[0]
    assert proc.returncode == 0, out[-2000:]
    return time.perf_counter() - started


def _disk_fault(reference, rng, argv, command, total):
    """`tfdml ARGV` in this process on a disk that fails after a drawn number of `total` bytes with a drawn
    error: `(what was drawn, what is wrong with the refusal or None)`."""
    budget, code = int(rng.integers(0, total)), int(rng.choice(CODES))
    shim = DiskShim(budget, code)
    status, _, err = _cli(reference, argv, shim)
    what, lines = f"budget {budget}, errno {code}", err.strip().splitlines()
    errors = [line for line in lines if f"tfdml {command}: error: " in line]
    refused = bool(lines) and errors == lines[-1:] and lines[-1].startswith(f"tfdml {command}: error: cannot write ")
    if status != 2 or not refused or KIND[code] not in lines[-1] or "Traceback" in err:
        return what, f"exit {status}, {err.strip()[-300:]!r}"
    return what, None if shim.failed else "the disk never failed"


def _temporary(folder):
    """The temporary files and folders (`.tmp-...`) under `folder`."""
    return sorted(name for _, names, files in os.walk(folder) for name in names + files if name.startswith(".tmp-"))


def _left_problem(what, draw_folder):
    """The temporary files and folders a kill left that its rerun did not remove (a staging folder holds its
    disk space for good), or None."""
    left = _temporary(draw_folder)
    return f"{what}: the rerun left {', '.join(left)}" if left else None


class Reference:
    """What the uninterrupted runs of the kinds asked for write and take: their results, bytes and times in
    a subprocess, an export to damage, a Keras model to export and images to embed."""

    def __init__(self, work, kinds):
        self.work, self.figures = work, {}
        if "export_damage" in kinds:
            self.export = self._export(work)
        if set(kinds) & set(TRAIN_KINDS):
            self.bytes = self._measured(_job("reference"))
            self.results = results(os.path.join(work, "reference"))
            self.process_seconds = _process_seconds(self, _job("reference_process"))
            self.figures.update(reference_bytes=self.bytes, reference_process_seconds=self.process_seconds)
        if set(kinds) & set(CLI_EXPORT_KINDS):
            from tests.export.test_export import single_output_model

            self.keras_model = os.path.join(work, "m.keras")
            single_output_model().save(self.keras_model)
            self.export_bytes = self._measured(self.export_argv("export_reference"))
            self.version = os.path.join(work, "export_reference", "x", "1")
            self.export_seconds = _process_seconds(self, self.export_argv("export_reference_process"))
            self.figures.update(export_bytes=self.export_bytes, export_process_seconds=self.export_seconds)
        if set(kinds) & set(EMBED_KINDS):
            from tests.embed_checks import write_images

            self.images = os.path.join(work, "images")
            write_images(pathlib.Path(self.images), np.random.default_rng(0), classes=3, per_class=6)
            self.embed_bytes = self._measured(self.embed_argv("embed_reference"))
            self.shards = _shards(os.path.join(work, "embed_reference"))
            self.embed_seconds = _process_seconds(self, self.embed_argv("embed_reference_process"))
            assert _shards(os.path.join(work, "embed_reference_process")) == self.shards, "embed is not repeatable"
            self.figures.update(embed_bytes=self.embed_bytes, embed_process_seconds=self.embed_seconds)
        self.figures = {key: round(value, 1) for key, value in self.figures.items()}

    def _measured(self, argv):
        """The bytes of the durable writes of `tfdml ARGV` run to its end in this process."""
        shim = DiskShim()
        status, _, err = _cli(self, argv, shim)
        assert status == 0, err
        return shim.written

    def export_argv(self, base):
        return ["export", "--model", self.keras_model, "--name", "x", "--base-dir", os.path.join(self.work, base)]

    def embed_argv(self, output):
        output = os.path.join(self.work, output)
        return ["embed", "--model", self.version, "--image-dir", self.images, "--num-shards", "2", "--output", output]

    @staticmethod
    def _export(work):
        from tests.cli.test_cli_retrieval import SIZE, digits_model
        from tfdml import data
        from tfdml.export import export_saved_model

        return export_saved_model(
            digits_model(),
            os.path.join(work, "models"),
            preprocess="unit",
            image_size=(SIZE, SIZE),
            gallery=data.digits("test"),
            index_mode="exact",
        )


def _job(folder):
    return [*JOB[:-1], folder]


def train_disk(reference, rng, folder):
    what, problem = _disk_fault(reference, rng, _job(folder), "train", reference.bytes)
    if problem:
        return f"{what}: {problem}"
    problem = kept_checkpoints_problem(os.path.join(reference.work, folder, "checkpoints"))
    if problem or os.path.exists(os.path.join(reference.work, folder, "metrics.json")):
        return f"{what}: left {problem or 'a report'}"
    return _rerun_matches(reference, folder, what)


def _rerun_matches(reference, folder, what, expect=None):
    status, out, err = _cli(reference, _job(folder))
    if status != 0:
        return f"{what}: the rerun exited {status}: {err.strip()[-300:]!r}"
    if expect is not None and not re.search(expect, out):
        return f"{what}: the rerun did not say {expect!r}"
    if results(os.path.join(reference.work, folder)) != reference.results:
        return f"{what}: the rerun's results differ from the uninterrupted run's"
    return None


def train_kill(reference, rng, folder):
    from tfdml.pipeline.folder import finished_report

    delay, report = float(rng.uniform(0, reference.process_seconds)), os.path.join(reference.work, folder)
    # Finished first, or killed once its report was in place (which a rerun refuses, kept as a result): its own
    # report is the one to compare.
    if _killed(reference, _job(folder), delay) == 0 or finished_report(report):
        same = results(report) == reference.results
        return None if same else f"finished before the kill at {delay:.2f} s with other results"
    return _rerun_matches(reference, folder, f"killed after {delay:.2f} s")


def checkpoint_damage(reference, rng, folder):
    epoch, flip = int(rng.integers(1, 4)), bool(rng.random() < 0.5)
    real = checkpoint_lib.CheckpointSequence.on_epoch_end

    def on_epoch_end(self, index, logs=None):
        real(self, index, logs)
        if index + 1 == epoch:
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint_lib.CheckpointSequence, "on_epoch_end", on_epoch_end)
        status, _, err = _cli(reference, _job(folder))
    if status != 130:
        return f"stop after epoch {epoch}: exit {status}: {err.strip()[-300:]!r}"
    latest = os.path.join(reference.work, folder, "checkpoints", f"epoch-{epoch:04d}.weights.h5")
    place, _ = damage(latest, rng, flip)
    what = f"epoch {epoch}, {'bit flipped' if flip else 'cut'} at byte {place}"
    before = f"resuming from the checkpoint of epoch {epoch - 1} before it" if epoch > 1 else "starts again"
    return _rerun_matches(reference, folder, what, expect=f"the checkpoint of epoch {epoch}, .*; .*{before}")


def export_damage(reference, rng, folder):
    from tfdml.export import ExportedEmbedder, load_metadata

    files = sorted(load_metadata(reference.export)["files"])
    version = os.path.join(reference.work, folder, "digits", "1")
    shutil.copytree(reference.export, version)
    name = files[int(rng.integers(len(files)))]
    path = os.path.join(version, name)
    place, flip = damage(path, rng)
    what = f"{name} {'bit flipped' if flip else 'cut'} at byte {place}"
    try:
        ExportedEmbedder(version)
    except durable.DamagedFileError as error:
        return None if str(error).startswith(path + " ") else f"{what}: named another file: {error}"
    finally:
        shutil.rmtree(os.path.join(reference.work, folder), ignore_errors=True)
    return f"{what}: loaded"


def _versions_problem(model_dir):
    """What is wrong with the versions in `model_dir` (one that does not load), or None; and the newest."""
    from tfdml.export import ExportedEmbedder

    versions = sorted(int(name) for name in os.listdir(model_dir) if name.isdigit()) if os.path.isdir(model_dir) else []
    for version in versions:
        try:
            ExportedEmbedder(os.path.join(model_dir, str(version)))
        except Exception as error:  # anything a half-written version raises
            return f"version {version} does not load: {type(error).__name__}: {str(error)[:300]}", versions
    return None, versions


def _export_rerun(reference, folder, what, first=None):
    """The export run again on a sound disk: None when it exits 0 and its version (`first`, else the newest)
    loads."""
    status, _, err = _cli(reference, reference.export_argv(folder))
    if status != 0:
        return f"{what}: the rerun exited {status}: {err.strip()[-300:]!r}"
    problem, versions = _versions_problem(os.path.join(reference.work, folder, "x"))
    if problem or not versions or (first is not None and versions != [first]):
        return f"{what}: after the rerun {problem or f'the versions are {versions}'}"
    return None


def export_disk(reference, rng, folder):
    what, problem = _disk_fault(reference, rng, reference.export_argv(folder), "export", reference.export_bytes)
    model_dir = os.path.join(reference.work, folder, "x")
    left = sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []
    if problem or left:
        return f"{what}: {problem or f'left {left}'}"
    return _export_rerun(reference, folder, what, first=1)


def export_kill(reference, rng, folder):
    delay = float(rng.uniform(0, reference.export_seconds))
    _killed(reference, reference.export_argv(folder), delay)
    what = f"killed after {delay:.2f} s"
    problem, _ = _versions_problem(os.path.join(reference.work, folder, "x"))
    problem = f"{what}: {problem}" if problem else _export_rerun(reference, folder, what)
    return problem or _left_problem(what, os.path.join(reference.work, folder))


def _shards(output):
    """Each shard's ids and embeddings (bytes) of an embed output, by shard file."""
    from tfdml.catalogue.files import read_shard, shard_records

    shards = [read_shard(os.path.join(output, record["file"])) for record in shard_records(output)]
    return [(tuple(ids), embeddings.tobytes()) for ids, _, embeddings in shards]


def _embed_output_problem(reference, output):
    """What is wrong with an embed output folder against the uninterrupted run's, or None."""
    if not os.path.exists(os.path.join(output, "manifest.json")):
        return f"{sorted(os.listdir(output))} without manifest.json"
    try:
        same = _shards(output) == reference.shards
    except Exception as error:  # a shard that does not read
        return f"a shard does not read: {type(error).__name__}: {str(error)[:300]}"
    return None if same else "shards that differ from the uninterrupted run's"


def _embed_rerun(reference, folder, what):
    output = os.path.join(reference.work, folder, "out")
    overwrite = ["--overwrite"] if os.path.exists(output) else []
    status, _, err = _cli(reference, [*reference.embed_argv(os.path.join(folder, "out")), *overwrite])
    if status != 0:
        return f"{what}: the rerun exited {status}: {err.strip()[-300:]!r}"
    problem = _embed_output_problem(reference, output)
    return f"{what}: after the rerun the output holds {problem}" if problem else None


def embed_disk(reference, rng, folder):
    argv = reference.embed_argv(os.path.join(folder, "out"))
    what, problem = _disk_fault(reference, rng, argv, "embed", reference.embed_bytes)
    draw_folder = os.path.join(reference.work, folder)
    left = sorted(os.listdir(draw_folder)) if os.path.isdir(draw_folder) else []
    if problem or left:
        return f"{what}: {problem or f'left {left}'}"
    return _embed_rerun(reference, folder, what)


def embed_kill(reference, rng, folder):
    delay = float(rng.uniform(0, reference.embed_seconds))
    _killed(reference, reference.embed_argv(os.path.join(folder, "out")), delay)
    what = f"killed after {delay:.2f} s"
    output = os.path.join(reference.work, folder, "out")
    problem = _embed_output_problem(reference, output) if os.path.exists(output) else None
    problem = f"{what}: the kill left {problem}" if problem else _embed_rerun(reference, folder, what)
    return problem or _left_problem(what, os.path.join(reference.work, folder))


def _tensorflow_version():
    import tensorflow as tf

    return tf.__version__


def _load():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _mix(args):
    """The kinds of one cycle: each kind's share of draws spread evenly over it (a run stopped by time keeps
    the proportions); the `embed` kinds left out, which is said, where Beam is not installed."""
    shares = dict(zip(KINDS, args.mix))
    if any(shares[kind] for kind in EMBED_KINDS) and importlib.util.find_spec("apache_beam") is None:
        print('note: apache_beam is not installed (pip install -e ".[beam]"): no embed_disk or embed_kill draws')
        shares.update(dict.fromkeys(EMBED_KINDS, 0))
    spread = sorted(((i + 0.5) / share, n) for n, share in enumerate(shares.values()) for i in range(share))
    return shares, [KINDS[n] for _, n in spread]


def run(args):
    counts = {kind: {"draws": 0, "failures": 0, "seconds": 0.0} for kind in KINDS}
    shares, mix = _mix(args)
    failures = []
    record = {
        "seed": args.seed,
        "mix": shares,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"TensorFlow {_tensorflow_version()}",
        "load_average_start": _load(),
    }
    draw, first = 0, 0
    if args.append:  # a further run: the draws go on from the file's count, the counts added to its counts
        with open(args.out) as f:
            earlier = json.load(f)
        counts, failures, first = {**counts, **earlier["counts"]}, earlier["failures"], earlier["draws"]
        draw = first
        record = dict(earlier, runs=earlier.get("runs", [{"mix": earlier["mix"], "minutes": earlier["minutes"]}]))
        record["runs"].append({"mix": shares})
    started, minutes_before = time.perf_counter(), record.get("minutes", 0.0) if args.append else 0.0
    with tempfile.TemporaryDirectory(prefix="tfdml-faults-") as work:
        reference = Reference(work, set(mix))
        record.update(reference.figures)
        while draw - first < args.draws and time.perf_counter() - started < args.minutes * 60:
            kind = mix[(draw - first) % len(mix)]
            rng = np.random.default_rng([args.seed, draw])
            began = time.perf_counter()
            failure = globals()[kind](reference, rng, f"draw{draw}")
            counts[kind]["draws"] += 1
            counts[kind]["seconds"] = round(counts[kind]["seconds"] + time.perf_counter() - began, 1)
            if failure:
                counts[kind]["failures"] += 1
                failures.append({"draw": draw, "kind": kind, "failure": failure})
            shutil.rmtree(os.path.join(work, f"draw{draw}"), ignore_errors=True)
            draw += 1
            minutes = round(minutes_before + (time.perf_counter() - started) / 60, 1)
            record.update(counts=counts, failures=failures, draws=draw, minutes=minutes)
            record["load_average_end"] = _load()
            with open(args.out, "w") as f:
                json.dump(record, f, indent=2)
            print(f"draw {draw} ({kind}): {'FAILED ' + failure if failure else 'ok'}", flush=True)


def table(path):
    with open(path) as f:
        record = json.load(f)
    lines = ["| kind of draw | draws | failures | seconds a draw |", "|---|---|---|---|"]
    for kind, count in record["counts"].items():
        per = count["seconds"] / count["draws"] if count["draws"] else float("nan")
        lines.append(f"| `{kind}` | {count['draws']} | {count['failures']} | {per:.2f} |")
    total = sum(count["draws"] for count in record["counts"].values())
    failed = sum(count["failures"] for count in record["counts"].values())
    lines.append(f"| all | {total} | {failed} | |")
    lines += [
        "",
        f"Seed {record['seed']}, {record['minutes']} minutes on {record['machine']} (load average "
        f"{', '.join(f'{v:.1f}' for v in record['load_average_start'])} at the start).",
    ]
    if "runs" in record:
        mixes = "; ".join(
            f"run {number}: " + ", ".join(f"{share} `{kind}`" for kind, share in run["mix"].items() if share)
            for number, run in enumerate(record["runs"], 1)
        )
        lines.append(f"Draws of each kind per cycle, {mixes}.")
    print("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--minutes", type=float, default=60.0, help="stop drawing after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mix",
        type=int,
        nargs=len(KINDS),
        default=list(MIX),
        metavar="N",
        help=f"draws of each kind per cycle, in this order: {', '.join(KINDS)} (default {' '.join(map(str, MIX))})",
    )
    parser.add_argument("--out", default="benchmarks/faults/results.json")
    parser.add_argument("--append", action="store_true", help="add the draws to those of --out (a further run)")
    parser.add_argument("--table", metavar="RESULTS", help="print the table of a results file and exit")
    args = parser.parse_args(argv)
    if args.table:
        return table(args.table)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
