"""Warnings of the tfdml library (e.g. skipped undecodable images) shown on stderr while a command runs."""

import contextlib
import logging
import sys


@contextlib.contextmanager
def warnings_to_stderr(command):
    """Shows `tfdml.*` log warnings as `tfdml COMMAND: warning: ...` lines on stderr (once each, whatever
    logging configuration the host program has)."""
    logger = logging.getLogger("tfdml")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"tfdml {command}: warning: %(message)s"))
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
