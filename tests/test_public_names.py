"""Every `tfdml.X` name the README and the docs pages name is reachable after a bare `import tfdml`:
`tfdml.projector.write_projector`, `tfdml.loss_names.LOSSES`, ... resolve attribute by attribute, in a fresh
process, the way a user types them."""

import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = re.compile(r"\btfdml(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def documented_names():
    pages = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)]
    names = set()
    for page in pages:
        with open(page, encoding="utf-8") as f:
            names.update(NAME.findall(f.read()))
    if importlib.util.find_spec("apache_beam") is None:  # tfdml.beam needs the beam extra
        names = {name for name in names if not name.startswith("tfdml.beam")}
    if importlib.util.find_spec("ray") is None:  # tfdml.ray needs the ray extra
        names = {name for name in names if not name.startswith("tfdml.ray")}
    return sorted(names)


def test_the_scan_finds_the_readme_names():
    names = documented_names()
    assert {"tfdml.projector.write_projector", "tfdml.loss_names.LOSSES", "tfdml.models.Embedder"} <= set(names)


@pytest.mark.slow
def test_every_documented_name_resolves_after_import_tfdml():
    script = (
        "import json, sys\n"
        "import tfdml\n"
        "missing = []\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    obj = tfdml\n"
        "    try:\n"
        "        for part in name.split('.')[1:]:\n"
        "            obj = getattr(obj, part)\n"
        "    except AttributeError:\n"
        "        missing.append(name)\n"
        "print(json.dumps(missing))\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(documented_names())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
