"""The disk space an install line takes: the files of every distribution it installs (tfdml's requirements, with
the extras asked for, and theirs, followed down), summed from what is installed in the running environment.

    python tools/install_size.py                 # pip install -e .          (the library alone)
    python tools/install_size.py test docs       # pip install -e ".[test,docs]"  (what CI installs)

Run it in an environment that holds the install measured (the extras' packages too); a requirement that is not
installed is named and left out of the sum. It prints the total and the largest packages, in MB (10^6 bytes).
"""

import importlib.metadata as metadata
import os
import re
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement


def _key(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _wanted(requirement, extras):
    """Whether a requirement string applies here with `extras` of the distribution that declares it."""
    marker = Requirement(requirement).marker
    return marker is None or any(marker.evaluate(dict(default_environment(), extra=e)) for e in ("", *extras))


def closure(requirements):
    """`({distribution key: Distribution}, [missing names])` of `requirements` and theirs, followed down."""
    found, missing, done = {}, [], set()
    todo = list(requirements)
    while todo:
        requirement = Requirement(todo.pop())
        key = _key(requirement.name)
        if (key, frozenset(requirement.extras)) in done:
            continue
        done.add((key, frozenset(requirement.extras)))
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(requirement.name)
            continue
        found[key] = distribution
        todo += [r for r in distribution.requires or [] if _wanted(r, requirement.extras)]
    return found, sorted(set(missing))


def installed_bytes(distribution):
    """The size of the files a distribution's RECORD lists (its own files, bytecode caches included)."""
    total = 0
    for file in distribution.files or []:
        try:
            total += os.path.getsize(distribution.locate_file(file))
        except OSError:
            pass
    return total


def main(extras):
    tfdml = metadata.distribution("tfdml")
    found, missing = closure([r for r in tfdml.requires if _wanted(r, extras)])
    sizes = sorted(((installed_bytes(d), key) for key, d in found.items()), reverse=True)
    line = f'pip install -e ".[{",".join(extras)}]"' if extras else "pip install -e ."
    print(f"{line}: {len(found)} distributions, {sum(s for s, _ in sizes) / 1e6:,.0f} MB")
    for size, key in sizes[:6]:
        print(f"  {key:<24}{size / 1e6:>8,.0f} MB")
    if missing:
        print(f"not installed here, left out: {', '.join(missing)}")


if __name__ == "__main__":
    main(sys.argv[1:])
