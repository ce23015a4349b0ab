"""One home per measured figure: a benchmark's page, read from its results file. A guide, the README, the home
page, the limitations and the docstrings say what a thing does and why and link to that page; a figure they
state in prose must be held by the results files of the benchmarks the page links to (to the precision it is
written with), or be listed here as not a measurement (a setting, a constant, a computed size). A retyped
figure that drifts from its results file, or a second page stating the same quantity differently, fails.

Code blocks, inline code and sample output are exempt: they show what a command prints, not a claim."""

import ast
import glob
import json
import os
import re

import pytest

from tests import ROOT

# What reads as a measurement: times and sizes with a unit, ratios ("5x"), signed differences (+5.6),
# mean +- spread, decimals with two places or more (recalls, MAP@R), percentages.
MEASURED = re.compile(
    r"(?<![\w.`/-])(?:\d+(?:,\d{3})*(?:\.\d+)?\s?(?:ms|s|min|GB|MB|MiB|GiB|TB)\b|\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x\b"
    r"|[+−]\d+(?:\.\d+)?\b|\d+(?:\.\d+)?\s?(?:±|\+-)\s?\d+(?:\.\d+)?|0\.\d{2,}\b|\d+(?:\.\d+)?\s?%)"
)

# Figures that are not measurements, page by page (module by module for docstrings), with why.
NOT_MEASURED = {
    "README.md": {"95 %": "the confidence level of the recall bound, a setting"},
    "docs/guides/dml-ala.md": {
        "10x": "the heads' learning-rate multiplier",
        "40 %": "the noise rate, a setting",
        "20 %": "the noise rate, a setting",
    },
    "docs/guides/export-and-serving.md": {
        "0.299": "ITU-R 601 luma weight",
        "0.587": "ITU-R 601 luma weight",
        "0.114": "ITU-R 601 luma weight",
        "2 GB": "protobuf's size limit",
        "0.95": "a recall target, a setting",
        "0.99": "a recall target, a setting",
        "95%": "the confidence level, a setting",
        "98 %": "PROJECTION_ENERGY, a setting",
    },
    "docs/guides/retrieval-evaluation.md": {
        "0.95": "a recall target, a setting",
        "95%": "the confidence level, a setting",
        "0.99": "a recall target, a setting",
        "0.90": "a recall target, a setting",
    },
    "docs/limitations.md": {"0.99": "a recall target", "0.95": "the default recall target"},
    "docs/guides/glyphs.md": {
        "0.38": "the look-alike threshold, a setting",
        "0.12": "the look-alike threshold, a setting",
        "0.40": "a shape distance tools/make_glyph_classes.py computes (deterministic), not a benchmark",
        "0.49": "a shape distance tools/make_glyph_classes.py computes (deterministic), not a benchmark",
        "0.45": "a confusion rate tools/make_glyph_classes.py computes (deterministic), not a benchmark",
    },
    "docs/guides/losses.md": {"0.80": "a property of the official sampler's distribution, tested"},
    "docs/guides/beam.md": {"2 GB": "1,000,000 x 512 x 4 bytes, computed"},
    "docs/guides/command-line.md": {"10x": "the papers' head learning-rate multiplier"},
    "docs/guides/models.md": {"10x": "the papers' head learning-rate multiplier"},
    "docs/guides/migrating.md": {"100x": "Proxy-Anchor's proxy learning-rate multiplier"},
    "tfdml/data/glyphs.py": {"30 %": "a rendering parameter"},
    "tfdml/data/glyph_classes.py": {"0.38": "the look-alike threshold", "0.12": "the look-alike threshold"},
    "tfdml/export/gallery.py": {"64 MiB": "a block size, a setting"},
    "tfdml/export/search.py": {"2 GB": "protobuf's size limit"},
    "tfdml/losses/classifier.py": {"0.05": "a default", "0.35": "a default"},
    "tfdml/losses/proxies.py": {"100x": "the proxies' learning-rate multiplier"},
    "tfdml/losses/ranked_list.py": {"0.04": "a default"},
    "tfdml/losses/smooth_ap.py": {"0.01": "the default temperature"},
    "tfdml/losses/softmax_contrastive.py": {"0.07": "the default temperature"},
    "tfdml/models/ala/model.py": {"10x": "the heads' learning-rate multiplier"},
    "tfdml/models/assessor.py": {"100x": "a bound, a setting", "4x": "a bound, a setting"},
    "tfdml/models/multilevel.py": {"10x": "the heads' learning-rate multiplier"},
    "tfdml/optimizers.py": {"10x": "the heads' learning-rate multiplier", "0.01": "a default"},
    "tfdml/recipes.py": {"10x": "the heads' learning-rate multiplier"},
    "tfdml/retrieval/evaluation.py": {"256 MiB": "the block bound, a setting"},
    "tfdml/retrieval/index.py": {"0.95": "the default target", "8x": "a setting", "6 %": "the search's precision"},
    "tfdml/training/loop.py": {"0.01": "an example learning rate"},
    "tfdml/beam/evaluation.py": {"0.21": "sample output", "0.32": "sample output", "0.61": "sample output"},
}
# Benchmark pages: their decimals must be held by their own results (and those of benchmarks they name).
NOT_MEASURED.update(
    {
        "benchmarks/beam/README.md": {
            "2.20": "the TensorFlow version",
            "2.77": "the Apache Beam version",
            "0.85": "the results' peak MiB in GB",
            "1.25": "the results' peak MiB in GB",
            "0.91": "the results' peak MiB in GB",
        },
        "benchmarks/retrieval_eval/README.md": {"0.0005": "a standard error computed from R@1", "0.95": "a target"},
    }
)
# Results other than a benchmark's that a page reads from: the glyph guide, the committed class selection.
EXTRA_RESULTS = {"docs/guides/glyphs.md": ["tfdml/data/glyph_classes.py"]}
# Measured figures in files whose owners are rewriting them at the same time (strict xfail: remove once gone).
RESULT_EXTENSIONS = (".json", ".jsonl", ".csv", ".md", ".txt")


