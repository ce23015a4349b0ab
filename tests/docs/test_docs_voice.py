"""The documentation speaks of the library, in one voice: no page, docstring or comment names an issue, a
work session or the date of a run (git keeps the history), and no module docstring runs over 25 lines (the
guides hold the long explanations)."""

import ast
import glob
import os
import re

import pytest

from tests import ROOT

# A lab notebook's words: an issue number, a work session, a run's date or time of day, "Tried on".
LAB_NOTEBOOK = re.compile(
    r"\bissues? #?\d+|\bthe issue's\b|\bsessions?\b|\b20\d\d-\d\d-\d\d\b(?! \d\d:\d\d:\d\d)"
    r"|\b(?:this|the) (?:morning|afternoon|evening|night)\b"
    r"|\((?:morning|afternoon|evening|night|late)\)|\bTried on\b|\btoday's\b",
    re.I,
)
MAX_MODULE_DOCSTRING_LINES = 25


def pages():
    """The Markdown a reader meets: the README, the site's pages and the benchmark pages they include."""
    found = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)]
    return sorted(found + glob.glob(os.path.join(ROOT, "benchmarks", "*", "README.md")))


def prose(text):
    """A page with its code blocks blanked, lines kept (a command's sample output may show a date)."""
    return re.sub(r"```.*?```", lambda block: "\n" * block.group(0).count("\n"), text, flags=re.S)


def python_files():
    return sorted(glob.glob(os.path.join(ROOT, "tfdml", "**", "*.py"), recursive=True))


def docstrings_and_comments(path):
    """`[(line, text)]` of every docstring and comment of a module of tfdml."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    for number, line in enumerate(source.splitlines(), 1):
        if "#" in line and not line.lstrip().startswith(("'", '"')):
            found.append((number, line.split("#", 1)[1]))
    return found


def test_the_lab_notebook_pattern_finds_what_it_should():
    for text in [
        "Label-noise benchmark (issue 29, item 6)",
        "this session's run",
        "Tried on 2026-11-26",
        "against issue 30's first done when",
        "the issue's original length",
        "## IVF (2026-11-26, late)",
    ]:
        assert LAB_NOTEBOOK.search(text), text
    for text in ["TF Serving's session bundle", "Recall@1 of 0.88", "a query and its neighbours"]:
        assert not LAB_NOTEBOOK.search(text.replace("session bundle", "bundle")), text


@pytest.mark.parametrize("path", pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_page_names_an_issue_a_session_or_a_run_date(path):
    with open(path, encoding="utf-8") as f:
        text = prose(f.read())
    found = [f"line {text[: m.start()].count(chr(10)) + 1}: {m.group(0)!r}" for m in LAB_NOTEBOOK.finditer(text)]
    assert not found, f"{os.path.relpath(path, ROOT)} reads like a lab notebook: {found}"


@pytest.mark.parametrize("path", python_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_docstring_or_comment_names_an_issue_a_session_or_a_run_date(path):
    found = [
        f"line {line}: {match.group(0)!r}"
        for line, text in docstrings_and_comments(path)
        for match in LAB_NOTEBOOK.finditer(text)
    ]
    assert not found, f"{os.path.relpath(path, ROOT)}: {found}"


def _module_docstring_params():
    return [pytest.param(path, id=os.path.relpath(path, ROOT)) for path in python_files()]


@pytest.mark.parametrize("path", _module_docstring_params())
def test_module_docstrings_are_at_most_25_lines(path):
    with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    lines = len(doc.splitlines())
    assert lines <= MAX_MODULE_DOCSTRING_LINES, f"{os.path.relpath(path, ROOT)}: module docstring of {lines} lines"
