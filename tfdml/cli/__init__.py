"""The `tfdml` command line: `tfdml train | evaluate | export | search`.

Each subcommand lives in its own module with `register(subparsers)` (adds its parser, with help for every
option, and sets `func`) and `run(args) -> int`.
"""

import argparse
import importlib
import os
import sys

_COMMANDS = ("train", "evaluate", "export", "search")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tfdml",
        description="Deep metric learning for TensorFlow/Keras: train embedders with Ranked List Loss, "
                    "Group Loss, DML-ALA, triplet or margin loss; evaluate retrieval with ScaNN; export "
                    "SavedModels for TF Serving.",
        epilog="Run 'tfdml COMMAND --help' for the options of each command.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(f"tfdml.cli.{name}").register(subparsers)
    return parser


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        # `tfdml` alone prints the overview instead of failing.
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


def main_for(command, argv=None):
    """`tfdml COMMAND ...` for `python -m tfdml.cli.COMMAND ...` entry points."""
    return main([command, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