def prose(text):
    """Markdown without what is exempt (fenced and indented code, inline code, comments, link targets,
    snippet lines), lines kept so that line numbers stay right; an admonition's indented body is prose."""
    lines, in_fence, in_code, in_note, in_doctest, blank = [], False, False, False, False, True
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            lines.append("")
            continue
        if in_fence or "--8<--" in line:
            lines.append("")
            continue
        if not line.strip():
            lines.append("")
            blank, in_doctest = True, False
            continue
        if line.startswith(("!!!", "???")):
            in_note = True
        elif in_note and line.startswith("    "):
            line = line[4:]
        else:
            in_note = False
        in_code = line.startswith("    ") and (blank or in_code)
        in_doctest = in_doctest or line.lstrip().startswith(">>>")  # an example and its output
        blank = False
        lines.append("" if in_code or in_doctest else line)
    text = "\n".join(lines)
    text = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def _numbers(text):
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:[eE]-?\d+)?", text)]


_HELD = {}


def held_values(files):
    """Every number of the given results files, rounded to 0-6 places, as strings (also x100: percentages)."""
    key = tuple(sorted(files))
    if key not in _HELD:
        values = set()
        for path in files:
            with open(path, encoding="utf-8") as f:
                for number in _numbers(f.read()):
                    for scaled in (number, 100 * number):
                        values.update(f"{abs(scaled):.{places}f}" for places in range(7))
        _HELD[key] = values
    return _HELD[key]


