"""The core install works without Ray: in a fresh interpreter where `ray` cannot be imported (a
`sys.meta_path` blocker), `tfdml embed --engine ray` and `tfdml train --ray` answer with one line that says how
to install the ray extra, as the README's `setup-ray` snippet (what CI runs) writes it, and Ray's options are
refused without their engine."""

import json
import os
import subprocess
import sys
import textwrap

from tests import ROOT

_WITHOUT_RAY = textwrap.dedent("""
    import contextlib, io, json, sys

    class NoRay:
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoRay())
    from tfdml.cli import main

    result = {}
    for key, argv in {
        "embed": ["embed", "--engine", "ray", "--model", ".", "--image-dir", ".", "--output", "out"],
        "train": ["train", "--ray", "auto", "--workers", "2"],
        "embed_address_without_ray_engine": ["embed", "--address", "h:1", "--model", ".", "--image-dir", ".",
                                             "--output", "out"],
        "train_workers_without_ray": ["train", "--workers", "3"],
    }.items():
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            result[key] = [main(argv), err.getvalue()]
    result["ray_loaded"] = any(name == "ray" or name.startswith("ray.") for name in sys.modules)
    print(json.dumps(result))
""")


def _readme_ray_install():
    sys.path.insert(0, os.path.join(ROOT, ".ci"))
    try:
        import readme_commands
    finally:
        sys.path.remove(os.path.join(ROOT, ".ci"))
    return readme_commands.commands("setup-ray")[0]


def test_without_ray_one_line_says_how_to_install_it(tmp_path):
    from tfdml.embed_job import RAY_INSTALL

    assert _readme_ray_install() == RAY_INSTALL == 'pip install -e ".[ray]"'
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_RAY], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    hint = f"tfdml.ray needs Ray: {RAY_INSTALL} in the top folder of tfdml's source (missing: ray)"
    assert result["embed"] == [2, f"tfdml embed: error: {hint}\n"]
    assert result["train"] == [2, f"tfdml train: error: {hint}\n"]
    status, err = result["embed_address_without_ray_engine"]
    assert status == 2 and err.strip().endswith("--address, --actors and --actor-cpus are options of --engine ray.")
    assert result["train_workers_without_ray"] == [
        2,
        "tfdml train: error: --workers and --worker-cpus are options of --ray.\n",
    ]
    assert not result["ray_loaded"]
