"""Fault injection at hundreds of drawn moments, SQLite's way: each draw breaks a run, then checks what is left.

Kinds of draw (seeded; each draw gets its own generator from the seed and its number):

- `train_disk`: `tfdml train` (`tests.fault_shim.JOB`, in this process) on a disk that fails after a drawn
  number of the run's bytes (uniform over the uninterrupted run's durable writes) with a drawn error (ENOSPC,
  EIO, EROFS; `tests.fault_shim.DiskShim`). Passes when the run ends in one `cannot write` line with exit
  status 2, every checkpoint its manifest lists passes its checksum, no report is in place, and the rerun on a
  sound disk ends with the uninterrupted run's figures and training history, equal to the last bit.
- `train_kill`: `python -m tfdml train` in a subprocess, SIGKILLed after a drawn delay (uniform over the
  uninterrupted run's time in a subprocess). Passes when the rerun ends with the uninterrupted run's results.
- `checkpoint_damage`: `tfdml train` stopped after a drawn epoch (1-3 of 4); the latest checkpoint is cut at a
  drawn length or has a drawn bit flipped. Passes when the rerun names it in one line, resumes from the epoch
  before it and ends with the uninterrupted run's results.
- `export_damage`: a drawn file of an export (SavedModel, variables, index, gallery arrays) cut at a drawn
  length or with a drawn bit flipped. Passes when `ExportedEmbedder` (what `tfdml search` and `tfdml evaluate`
  load) refuses it naming that file.

    nice -n 10 python -m benchmarks.faults.run_faults --minutes 40 --out benchmarks/faults/results.json
    python -m benchmarks.faults.run_faults --table benchmarks/faults/results.json > benchmarks/faults/table.md

The draws cycle through the kinds in the proportions `--mix` gives until `--draws` or `--minutes` is reached;
`results.json` records each kind's draws, failures, seconds and every failure's draw, and is rewritten after
each draw (a stopped run keeps what it counted).
"""

import argparse
import contextlib
import io
import json
import os
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
from tests.fault_shim import CODES, JOB, DiskShim, damage, kept_checkpoints_problem, results
from tfdml import cli, durable
from tfdml.callbacks import checkpoint as checkpoint_lib

KINDS = ("train_disk", "train_kill", "checkpoint_damage", "export_damage")


def _quiet_main(argv):
    """`tfdml ARGV` in this process: `(exit status, stdout, stderr)`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(argv)
    return status, out.getvalue(), err.getvalue()


def _job(folder):
    return [*JOB[:-1], folder]


class Reference:
    """The uninterrupted run's results and bytes, its time in a subprocess, and an export to damage."""

    def __init__(self, work, training=True):
        self.work = work
        self.export = self._export(work)
        if not training:  # export draws only
            return
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(work)
            shim = DiskShim().install(patch)
            status, _, err = _quiet_main(_job("reference"))
            assert status == 0, err
        self.results, self.bytes = results(os.path.join(work, "reference")), shim.written
        started = time.perf_counter()
        proc = cli_process.start(work, *_job("reference_process"))
        out = proc.communicate()[0]
        assert proc.returncode == 0, out[-2000:]
        self.process_seconds = time.perf_counter() - started

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


def train_disk(reference, rng, folder):
    budget, code = int(rng.integers(0, reference.bytes)), int(rng.choice(CODES))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(reference.work)
        DiskShim(budget, code).install(patch)
        status, _, err = _quiet_main(_job(folder))
    lines = err.strip().splitlines()
    if status != 2 or len(lines) != 1 or "cannot write" not in lines[0]:
        return f"budget {budget}, errno {code}: exit {status}, {err.strip()[-300:]!r}"
    problem = kept_checkpoints_problem(os.path.join(reference.work, folder, "checkpoints"))
    if problem or os.path.exists(os.path.join(reference.work, folder, "metrics.json")):
        return f"budget {budget}, errno {code}: left {problem or 'a report'}"
    return _rerun_matches(reference, folder, f"budget {budget}, errno {code}")


def _rerun_matches(reference, folder, what, expect=None):
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(reference.work)
        status, out, err = _quiet_main(_job(folder))
    if status != 0:
        return f"{what}: the rerun exited {status}: {err.strip()[-300:]!r}"
    if expect is not None and not re.search(expect, out):
        return f"{what}: the rerun did not say {expect!r}"
    if results(os.path.join(reference.work, folder)) != reference.results:
        return f"{what}: the rerun's results differ from the uninterrupted run's"
    return None


def train_kill(reference, rng, folder):
    delay = float(rng.uniform(0, reference.process_seconds))
    proc = cli_process.start(reference.work, *_job(folder))
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    proc.communicate()
    if proc.returncode == 0:  # it finished before the drawn moment: its own report is the one to compare
        same = results(os.path.join(reference.work, folder)) == reference.results
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
        patch.chdir(reference.work)
        patch.setattr(checkpoint_lib.CheckpointSequence, "on_epoch_end", on_epoch_end)
        status, _, err = _quiet_main(_job(folder))
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


def _tensorflow_version():
    import tensorflow as tf

    return tf.__version__


def _load():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def run(args):
    counts = {kind: {"draws": 0, "failures": 0, "seconds": 0.0} for kind in KINDS}
    failures, mix = [], [kind for kind, share in zip(KINDS, args.mix) for _ in range(share)]
    record = {
        "seed": args.seed,
        "mix": dict(zip(KINDS, args.mix)),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"TensorFlow {_tensorflow_version()}",
        "load_average_start": _load(),
    }
    draw, first = 0, 0
    if args.append:  # a further run: the draws go on from the file's count, the counts added to its counts
        with open(args.out) as f:
            earlier = json.load(f)
        counts, failures, first = earlier["counts"], earlier["failures"], earlier["draws"]
        draw = first
        record = dict(earlier, runs=earlier.get("runs", [{"mix": earlier["mix"], "minutes": earlier["minutes"]}]))
        record["runs"].append({"mix": dict(zip(KINDS, args.mix))})
    started, minutes_before = time.perf_counter(), record.get("minutes", 0.0) if args.append else 0.0
    with tempfile.TemporaryDirectory(prefix="tfdml-faults-") as work:
        reference = Reference(work, training=any(args.mix[:3]))
        if getattr(reference, "bytes", None) is not None:
            seconds = round(reference.process_seconds, 1)
            record.update(reference_bytes=reference.bytes, reference_process_seconds=seconds)
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
        "--mix", type=int, nargs=4, default=[2, 1, 1, 8], metavar="N", help="draws of each kind per cycle"
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
