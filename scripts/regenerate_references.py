"""Regenerates the reference files the tests compare with from the peer libraries that wrote them.

Each generator in `tests/references/generators/` writes one file of `tests/references/` (its README says which and from
what). They need the `bench` extra (PyTorch CPU, pytorch-metric-learning), which the tests never import:

    pip install -e ".[bench]"
    python scripts/regenerate_references.py            # every generator, in turn
    python scripts/regenerate_references.py --list     # their names
    python scripts/regenerate_references.py xbm_reference
"""

import argparse
import os
import subprocess
import sys

GENERATORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "references", "generators")


def generators():
    return sorted(name[:-3] for name in os.listdir(GENERATORS) if name.endswith(".py"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="generators to run (default: all of them)")
    parser.add_argument("--list", action="store_true", help="print the generators' names and stop")
    args = parser.parse_args(argv)
    known = generators()
    if args.list:
        print("\n".join(known))
        return 0
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        parser.error(f"no generator named {', '.join(unknown)}; the generators are {', '.join(known)}")
    for name in args.names or known:
        print(f"regenerating with {name}.py", flush=True)
        subprocess.run([sys.executable, os.path.join(GENERATORS, f"{name}.py")], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
