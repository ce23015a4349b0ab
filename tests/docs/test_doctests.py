"""The docstrings' examples run as doctests, where they can: every `>>>` example of every public module of
tfdml runs in a scratch directory, with `tfdml`, `keras`, `np` and `tf` imported and the public names of
`tfdml.losses`, `tfdml.models`, `tfdml.optimizers` and `tfdml.callbacks` at hand (the examples write
`RankedListLoss(...)`, `Embedder(...)`). An example that shows a call
without its output passes when the call runs; an expected output must match (ellipsis and whitespace aside).

Some examples are sketches that use names they do not define (`model.compile(...)` for "your model") or a
`...` placeholder: they run up to that name, and the docstring is reported as skipped, naming it (`pytest
-ra` counts them). Any other failure (an exception such as a renamed function's AttributeError, or a wrong
output) fails the test."""

import doctest
import inspect
import os
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdml
from tests import ROOT

sys.path.insert(0, os.path.join(ROOT, "docs"))

import hooks  # noqa: E402  (docs/hooks.py: the public modules the API reference documents)

from tests.optional_extras import import_or_reason  # noqa: E402


def _doctests():
    tests, skipped = [], []
    for top, submodules in hooks.public_modules().items():
        for path in [f"tfdml.{top}", *(f"tfdml.{top}.{sub}" for sub in submodules)]:
            module, reason = import_or_reason(path)
            if module is None:
                skipped.append(pytest.param(None, id=path, marks=pytest.mark.skip(reason=reason)))
                continue
            for test in doctest.DocTestFinder(exclude_empty=True).find(module, path):
                # Objects defined in this module (an imported one is tested where it is defined).
                if test.examples and getattr(test, "filename", None) == getattr(module, "__file__", None):
                    tests.append(test)
    tests = sorted({test.name: test for test in tests}.values(), key=lambda test: test.name)
    return tests, skipped


DOCTESTS, SKIPPED_MODULES = _doctests()
NAMES = {"tfdml": tfdml, "keras": keras, "np": np, "tf": tf}
for _package in (tfdml.losses, tfdml.models, tfdml.optimizers, tfdml.callbacks):
    NAMES.update({n: v for n, v in vars(_package).items() if not n.startswith("_") and not inspect.ismodule(v)})


class _Checker(doctest.OutputChecker):
    def check_output(self, want, got, optionflags):
        return not want or super().check_output(want, got, optionflags)  # no output shown: any output


class _Runner(doctest.DocTestRunner):
    def __init__(self):
        super().__init__(checker=_Checker(), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        self.problems = []  # (example, exception or None for an output mismatch), in order

    def report_unexpected_exception(self, out, test, example, exc_info):
        self.problems.append((example, exc_info[1]))

    def report_failure(self, out, test, example, got):
        self.problems.append((example, None))


def _sketch_reason(example, error):
    """Why a failing example is a sketch rather than a broken one, or None."""
    if isinstance(error, NameError):
        return f"a sketch: {error.name!r} is not defined in the example"
    if isinstance(error, TypeError) and "ellipsis" in str(error):
        return "a sketch: '...' stands for the caller's arguments"
    return None


@pytest.mark.parametrize("test", [*(pytest.param(t, id=t.name) for t in DOCTESTS), *SKIPPED_MODULES])
def test_docstring_examples(test, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    test.globs.update(NAMES)
    runner = _Runner()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=r"`shuffle=True` was passed", category=UserWarning)
        runner.run(test, out=lambda text: None, clear_globs=True)
    if not runner.problems:
        return
    example, error = runner.problems[0]
    reason = _sketch_reason(example, error)
    where = f"{test.name} (line {test.lineno + example.lineno + 1}): {example.source.strip()}"
    if reason:
        pytest.skip(f"{where}: {reason}")
    pytest.fail(f"{where}: {'wrong output' if error is None else f'{type(error).__name__}: {error}'}")


def test_docstring_examples_are_found():
    names = {test.name for test in DOCTESTS}
    assert len(DOCTESTS) >= 30, f"only {len(DOCTESTS)} docstrings with examples found"
    assert {"tfdml.losses.ranked_list.LinearTemperature", "tfdml.data.glyphs.glyphs"} <= names
