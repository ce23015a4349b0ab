"""The top-level package: lazily loaded submodules, the version that setup.cfg declares, and requirements that
tfdml imports."""

import ast
import configparser
import importlib.metadata
import os
import re

import pytest

import tfdml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", tfdml._SUBMODULES)
def test_submodules_load_on_attribute_access(name):
    if name == "beam":  # the optional dependency (tests/beam/test_beam_optional.py covers its absence)
        pytest.importorskip("apache_beam", reason='tfdml.beam needs the beam extra: pip install -e ".[beam]"')
    if name == "ray":  # the optional dependency (tests/ray/test_ray_optional.py covers its absence)
        pytest.importorskip("ray", reason='tfdml.ray needs the ray extra: pip install -e ".[ray]"')
    module = getattr(tfdml, name)
    assert module.__name__ == f"tfdml.{name}"


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tfdml.nope  # noqa: B018


def test_version_matches_setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    assert tfdml.__version__ == parser["metadata"]["version"]


def _imported_top_modules():
    """Top-level names of every module that tfdml's own code imports (at module top or in a function)."""
    names = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "tfdml")):
        for file in files:
            if file.endswith(".py"):
                with open(os.path.join(folder, file)) as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        names.update(alias.name.split(".")[0] for alias in node.names)
                    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                        names.add(node.module.split(".")[0])
    return names


@pytest.mark.slow
def test_every_required_distribution_is_imported_by_tfdml():
    """An install requirement that nothing imports (keras-cv was one) only costs users an install."""
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    required = [
        re.split(r"[<>=!~ \[;]", line.strip())[0] for line in parser["options"]["install_requires"].strip().splitlines()
    ]
    modules_of = {}  # installed distribution name (normalised) -> its top-level modules
    for module, distributions in importlib.metadata.packages_distributions().items():
        for distribution in distributions:
            modules_of.setdefault(re.sub(r"[-_.]+", "-", distribution).lower(), set()).add(module)
    imported = _imported_top_modules()
    unused = [name for name in required if not modules_of.get(re.sub(r"[-_.]+", "-", name).lower(), set()) & imported]
    assert unused == [], f"install_requires that tfdml never imports (or that are not installed): {unused}"
