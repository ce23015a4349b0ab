"""The README's code stays true: its example (the main job in plain Keras, which the documentation's Concepts
guide includes) runs as written with fewer steps and builds the main job it says it mirrors (`tfdml train`: the
same model, loss, optimizer, batches and evaluation data); the main job itself, run whole, prints figures within
the band the README states around its table."""

import contextlib
import io
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from tests import ROOT, cli_process
from tfdml import config as config_lib
from tfdml import pipeline, recipes
from tfdml.data import glyphs

pytestmark = pytest.mark.slow  # the tests run the README's job and examples (a module fixture of about 17 s)

README = os.path.join(ROOT, "README.md")


def main_job_example():
    """The ```python block between the README's `--8<-- [start:main-job]` and `[end:main-job]` markers."""
    with open(README) as f:
        text = f.read()
    pattern = r"--8<-- \[start:main-job\][^\n]*\n```python\n(.*?)```\n[^\n]*--8<-- \[end:main-job\]"
    match = re.search(pattern, text, re.S)
    assert match, "README has no main-job example between its snippet markers"
    return match.group(1)


@pytest.fixture(scope="module")
def concepts():
    """Runs the example with 2 steps instead of 600 (the only change) and returns its names and what it
    printed."""
    code = main_job_example()
    short, count = re.subn(r"epochs=10, steps_per_epoch=60", "epochs=1, steps_per_epoch=2", code)
    assert count == 1, "the example no longer trains with epochs=10, steps_per_epoch=60"
    names, printed = {}, io.StringIO()
    with contextlib.redirect_stdout(printed), warnings.catch_warnings():
        warnings.simplefilter("error")
        # Keras 3 warns on every fit over a tf.data.Dataset that it ignores its shuffle=True default.
        warnings.filterwarnings("ignore", message=r"`shuffle=True` was passed", category=UserWarning)
        exec(compile(short, "README.md (main job)", "exec"), names)
    return names, printed.getvalue()


def test_concepts_example_runs_and_prints_the_metrics(concepts):
    _, printed = concepts
    assert re.search(r"'recall@1': [0-9.]+", printed) and "'map@r'" in printed and "'r_precision'" in printed


def test_concepts_example_is_the_main_job(concepts):
    names, _ = concepts
    job = config_lib.default_config()
    assert (job.data.source, job.training.epochs, job.training.steps_per_epoch) == ("glyphs", 10, 60)
    expected = recipes.make_embedder(job.model, (job.data.image_size,) * 2 + (1,))
    model = names["model"]
    config, job_config = model.get_config(), expected.get_config()
    config.pop("name"), job_config.pop("name")  # auto-numbered
    assert config == job_config
    assert model.count_params() == expected.count_params()
    assert model.loss.get_config() == pipeline.build_loss(job.loss, total_steps=600).get_config()
    optimizer = recipes.make_optimizer(job.optimizer, model, 600)
    assert type(model.optimizer) is type(optimizer)
    assert float(model.optimizer.learning_rate) == pytest.approx(float(optimizer.learning_rate))
    images, labels = next(iter(names["train"]))
    assert images.shape == (job.data.classes_per_batch * job.data.samples_per_class, 32, 32, 1)
    assert len(np.unique(labels)) == job.data.classes_per_batch
    assert len(names["labels"]) == len(glyphs("test").labels) and not job.data.augment  # unseen half, whole images


def test_model_summary_lists_each_layer_once(concepts):
    model = concepts[0]["model"]
    text = io.StringIO()
    model.summary(print_fn=lambda line, **kwargs: text.write(line + "\n"))
    summary = text.getvalue()
    assert [layer.name for layer in model.layers] == ["pixel_preprocessing", "small_cnn", "head_H", "l2_normalize"]
    assert "unbuilt" not in summary and summary.count("small_cnn") == 1 and "taps" not in summary
    # The backbone counted once (the optimizer's variables are listed on a line of their own).
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    frozen = sum(int(np.prod(v.shape)) for v in model.non_trainable_weights)
    assert f"Trainable params: {trainable:,} " in summary and f"Non-trainable params: {frozen:,} " in summary
    assert trainable == sum(int(np.prod(v.shape)) for layer in model.layers for v in layer.trainable_weights)


