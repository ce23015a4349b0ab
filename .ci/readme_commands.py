"""Prints the shell commands of one snippet of README.md, one per line, as the README writes them (their
comments left out), so that CI runs what a newcomer types.

    python3 .ci/readme_commands.py setup        # the install line and the test command
    python3 .ci/readme_commands.py setup-beam   # the optional Beam extra and its tests
    python3 .ci/readme_commands.py setup-ray    # the optional Ray extra and its tests
"""

import os
import re
import sys

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def commands(name, readme=README):
    """The commands of the ```bash block between `--8<-- [start:NAME]` and `--8<-- [end:NAME]`."""
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    pattern = rf"--8<-- \[start:{re.escape(name)}\][^\n]*\n```bash\n(.*?)```\n[^\n]*--8<-- \[end:{re.escape(name)}\]"
    match = re.search(pattern, text, re.S)
    if not match:
        raise SystemExit(f"README.md has no ```bash block between the [start:{name}] and [end:{name}] markers")
    lines = [line.split("  #", 1)[0].strip() for line in match.group(1).splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


if __name__ == "__main__":
    print("\n".join(commands(sys.argv[1])))
