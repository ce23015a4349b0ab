"""The contributor's entry points in scripts/: short, and they name what they run."""

import glob
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_every_script_is_a_short_entry_point():
    scripts = glob.glob(os.path.join(ROOT, "scripts", "*.py"))
    assert scripts
    for path in scripts:
        with open(path) as f:
            assert len(f.read().splitlines()) <= 150, path


def test_regenerate_references_lists_every_generator_and_refuses_an_unknown_one():
    script = os.path.join(ROOT, "scripts", "regenerate_references.py")
    listed = subprocess.run([sys.executable, script, "--list"], capture_output=True, text=True, check=True)
    expected = sorted(
        p[:-3] for p in os.listdir(os.path.join(ROOT, "tests", "data", "generators")) if p.endswith(".py")
    )
    assert listed.stdout.split() == expected and "pml_reference" in expected
    refused = subprocess.run([sys.executable, script, "no_such"], capture_output=True, text=True)
    assert refused.returncode == 2 and "no generator named no_such" in refused.stderr
