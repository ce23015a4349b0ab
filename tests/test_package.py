"""The top-level package: lazily loaded submodules and the version that setup.cfg declares."""

import configparser
import os

import pytest

import tfdml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", tfdml._SUBMODULES)
def test_submodules_load_on_attribute_access(name):
    module = getattr(tfdml, name)
    assert module.__name__ == f"tfdml.{name}"


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tfdml.nope  # noqa: B018


def test_version_matches_setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    assert tfdml.__version__ == parser["metadata"]["version"]
