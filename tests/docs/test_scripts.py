"""The contributor's entry points in scripts/: short, and they name what they run."""

import glob
import os
import subprocess
import sys

from tests import ROOT


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
        p[:-3] for p in os.listdir(os.path.join(ROOT, "tests", "references", "generators")) if p.endswith(".py")
    )
    assert listed.stdout.split() == expected and "pml_reference" in expected
    refused = subprocess.run([sys.executable, script, "no_such"], capture_output=True, text=True)
    assert refused.returncode == 2 and "no generator named no_such" in refused.stderr


def test_install_size_follows_the_extras_asked_for():
    """tools/install_size.py (the README's install sizes): the library alone pulls TensorFlow and none of the
    test extra's other Keras backends; the contributor's extras add them; a package counts all its files."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import install_size
    finally:
        sys.path.remove(os.path.join(ROOT, "tools"))
    import importlib.metadata as metadata

    requires = metadata.distribution("tfdml").requires
    core, _ = install_size.closure([r for r in requires if install_size._wanted(r, ())])
    contributor, _ = install_size.closure([r for r in requires if install_size._wanted(r, ("test", "docs"))])
    assert {"tensorflow", "scann", "numpy"} <= set(core) and not {"torch", "jax", "pytest", "mkdocs"} & set(core)
    assert set(core) < set(contributor) and {"torch", "pytest", "mkdocs"} <= set(contributor)
    # a package's size is its folder's: PyYAML's module folder holds its files, bytecode caches included
    folder = os.path.dirname(metadata.distribution("pyyaml").locate_file("yaml/__init__.py"))
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)
    assert 0 < on_disk <= install_size.installed_bytes(core["pyyaml"])
