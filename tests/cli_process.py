"""The real `tfdml` command in a subprocess, for the tests that stop it or run two at once (not a test module)."""

import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    """A `ready` for `wait_for`: BackupAndRestore's state records `epoch` finished epochs (written last, after
    the weights)."""

    def ready():
        try:
            with open(os.path.join(checkpoints, "training_metadata.json")) as f:
                return json.load(f).get("epoch") == epoch
        except (OSError, ValueError):
            return False

    return ready