def results_files(page_text, page):
    """The results files of every benchmark the page links to (and of its extra sources)."""
    names = set(re.findall(r"benchmarks/(\w+)", page_text))
    files = [os.path.join(ROOT, extra) for extra in EXTRA_RESULTS.get(page, [])]
    for name in sorted(names):
        for path in glob.glob(os.path.join(ROOT, "benchmarks", name, "**", "*"), recursive=True):
            if path.endswith(RESULT_EXTENSIONS) and os.path.basename(path) != "README.md":
                files.append(path)
    return files


def _value(figure):
    """The number a figure states, as written (its first number: '0.954', '5.6', '1,498')."""
    return re.search(r"\d+(?:,\d{3})*(?:\.\d+)?", figure).group(0).replace(",", "")


def unheld_figures(text, page, extra_link_text=""):
    """`[(line, figure)]` of the figures in `text`'s prose that are neither held nor listed as not measured."""
    allowed = NOT_MEASURED.get(page, {})
    held = held_values(results_files(text + extra_link_text, page))
    found = []
    for number, line in enumerate(prose(text).split("\n"), 1):
        for match in MEASURED.finditer(line):
            figure = match.group(0)
            if figure in allowed or figure.replace(" ", "") in allowed:
                continue
            value = _value(figure)
            if figure == value and len(value.split(".")[-1]) >= 2 and value in held:
                continue  # a plain decimal of two places or more that the results hold at that precision
            found.append((number, figure))
    return found


def pages():
    paths = ["README.md", "docs/index.md", "docs/getting-started.md", "docs/limitations.md"]
    return paths + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "guides", "*.md")))


def benchmark_pages():
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "benchmarks", "*", "README.md")))


@pytest.mark.parametrize("page", benchmark_pages())
def test_a_benchmark_page_states_the_decimals_its_results_hold(page):
    """A benchmark page is a figure's home, so its prose may state figures; a decimal of two places or more
    (a recall, a MAP@R, a ratio) must be one its results files hold at that precision, so that the page and
    the tables generated from the results cannot disagree."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    name = page.split("/")[1]
    held = held_values(results_files(f"benchmarks/{name}/ {text}", page))
    allowed = NOT_MEASURED.get(page, {})
    found = [
        (number, match.group(0))
        for number, line in enumerate(prose(text).split("\n"), 1)
        for match in re.finditer(r"(?<![\w.])\d+\.\d{2,}\b", line)
        if match.group(0) not in held and match.group(0) not in allowed
    ]
    assert not found, f"{page} states decimals its results files do not hold: {found}"


@pytest.mark.slow
@pytest.mark.parametrize("page", pages())
def test_a_page_states_only_figures_its_benchmarks_hold(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    found = unheld_figures(text, page)
    assert not found, (
        f"{page} states figures that no results file of the benchmarks it links holds (link the benchmark's "
        f"page instead of retyping them, or list a setting in NOT_MEASURED): {found}"
    )


def docstrings(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "name", "module"), doc


def _module_params():
    params = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tfdml", "**", "*.py"), recursive=True)):
        name = os.path.relpath(path, ROOT)
        params.append(pytest.param(name, id=name))
    return params


@pytest.mark.parametrize("module", _module_params())
def test_no_docstring_states_a_measured_figure(module):
    found = [
        (where, figure)
        for where, doc in docstrings(os.path.join(ROOT, module))
        for _, figure in unheld_figures(doc, module)
    ]
    assert not found, f"{module}: docstrings state measured figures (say what and why, link the benchmark): {found}"


def test_the_check_catches_a_retyped_figure_and_accepts_a_held_one():
    """A page that links the label-noise benchmark may state a figure its results hold, not a drifted copy."""
    with open(os.path.join(ROOT, "benchmarks", "label_noise", "results_600.jsonl"), encoding="utf-8") as f:
        row = json.loads(f.readline())
    value = next(v for v in row.values() if isinstance(v, float) and 0.1 < v < 1)
    figure = f"{value:.4f}"  # four places: the label-noise results hold nearly every three-place decimal
    link = "[label noise](../benchmarks/label_noise/index.md)"
    assert unheld_figures(f"Recall@1 was {figure} here {link}.", "docs/guides/x.md") == []
    held = held_values(results_files(link, "docs/guides/x.md"))
    # a drifted copy of it: the first of these offsets that no results file happens to hold, kept below 1 (the
    # check reads a decimal as measured when it starts with 0.)
    offsets = [value + sign * k * 0.0123 for k in range(1, 80) for sign in (1, -1)]
    drifted = next(f"{v:.4f}" for v in offsets if 0.1 < v < 1 and f"{v:.4f}" not in held)
    assert unheld_figures(f"Recall@1 was {drifted} here {link}.", "docs/guides/x.md") == [(1, drifted)]
    assert unheld_figures(f"It takes 12.5 ms a query {link}.", "docs/guides/x.md") == [(1, "12.5 ms")]
    assert unheld_figures("Run it:\n\n    took 12.5 ms\n", "docs/guides/x.md") == []  # sample output
    assert unheld_figures("```text\n0.9821\n```\n`0.1234`", "docs/guides/x.md") == []


def test_the_export_guides_sample_index_line_is_the_benchmarks_current_row():
    """The `tfdml export` line the Export guide shows is what the search benchmark's current `scann_default` row
    at 1,000,000 x 512 (embedding-like data) prints, not an earlier run's."""
    from tfdml.retrieval.tuning import describe_recall

    with open(os.path.join(ROOT, "benchmarks", "search", "results_embedding.json")) as f:
        record = json.load(f)["1000000/scann_default"]["index_recall"]
    with open(os.path.join(ROOT, "docs", "guides", "export-and-serving.md"), encoding="utf-8") as f:
        guide = f.read()
    shown = re.search(r"\n      index: (.*?)\n\n", guide, re.S).group(1)
    assert " ".join(shown.split()) == describe_recall(record)


