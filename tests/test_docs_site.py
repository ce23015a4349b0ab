"""The documentation site covers the code: the built API reference holds every public name of tfdml, the
generated command-line and configuration pages list every option and key (each key saying what it does), and
the README stays short and links into the site. The site build (`mkdocs build --strict`) needs the docs extra."""

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import typing
import zlib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs"))

import hooks  # noqa: E402  (docs/hooks.py: the generators the site build runs)
from optional_extras import import_or_reason  # noqa: E402


def _inventory(path):
    """The object names of a Sphinx inventory (objects.inv, version 2), which mkdocstrings writes."""
    with open(path, "rb") as f:
        for _ in range(4):
            f.readline()  # "# Sphinx inventory version 2", project, version, "# The remainder ... zlib"
        text = zlib.decompress(f.read()).decode()
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]') builds the site")
    site = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return _inventory(site / "objects.inv")


def _runtime_public_names(module):
    """`{name: object}` a user reaches as `module.name`: `__all__`, or the classes and functions without a
    leading `_` that tfdml defines (imported names included)."""
    if hasattr(module, "__all__"):
        return {name: getattr(module, name) for name in module.__all__}
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", "").startswith("tfdml")
    }


def test_every_public_name_of_tfdml_is_in_the_api_reference(inventory):
    package = hooks.griffe_package()
    missing, absent = [], []  # absent: modules of an optional extra that is not installed here
    for top, submodules in hooks.public_modules().items():
        for path in [f"tfdml.{top}", *(f"tfdml.{top}.{sub}" for sub in submodules)]:
            module, reason = import_or_reason(path)
            if module is None:
                absent.append(reason)
                continue
            static = package[path.split(".", 1)[1]]
            for name, value in _runtime_public_names(module).items():
                member = static.members.get(name)
                if member is not None and member.is_alias and not member.target_path.startswith("tfdml."):
                    continue  # another library's name passed on (tfdml.keras_private's Keras internals)
                defined = getattr(value, "__module__", None), getattr(value, "__qualname__", name)
                if set((defined[0] or "").split(".")[1:2]) & hooks.INTERNAL_MODULES:
                    continue  # a name of an internal module (tfdml.locks.LockedError), not public API
                candidates = {f"{path}.{name}", f"{defined[0]}.{defined[1]}"}
                if not candidates & inventory:
                    missing.append(f"{path}.{name}")
    assert not missing, f"not in the API reference: {missing}"
    assert {"tfdml.losses.ranked_list.RankedListLoss", "tfdml.data.glyphs", "tfdml.cli.main"} <= inventory
    if absent:
        pytest.skip(f"checked without {len(absent)} module(s): {'; '.join(absent)}")


def test_the_api_pages_cover_every_module_and_the_package_pages_link_each_public_name():
    pages = hooks.api_pages()
    for top, submodules in hooks.public_modules().items():
        assert f"tfdml.{top}" in pages.values()
        assert {f"tfdml.{top}.{sub}" for sub in submodules} <= set(pages.values())
    losses = hooks.api_page("reference/api/losses.md")
    assert "[`RankedListLoss`][tfdml.losses.ranked_list.RankedListLoss]" in losses
    assert "[`CrossBatchMemory`][tfdml.losses.cross_batch_memory.CrossBatchMemory]" in losses


def _config_keys(cls, prefix=""):
    keys = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        section = next(
            (t for t in (hints[field.name], *typing.get_args(hints[field.name])) if dataclasses.is_dataclass(t)), None
        )
        keys.append(f"{prefix}{field.name}")
        if section:
            keys += _config_keys(section, f"{prefix}{field.name}.")
    return keys


def test_every_configuration_key_is_listed_with_what_it_does():
    from tfdml.config import Config
    from tfdml.loss_names import LOSSES

    page, losses = hooks.configuration_page().split("## `loss.name` and `loss.params`")
    rows = {match.group(1): match.group(2) for match in re.finditer(r"^\| `([\w.]+)` \|(.*)\|$", page, re.M)}
    keys = _config_keys(Config)
    assert set(keys) == set(rows), set(keys) ^ set(rows)
    undocumented = [key for key in keys if not rows[key].rsplit("|", 1)[-1].strip()]
    assert not undocumented, f"configuration keys without a comment in tfdml.config: {undocumented}"
    # The types, defaults and main-job values come from the dataclasses and the embedded job.
    assert "| `optimizer.learning_rate` | number | `0.01` | `0.002` | > 0.0 |" in page
    assert "| `data.source` | string | `digits` | `glyphs` | one of `digits`, `tfds`, `folder`, `glyphs` |" in page
    # Every loss name links to the class whose arguments loss.params are.
    assert "| `ranked_list` | [`RankedListLoss`][tfdml.losses.ranked_list.RankedListLoss] |" in losses
    assert losses.count("][tfdml.losses.") == len(LOSSES)


def test_the_command_line_page_lists_every_option_of_every_command():
    import argparse

    from tfdml.cli import build_parser

    page = hooks.cli_page()
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in subparsers.choices.items():
        assert f"## `tfdml {name}`" in page
        for action in parser._actions:
            for option in action.option_strings:
                assert f"`{option}`" in page, f"tfdml {name} {option} is missing"


def test_shared_argument_lines_become_one_entry_per_name():
    import griffe_shared_args

    text = (
        "Summary.\n\nArgs:\n    a, b: shared text\n      continued.\n    c: own.\n    d, e,\n"
        "      f: a list over two lines.\n\nReturns:\n    x, y: not arguments.\n"
    )
    assert griffe_shared_args.split_shared_arguments(text, signature={"a", "b", "c", "d", "e"}) == (
        "Summary.\n\nArgs:\n    a: shared text\n      continued.\n    b: shared text\n      continued.\n"
        "    c: own.\n    d: a list over two lines.\n    e: a list over two lines.\n\nReturns:\n"
        "    x, y: not arguments.\n\nOther Parameters:\n    f: a list over two lines."
    )


def test_equations_become_mathml():
    html = hooks.typeset('<p>Distance <span class="arithmatex">\\(d_{ij} &lt; \\alpha\\)</span>.</p>')
    assert html.startswith("<p>Distance <math") and "<msub><mi>d</mi>" in html and "<mo>&#x0003C;</mo>" in html
    block = hooks.typeset('<div class="arithmatex">\\[x^2\\]</div>')
    assert block.startswith('<div class="math-block"><math') and 'display="block"' in block


def test_the_readme_is_short_and_its_links_resolve():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert len(text.splitlines()) < 300
    assert "mkdocs serve" in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, target)), f"README links to a missing {target}"
