"""The `tfdml` command line: `tfdml train | evaluate | export | search | embed`.

Each subcommand lives in its own module with `register(subparsers)` (adds its parser, with help for every
option, and sets `func`) and `run(args) -> int`.

The command modules import TensorFlow (4-6 s) only inside `run`, after the arguments, the configuration
and the paths are checked: a usage error (exit status 2) answers at once. Ctrl-C exits with status 130
and one line; SIGTERM (a scheduler, `docker stop`) is handled the same way and exits with status 143. A stop
that arrives once the command's result is complete is noted and the command ends normally. A folder that
another command is writing (`tfdml.locks`) is refused with status 2, naming that process. A write that the
storage refuses (no space left, an I/O error, a read-only file system) ends in one line naming the path,
with status 2; what was finished is kept (`tfdml.durable`).
"""

import argparse
import importlib
import os
import signal
import sys

from tfdml import interrupts
from tfdml.durable import storage_error
from tfdml.locks import LockedError

_COMMANDS = ("train", "evaluate", "export", "search", "embed")


class HelpFormatter(argparse.HelpFormatter):
    """Shows an option's default once: appended as "(default: X)" unless the help text already says what
    the default is, and never for defaults that mean "not given" (None, False, empty)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or "%(default)" in text
            or default in (None, False, [], argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


def _whole_number(text, expected):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_int(text):
    """argparse type: an integer >= 1 (a usage error, exit 2, otherwise)."""
    value = _whole_number(text, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text):
    """argparse type: an integer >= 0 (a usage error, exit 2, otherwise)."""
    value = _whole_number(text, "a whole number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or more, got {value}")
    return value


def add_expansion_options(parser):
    """The re-ranking options (alpha-QE, DBA) of `tfdml evaluate` and `tfdml export`."""
    rerank = parser.add_argument_group(
        "re-ranking (both off by default; see the retrieval evaluation guide for when they help)"
    )
    rerank.add_argument(
        "--query-expansion",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="alpha-QE: average each query with its top N neighbours, weighted by their cosine to the power "
        "--expansion-alpha (the query itself with weight 1), and search again; costs one more search per query.",
    )
    rerank.add_argument(
        "--database-augmentation",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="DBA: average each gallery item with its own top N gallery neighbours the same way, once, before "
        "the queries search the gallery (one search of the gallery against itself, offline).",
    )
    rerank.add_argument(
        "--expansion-alpha",
        type=float,
        default=3.0,
        metavar="ALPHA",
        help="the exponent of the neighbours' weights in --query-expansion and --database-augmentation "
        "(default 3; 0 weighs the neighbours equally).",
    )


_STORAGE_ADVICE = {
    "train": "free space (or fix the storage) and run the same command to resume",
    "export": "free space (or fix the storage) and export again (no half-written version is left)",
    "embed": "free space (or fix the storage) and run the same command to resume",
    "evaluate": "free space (or fix the storage) and run the same command again",
    "search": "free space (or fix the storage) and run the same command again",
}


def usage_error(command, message):
    """One `tfdml COMMAND: error: ...` line on stderr; returns the usage-error status 2."""
    print(f"tfdml {command}: error: {message}", file=sys.stderr)
    return 2


def quiet_tensorflow():
    """Silences TensorFlow's C++ start-up lines (cuInit on a machine without a GPU, oneDNN, CPU feature
    guard) unless the user chose a log level; must run before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build_parser():
    from tfdml import __version__

    parser = argparse.ArgumentParser(
        prog="tfdml",
        description="Deep metric learning for TensorFlow/Keras: train embedders with Ranked List Loss, "
        "Group Loss, DML-ALA, triplet or margin loss; evaluate retrieval with ScaNN; export "
        "SavedModels for TF Serving.",
        epilog="Run 'tfdml COMMAND --help' for the options of each command.",
    )
    parser.add_argument(
        "--version", action="version", version=f"tfdml {__version__}", help="print the tfdml version and exit."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(f"tfdml.cli.{name}").register(subparsers)
    for sub in subparsers.choices.values():
        sub.formatter_class = HelpFormatter  # one rule for every command's defaults
    return parser


def main(argv=None):
    quiet_tensorflow()
    parser = build_parser()
    # A command that runs a Beam pipeline (`tfdml embed`) passes the options it does not know to the runner.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "beam_options", False):
        parser.parse_args(argv)  # argparse's own "unrecognized arguments" usage error (exit 2)
    args.extra = extra
    if args.command is None:
        # `tfdml` alone prints the overview instead of failing.
        parser.print_help()
        return 0
    interrupts.install()
    try:
        status = int(args.func(args) or 0)
    except KeyboardInterrupt as interrupt:  # Ctrl-C, SIGTERM: one line (pipeline.Interrupted says how to resume)
        print(f"\ntfdml {args.command}: {str(interrupt) or 'interrupted'}", file=sys.stderr)
        return 128 + (interrupts.received() or signal.SIGINT)
    except LockedError as error:
        return usage_error(args.command, error)
    except OSError as error:  # a full disk, an I/O error, a read-only file system: one line, the work kept
        refused = storage_error(error, error.filename or "a file")
        if refused is None:
            raise
        return usage_error(args.command, f"{refused}; what was finished is kept: {_STORAGE_ADVICE[args.command]}")
    finally:
        interrupts.uninstall()
    done = interrupts.late_stop()
    if done:
        print(f"tfdml {args.command}: stop received after {done} was complete; nothing was lost", file=sys.stderr)
    return status


def main_for(command, argv=None):
    """`tfdml COMMAND ...` for `python -m tfdml.cli.COMMAND ...` entry points."""
    return main([command, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
