"""The core install works without Apache Beam: in a fresh interpreter where `apache_beam` cannot be
imported (a `sys.meta_path` blocker), `import tfdml` and `tfdml --help` work, `tfdml embed` answers with one
line that says how to install the beam extra, and `import tfdml.beam` raises an ImportError that says it too."""

import json
import os
import subprocess
import sys
import textwrap

from tests import ROOT

_WITHOUT_BEAM = textwrap.dedent("""
    import contextlib, io, json, sys

    class NoBeam:
        def find_spec(self, name, path=None, target=None):
            if name == "apache_beam" or name.startswith("apache_beam."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoBeam())
    import tfdml
    from tfdml.cli import main

    result = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(["--help"])
        except SystemExit as stop:
            result["help_status"] = stop.code
    result["help"] = out.getvalue()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result["embed_status"] = main(["embed", "--model", ".", "--image-dir", ".", "--output", "out"])
    result["embed_error"] = err.getvalue()
    try:
        import tfdml.beam
    except ImportError as error:
        result["import_error"] = str(error)
    result["beam_loaded"] = any(name.startswith("apache_beam") for name in sys.modules)
    print(json.dumps(result))
""")


def test_core_install_without_beam(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_BEAM], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["help_status"] == 0
    assert "embed" in result["help"] and "train" in result["help"]
    assert result["embed_status"] == 2
    install = _readme_beam_install()
    assert result["embed_error"].strip() == (
        f"tfdml embed: error: tfdml.beam (tfdml embed) needs Apache Beam: {install} in the top folder of "
        "tfdml's source (missing: apache_beam)"
    )
    assert install in result["import_error"]
    assert not result["beam_loaded"]


def _readme_beam_install():
    """The install line of the README's beam snippet (what CI runs), which every hint repeats."""
    sys.path.insert(0, os.path.join(ROOT, ".ci"))
    try:
        import readme_commands
    finally:
        sys.path.remove(os.path.join(ROOT, ".ci"))
    install = readme_commands.commands("setup-beam")[0]
    assert install == 'pip install -e ".[beam]"'
    return install


def test_every_beam_install_hint_is_the_readmes():
    from tfdml.cli import build_parser
    from tfdml.embed_job import BEAM_INSTALL

    install = _readme_beam_install()
    assert BEAM_INSTALL == install
    embed = next(a for a in build_parser()._actions if a.choices and "embed" in a.choices).choices["embed"]
    assert f"({install} in the top folder of tfdml's source)" in " ".join(embed.description.split())
    with open(os.path.join(ROOT, "docs", "guides", "beam.md"), encoding="utf-8") as f:
        guide = f.read()
    assert f"\n{install}  " in guide and "tfdml[beam]" not in guide