def test_the_suite_collects_without_the_optional_extras_and_the_fast_subset_covers_every_package():
    """What a newcomer who installs `.[test,docs]` only gets: every test module collects (the Beam tests and the
    Beam modules' doctests skip with a reason) when `apache_beam` cannot be imported, installed or not; and the
    fast subset of CONTRIBUTING.md (`-m "not slow"`) keeps tests in every folder of `tests/` (each mirrors a
    package of tfdml)."""
    script = (
        "import sys\n"
        "sys.modules['apache_beam'] = None  # `import apache_beam` raises ModuleNotFoundError, find_spec is None\n"
        "import pytest\n"
        # Plain asserts: rewriting every test module's asserts is much of this run's time and no part of whether
        # a module imports and collects.
        "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', '--assert=plain', '-m', 'not slow',"
        " 'tests']))\n"
    )
    root = os.path.dirname(README)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root}
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "error" not in result.stdout.splitlines()[-1], result.stdout[-2000:]
    assert "tests/docs/test_doctests.py::test_docstring_examples[tfdml.beam]" in result.stdout
    fast = {os.path.dirname(line.split("::")[0]) for line in result.stdout.splitlines() if "::" in line}
    folders = {
        os.path.relpath(folder, root)
        for folder, _, names in os.walk(os.path.join(root, "tests"))
        if any(name.startswith("test_") and name.endswith(".py") for name in names)
    }
    assert "tests/losses" in folders and "tests/models/ala" in folders
    assert folders <= fast, f"no fast test in {sorted(folders - fast)}"


def test_ci_runs_the_readme_commands_as_written():
    """`.ci/run` reads its install and test commands from the README's `setup`, `setup-beam` and `setup-ray`
    snippets (the ones the getting-started page includes), so what a newcomer types is what CI proves."""
    sys.path.insert(0, os.path.join(os.path.dirname(README), ".ci"))
    import readme_commands

    setup, beam = readme_commands.commands("setup"), readme_commands.commands("setup-beam")
    assert 'pip install -e ".[test,docs]"' in setup and any(c.startswith("python -m pytest") for c in setup)
    assert 'pip install -e ".[beam]"' in beam and any(c.startswith("python -m pytest") for c in beam)
    ray = readme_commands.commands("setup-ray")
    assert 'pip install -e ".[ray]"' in ray and any(c.startswith("python -m pytest") for c in ray)
    with open(os.path.join(os.path.dirname(README), ".ci", "run")) as f:
        ci = f.read()
    code = "\n".join(line for line in ci.splitlines() if not line.lstrip().startswith("#"))
    assert "readme_commands.py setup)" in code and "readme_commands.py setup-beam)" in code
    assert "readme_commands.py setup-ray)" in code and '"${ray[@]}"' in code
    assert "pip install -e" not in code and "pytest -q" not in code, ".ci/run installs or tests on its own"
    assert "-eq 5" in code, "pytest's exit code 5 (no tests collected) must fail CI"
    with open(os.path.join(os.path.dirname(README), "docs", "getting-started.md")) as f:
        page = f.read()
    assert '--8<-- "README.md:setup"' in page and '--8<-- "README.md:setup-ray"' in page


def _figure_table(lines):
    """`{metric: (model, raw pixels)}` of the table that starts at the `metric  model  raw pixels` line, and
    the index of the line after it."""
    start = next(i for i, line in enumerate(lines) if line.split() == ["metric", "model", "raw", "pixels"])
    table, end = {}, start + 1
    while end < len(lines) and lines[end].strip():
        metric, model, raw = lines[end].split()
        table[metric] = (float(model), float(raw))
        end += 1
    return table, end


def test_the_main_job_prints_the_readmes_figures_within_the_band_it_states(tmp_path):
    """`tfdml train` as the README runs it (without the export, which changes no figure): after the epochs, the
    README's table of figures, each within the band the README states, then the time and where the report
    went."""
    with open(README) as f:
        readme = f.read()
    shown = re.search(r"\[start:main-job-output\][^\n]*\n```text\n(.*?)```", readme, re.S).group(1)
    expected, _ = _figure_table(shown.splitlines())
    spread = re.search(r"\[start:main-job-spread\][^\n]*\n(.*?)<!--", readme, re.S).group(1)
    band = (
        int(re.search(r"Expect each\s+figure within (\d+) points \(hundredths\) of the table", spread).group(1)) / 100
    )
    assert band == 0.04 and list(expected) == ["recall@1", "recall@2", "recall@4", "recall@8", "map@r", "r_precision"]
    done = subprocess.run(
        [sys.executable, "-m", "tfdml", "train", "--no-export", "--report-dir", "r"],
        cwd=tmp_path,
        env=cli_process.env(),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    printed, end = _figure_table(lines)
    assert lines[0] == "Epoch 1/10" and "Epoch 10/10" in lines[:end]
    assert list(printed) == list(expected)
    far = {
        metric: (got, want)
        for metric in expected
        for got, want in zip(printed[metric], expected[metric])
        if abs(got - want) > band
    }
    assert not far, f"outside the README's band of {band}: {far}"
    after = [line for line in lines[end:] if line.strip()]
    assert [line.split(":")[0] for line in after[:3]] == ["training", "this process", "report"], after
