"""Stops of a command: SIGTERM (a scheduler, `docker stop`) handled as Ctrl-C, and a stop that arrives once
the work is complete noted rather than reported as a failure.

`install()` (the CLI, at start) makes SIGINT and SIGTERM raise `KeyboardInterrupt`, so that a job stopped
either way checkpoints and says how to resume; `received()` is the signal that stopped it (exit status
128 + its number). `holding()` holds the signals during a step that must not be cut in half (moving a
report into place and clearing the checkpoints) and delivers a held one after it. `complete(what)` marks the
command's result as complete: a stop after it is noted (`late_stop()`) and the command ends normally.
`between_steps()` wraps the job (loading, training, evaluation, export): a stop inside it waits for the next
`stop_point()` (called between stages, steps and batches) so that it never lands inside TensorFlow's own code,
which can crash the process instead of stopping it.
"""

import contextlib
import signal
import threading

_STOPS = (signal.SIGINT, signal.SIGTERM)
_state = {"signal": None, "complete": None, "late": None, "previous": {}, "deferring": False, "pending": None}


def _main_thread():
    return threading.current_thread() is threading.main_thread()


def _handler(signum, frame):
    _state["signal"] = signum
    if _state["complete"] is not None:
        _state["late"] = signum  # the result is complete: nothing to stop
        return
    if _state["deferring"] and _state["pending"] is None:
        _state["pending"] = signum  # raised at the next stop_point(); a second stop raises at once
        return
    _state["pending"] = None
    raise KeyboardInterrupt


def install():
    """Makes SIGINT and SIGTERM raise `KeyboardInterrupt` in the main thread (and forgets earlier stops)."""
    _state.update(signal=None, complete=None, late=None, deferring=False, pending=None)
    if _main_thread():
        _state["previous"] = {signum: signal.signal(signum, _handler) for signum in _STOPS}


def uninstall():
    """Puts back the handlers `install` replaced."""
    if _main_thread():
        for signum, handler in _state["previous"].items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        _state["previous"] = {}


def received():
    """The last stop signal received since `install()` (`None` if none)."""
    return _state["signal"]


def complete(what):
    """The command's result (`what`, e.g. "the report in reports/x") is complete: later stops are noted."""
    _state["complete"] = what


def late_stop():
    """`what` was complete when a stop arrived: `what`, else None."""
    return _state["complete"] if _state["late"] is not None else None


@contextlib.contextmanager
def holding():
    """Holds SIGINT and SIGTERM inside the block (main thread only) and delivers a held one after it."""
    if not _main_thread():
        yield
        return
    held = []
    previous = {signum: signal.signal(signum, lambda s, f: held.append(s)) for signum in _STOPS}
    previous = {signum: handler if handler is not None else signal.SIG_DFL for signum, handler in previous.items()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])


@contextlib.contextmanager
def between_steps():
    """Inside the block a stop is raised by `stop_point()` (a training loop calls it between steps) or at the end
    of the block, not wherever the main thread happens to be: an exception raised from a signal handler in the
    middle of TensorFlow's eager or tf.data machinery can crash the process (a segfault) instead of stopping it.
    A second stop before that point raises at once. Blocks nest: an inner block raises a held stop at its end,
    and the outer one goes on holding stops."""
    outer = _state["deferring"]
    _state["deferring"] = True
    try:
        yield
    except BaseException:
        _state["pending"] = None  # a held stop gives way to the error already on its way out
        raise
    finally:
        _state["deferring"] = outer
    stop_point()


def stop_point():
    """Raises `KeyboardInterrupt` if a stop arrived inside `between_steps()` and was held until now."""
    if _state["pending"] is not None:
        _state["pending"] = None
        raise KeyboardInterrupt
