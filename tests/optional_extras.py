"""Modules of tfdml that need an optional extra (`tfdml.beam` needs `beam`): importing one where its extra is
absent gives the reason to skip it, read from setup.cfg's extras, instead of an error at collection."""

import configparser
import importlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_requirements():
    """`{normalised distribution name: extra}` of setup.cfg's `[options.extras_require]`."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    owners = {}
    for extra, lines in parser["options.extras_require"].items():
        for line in lines.splitlines():
            line = line.split("#", 1)[0].strip()
            match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
            if match:
                owners.setdefault(_normalise(match.group(0)), extra)
    return owners


def _missing_module(error):
    """The name of the module whose absence caused `error` (following `raise ... from`), or None."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and error.name:
            return error.name
        error = error.__cause__ or error.__context__
    return None


def import_or_reason(path):
    """`(module, None)`, or `(None, reason)` when `path` needs an optional extra that is not installed. Any
    other import error is raised: only a missing extra is a reason to skip."""
    try:
        return importlib.import_module(path), None
    except ImportError as error:
        missing = _missing_module(error)
        extra = extra_requirements().get(_normalise(missing.split(".")[0])) if missing else None
        named = re.search(r"tfdml\[(\w+)\]", str(error))  # an optional module's own message names its extra
        extra = extra or (named.group(1) if named and named.group(1) in set(extra_requirements().values()) else None)
        if extra is None or extra in ("test", "docs"):  # the README installs these: their absence is a failure
            raise
        return None, f'{path} needs the {extra} extra (pip install -e ".[{extra}]"): {error}'
