"""The real `tfdml` command in a subprocess, for the tests that stop it or run two at once (not a test module)."""

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_job(epochs, steps_per_epoch, report_dir="r"):
    """The default job's `tfdml train` arguments cut to `epochs` of `steps_per_epoch` steps on 6 images per
    glyph, without export, with a 2 x 2 retrieval grid and 2 worst queries in the report, into `report_dir`
    (the last argument)."""
    settings = (
        "data.images_per_class=6",
        "report.grid_queries=2",
        "report.grid_neighbours=2",
        "report.worst_queries=2",
    )
    sets = [item for setting in settings for item in ("--set", setting)]
    steps = ["--epochs", str(epochs), "--steps-per-epoch", str(steps_per_epoch)]
    return ["train", *steps, *sets, "--no-export", "--report-dir", report_dir]


def env():
    """This tree's tfdml on the path, no GPU, TensorFlow's log level left to the CLI, Python's fault handler on."""
    environment = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    environment.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the CLI's own default
    environment["PYTHONFAULTHANDLER"] = "1"  # a crash (segfault) prints the Python stack of every thread
    environment["PYTHONPATH"] = ROOT + os.pathsep + environment.get("PYTHONPATH", "")
    return environment


def start(cwd, *arguments):
    """`python -m tfdml ARGUMENTS` in `cwd`, stdout and stderr together in a pipe."""
    # Ctrl-C reaches the run even when the test process ignores SIGINT (a background job of a shell): Python
    # installs its KeyboardInterrupt handler only over the default action.
    return subprocess.Popen(
        [sys.executable, "-m", "tfdml", *arguments],
        cwd=cwd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for(proc, ready, timeout=600):
    """Polls `ready()` every 10 ms while `proc` runs; its value once true, or None when `proc` ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.01)
    return None


def checkpointed_epoch(checkpoints, epoch):
    """A `ready` for `wait_for`: the checkpoint manifest records `epoch` finished epochs (written last, after
    the weights)."""

    def ready():
        try:
            with open(os.path.join(checkpoints, "training_metadata.json")) as f:
                return json.load(f).get("epoch") == epoch
        except (OSError, ValueError):
            return False

    return ready


# Runs `tfdml ARGS...` for each ARGS of the JSON list argv[1] in turn, its stderr and stdout into files of the
# folder argv[2]; writes there `results.json`: per case, the exit status and whether TensorFlow is imported.
_DRIVER = """
import json, os, sys, traceback
from tfdml.cli import main

def run(args, index, out):
    streams = [(1, sys.stdout), (2, sys.stderr)]
    streams = [(fd, stream, open(os.path.join(out, f"{index}.{fd}"), "w")) for fd, stream in streams]
    saved = [os.dup(fd) for fd, _, _ in streams]
    for fd, stream, file in streams:
        stream.flush()
        os.dup2(file.fileno(), fd)
    try:
        return main(args)
    except SystemExit as exit:
        return 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        for (fd, stream, file), copy in zip(streams, saved):
            stream.flush()
            os.dup2(copy, fd)
            os.close(copy)
            file.close()

cases, out = json.loads(sys.argv[1]), sys.argv[2]
results = []
for index, args in enumerate(cases):
    status = run(args, index, out)
    results.append({"status": status, "tensorflow": "tensorflow" in sys.modules})
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f)
"""


def run_in_one_process(cases, cwd, out, **extra_env):
    """`tfdml ARGS...` for each ARGS of `cases`, one after another in one subprocess in `cwd` (TensorFlow is
    imported once, by the first case that needs it): per case `(exit status, stderr, stdout, whether TensorFlow
    was imported by the end of it)`, each case's streams in its own files under `out` (so that a traceback shows
    in its own stderr) and its status as the shell would see it (`SystemExit`'s code)."""
    environment = dict(env(), **extra_env)
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(cases), str(out)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0 and (out / "results.json").exists(), (done.stdout[-3000:], done.stderr[-3000:])
    results = json.loads((out / "results.json").read_text())
    return [
        (result["status"], (out / f"{i}.2").read_text(), (out / f"{i}.1").read_text(), result["tensorflow"])
        for i, result in enumerate(results)
    ]


def shown(output, limit=3000):
    """The end of a run's `output` for an assertion message, without the fault handler's list of extension
    modules (a few thousand characters after a crash's thread stacks, which would push them out of view)."""
    lines = [line for line in output.splitlines() if not line.startswith("Extension modules:")]
    return "\n".join(lines)[-limit:]