# A multiple of DML-ALA's cost ("5.5x a plain run", "9.5 plain steps"), and a sentence that no GPU was used.
ALA_COST = re.compile(
    r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:x|times)\b[^.\n]{0,30}?\bplain (step|run)|\b\d+(?:\.\d+)? plain (steps)"
)
NO_GPU = re.compile(
    r"[Nn]othing (?:has been|was|is) run on a GPU|[Nn]o GPU was available|[Ee]very figure comes from CPUs"
)
# The homes of DML-ALA's cost: one step against one plain step, and whole label-noise runs against plain runs.
ALA_COST_HOMES = {"benchmarks/ala_step/README.md": {"step", "steps"}, "benchmarks/label_noise/README.md": {"run"}}


@pytest.mark.parametrize("page", pages() + benchmark_pages())
def test_dml_alas_cost_and_the_gpu_claim_are_each_stated_one_way(page):
    """DML-ALA's cost as a multiple lives on its two benchmark pages, each of one kind (a step against a plain
    step; a whole run against a plain run), so that "9.5 plain steps" and "5.5x a plain run" are not one quantity
    stated two ways; no page says no GPU was used while the GPU benchmark ran on one."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = " ".join(prose(f.read()).split())  # a claim may run over a line break
    kinds = {next(k for k in match.groups() if k) for match in ALA_COST.finditer(text)}
    assert kinds <= ALA_COST_HOMES.get(page, set()), f"{page} states DML-ALA's cost as a multiple of a plain {kinds}"
    assert not NO_GPU.search(text), f"{page}: {NO_GPU.search(text).group(0)} (the GPU benchmark ran on one)"


def test_the_one_way_checks_catch_a_second_statement():
    assert {m.group(1) or m.group(2) for m in ALA_COST.finditer("a step costs about 5 times a plain step")} == {"step"}
    assert [m.group(2) for m in ALA_COST.finditer("it costs 9.5 plain steps")] == ["steps"]
    assert not ALA_COST.search("a step costs several times a plain step")  # no figure: a description
    assert NO_GPU.search("Nothing has been run on a GPU: every figure comes from CPUs")
