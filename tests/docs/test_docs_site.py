"""The documentation site covers the code: the built API reference holds every public name of tfdml, the
generated command-line and configuration pages list every option and key (each key saying what it does), and
the README stays short and links into the site. The site build (`mkdocs build --strict`) needs the docs extra."""

import dataclasses
import inspect
import os
import re
import shutil
import subprocess
import sys
import typing
import zlib

import pytest

from tests import ROOT

sys.path.insert(0, os.path.join(ROOT, "docs"))

import hooks  # noqa: E402  (docs/hooks.py: the generators the site build runs)

from tests.optional_extras import import_or_reason  # noqa: E402

pytestmark = pytest.mark.slow  # every test reads the built site (a module fixture of about 45 s)


def _inventory(path):
    """The object names of a Sphinx inventory (objects.inv, version 2), which mkdocstrings writes."""
    with open(path, "rb") as f:
        for _ in range(4):
            f.readline()  # "# Sphinx inventory version 2", project, version, "# The remainder ... zlib"
        text = zlib.decompress(f.read()).decode()
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module as CI builds it (`mkdocs build --strict`)."""
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
    return site


@pytest.fixture(scope="module")
def inventory(site):
    return _inventory(site / "objects.inv")


def test_no_page_reads_past_5000_words(site):
    """A page a reader gets through: its article's words as rendered (code, tables and maths included), the
    navigation and the footer left out. The label-noise benchmark's per-cell tables stay in its results folder."""
    import html

    counts = {}
    for path in site.rglob("*.html"):
        article = re.search(r"<article.*?</article>", path.read_text(encoding="utf-8"), re.S)
        if article:
            counts[str(path.relative_to(site))] = len(html.unescape(re.sub(r"<[^>]+>", " ", article.group(0))).split())
    assert len(counts) > 50 and counts["benchmarks/label_noise/index.html"] > 1000
    long = {page: words for page, words in counts.items() if words > 5000}
    assert not long, long


def test_no_page_tags_rows_with_a_machine_letter(site):
    """Machine tags such as "[A]" / "[B]" belong to the per-cell tables in the results folders, never on a page:
    a page's table reads one machine and says which in words. Code (shapes such as `[B]`) is left out."""
    tagged = {}
    for path in site.rglob("*.html"):
        article = re.search(r"<article.*?</article>", path.read_text(encoding="utf-8"), re.S)
        if article:
            text = re.sub(r"<[^>]+>", " ", re.sub(r"<code.*?</code>", "", article.group(0), flags=re.S))
            found = re.findall(r"(?<=\s)\[[A-Z]\](?=[\s|,.;)]|$)", text)
            if found:
                tagged[str(path.relative_to(site))] = found
    assert not tagged, tagged


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


def test_print_config_says_of_each_key_what_the_page_of_the_keys_says(capsys):
    """`tfdml train --print-config` and the generated page read one description of each key."""
    import html

    from tfdml import cli

    assert cli.main(["train", "--print-config", "--set", "model.type=multilevel"]) == 0
    printed, comment, path = {}, [], []
    for line in capsys.readouterr().out.splitlines():
        text = line.lstrip()
        if text.startswith("# "):
            comment.append(text[2:])
        elif text:
            path[(len(line) - len(text)) // 2 :] = [text.split(":", 1)[0]]
            printed[".".join(path)], comment = " ".join(comment), []
    page = hooks.configuration_page().split("## `loss.name` and `loss.params`")[0]
    said, sections = {}, set()
    for match in re.finditer(r"^\| `([\w.]+)` \|(.*)\|$", page, re.M):
        cell = re.split(r"(?<!\\)\|", match.group(2))[-1].strip()
        if "See [`" in cell:  # a section's row links to its own table
            sections.add(match.group(1))
        else:
            said[match.group(1)] = html.unescape(cell.replace("\\|", "|"))
    assert set(printed) - set(said) <= sections  # every key printed (a section set to null holds none)
    assert {key: printed[key] for key in printed if key in said} == {key: said[key] for key in printed if key in said}
    assert said["training.epochs"] == "epochs of steps_per_epoch steps"


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


def _url(path):
    """The URL MkDocs gives a page with `use_directory_urls` (`a/index.md` and `a.md` are both `a/`)."""
    stem = path[: -len(".md")]
    stem = stem[: -len("index")].rstrip("/") if stem.endswith("index") and stem.rsplit("/", 1)[-1] == "index" else stem
    return stem + "/"


def test_every_api_page_has_a_url_of_its_own():
    pages = [f"{hooks.API_DIR}/index.md", *hooks.api_pages()]
    urls = [_url(page) for page in pages]
    assert len(set(urls)) == len(urls), sorted(url for url in urls if urls.count(url) > 1)
    assert "tfdml.retrieval.index" in hooks.api_pages().values()  # the submodule that used to hide its package
    assert _url(f"{hooks.API_DIR}/retrieval.md") != _url(hooks._submodule_page("retrieval", "index"))


def test_the_build_refuses_two_pages_on_one_url():
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]') builds the site")
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File, Files

    def page(path):
        return File(path, src_dir=ROOT, dest_dir="/tmp/site", use_directory_urls=True)

    with pytest.raises(PluginError, match="share one URL"):
        hooks.check_one_source_per_url(Files([page("a.md"), page("a/index.md")]))
    hooks.check_one_source_per_url(Files([page("a.md"), page("a/b.md")]))


def test_internal_modules_are_not_in_the_reference():
    assert hooks.INTERNAL_MODULES == {"interrupts", "keras_private", "locks"}
    assert not hooks.INTERNAL_MODULES & set(hooks.public_modules())
    assert "tfdml.locks" not in hooks.api_page("reference/api/cli.md")


def test_the_losses_reference_gives_every_loss_a_one_line_summary():
    page = hooks.api_page("reference/api/losses.md")
    rows = re.findall(r"^\| \[`(\w+)`\]\[[\w.]+\] \| `[\w.]+` \| (.*) \|$", page, re.M)
    assert len(rows) >= 40, page[:2000]
    missing = [name for name, summary in rows if not summary.strip()]
    assert not missing, f"losses without a summary: {missing}"
    assert "\n" not in "".join(summary for _, summary in rows)


def test_code_and_tables_stay_within_the_column_and_no_cell_breaks_a_word():
    """The theme's rules that keep wide content in the text column at 1400 px: code blocks wrap, clear of the
    copy button; a table lays out at the column's width, its cells wrap between words only (never inside one) and
    a table too wide for that scrolls sideways in its wrapper; long inline code breaks after a dot, an underscore
    or a slash."""
    with open(os.path.join(ROOT, "docs", "stylesheets", "extra.css")) as f:
        css = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    rules = {
        selector.strip(): body
        for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)
        for selector in selectors.split(",")
    }
    code = rules[".md-typeset pre > code"]
    assert "white-space: pre-wrap" in code and re.search(r"padding-right: [1-9]", code)  # the copy button's strip
    table = rules[".md-typeset table:not([class])"]
    assert "display: table" in table and "width: 100%" in table
    assert "overflow-x: auto" in rules[".md-typeset .md-typeset__scrollwrap"]
    for cell in (".md-typeset table:not([class]) td", ".md-typeset table:not([class]) th"):
        assert all(rule in rules[cell] for rule in ("overflow-wrap: normal", "word-break: normal", "hyphens: none"))
    in_tables = {selector: body for selector, body in rules.items() if "table" in selector}
    assert not [s for s, body in in_tables.items() if "anywhere" in body or "break-all" in body], in_tables
    widths = re.findall(r"(?<!max-)min-width:\s*([^;]+);", css)
    assert set(widths) <= {"0"}, f"a min-width widens tables past the column: {widths}"
    assert "min-width: 0" in rules[".md-typeset table:not([class]) th"]  # the theme's 5rem per header
    html = hooks.break_points("<td><code>ala.episode.val_fraction</code></td><code>short</code>")
    pieces = ("ala.", "episode.", "val_", "fraction")
    assert html == (
        "<td><code>" + "<wbr>".join(f'<span class="nw">{p}</span>' for p in pieces) + "</code></td><code>short</code>"
    )
    assert "white-space: nowrap" in rules[".md-typeset code > span.nw"]


def test_the_site_search_puts_the_guides_first(site):
    """ "resume" and "triplet" find their guides first (a real browser shows the order; the index is what the
    search ranks by): the two guides are boosted and the losses' building blocks (`tfdml.ops`) are left out."""
    import json

    with open(site / "search" / "search_index.json", encoding="utf-8") as f:
        docs = json.load(f)["docs"]
    boosts = {doc["location"]: doc.get("boost", 1) for doc in docs}
    for guide in ("guides/stopping-and-resuming/", "guides/losses/"):
        assert boosts[guide] >= 10, (guide, boosts.get(guide))
    assert not [location for location in boosts if location.startswith("reference/api/ops")]
    assert any(location.startswith("reference/api/losses") for location in boosts)  # the rest of the API is in
    api = {boost for location, boost in boosts.items() if location.startswith("reference/api/")}
    assert api == {hooks.API_SEARCH_BOOST} and hooks.API_SEARCH_BOOST < 1  # the reference after the guides


def test_no_api_summary_is_cut_at_an_abbreviation(site):
    """A name's one-line summary in the API reference is its docstring's first sentence; an "e.g." in it would
    end it there ("... batches (e.g")."""
    import html

    cut, rows = [], 0
    for path in (site / "reference" / "api").rglob("index.html"):
        for name, summary in re.findall(
            r"<tr>\s*<td><a [^>]*><code>(\w+)</code></a></td>\s*<td><code>.*?</code></td>\s*<td>(.*?)</td>\s*</tr>",
            path.read_text(encoding="utf-8"),
            re.S,
        ):
            rows += 1
            text = html.unescape(re.sub(r"<[^>]+>", "", summary)).strip().rstrip(".")
            if re.search(r"(?:\be\.g|\bi\.e|\bcf|\(e)$", text):
                cut.append((name, text[-40:]))
    assert rows > 100 and not cut, (rows, cut)


def test_the_home_page_shows_the_install_line_and_a_retrieval_picture():
    with open(os.path.join(ROOT, "docs", "index.md")) as f:
        home = f.read()
    assert "pip install -e ." in home and "tfdml train" in home
    picture = re.search(r"!\[[^\]]+\]\((assets/[\w.]+\.png)\)", home)
    assert picture and os.path.getsize(os.path.join(ROOT, "docs", picture.group(1))) > 10000
    with open(os.path.join(ROOT, "docs", "guides", "choosing-a-loss.md")) as f:
        first_paragraph = f.read().split("\n\n")[1]
    assert first_paragraph.startswith("**Start from") and "|" not in first_paragraph  # the advice, then the data


# Measures, in the loaded page, every code block and table wrapper against the text column, every word of a
# table cell (a word laid out on two lines is broken: a break is allowed after a hyphen inside prose only, and at
# the <wbr> break points between text nodes) and every copy button against the code text under it; sends the result
# to the page that holds it in a frame.
_LAYOUT_PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const column = document.querySelector('.md-content__inner');
  const right = column.getBoundingClientRect().right + 1;
  const wide = [], broken = [], covered = [];
  const lines = (node, start, end) => {
    const range = document.createRange();
    range.setStart(node, start);
    range.setEnd(node, end);
    return [...range.getClientRects()].filter((r) => r.width > 0);
  };
  for (const el of document.querySelectorAll('.md-content pre > code, .md-content .md-typeset__scrollwrap')) {
    if (el.getBoundingClientRect().right > right || (el.tagName === 'CODE' && el.scrollWidth > el.clientWidth + 1))
      wide.push(el.tagName + ': ' + el.textContent.slice(0, 50).replace(/\\s+/g, ' '));
  }
  for (const cell of document.querySelectorAll('.md-content td, .md-content th')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const code = node.parentElement.closest('code');
      for (const word of node.data.matchAll(/\\S+/g)) {
        for (let i = 1; i < word[0].length; i++) {
          const before = lines(node, word.index + i - 1, word.index + i)[0];
          const after = lines(node, word.index + i, word.index + i + 1)[0];
          const hyphen = !code && word[0][i - 1] === '-' && /\\w/.test(word[0][i - 2] || '');
          if (before && after && after.top > before.bottom - 1 && !hyphen) broken.push(word[0]);
        }
      }
    }
  }
  for (const button of document.querySelectorAll('.md-code__button')) {
    const b = button.getBoundingClientRect();
    const code = button.closest('pre') && button.closest('pre').querySelector('code');
    if (!b.width || !code) continue;
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const word of node.data.matchAll(/\\S+/g)) {
        for (const r of lines(node, word.index, word.index + word[0].length)) {
          if (r.left < b.right && r.right > b.left && r.top < b.bottom && r.bottom > b.top) covered.push(word[0]);
        }
      }
    }
  }
  parent.postMessage([window.name, window.innerWidth, wide, broken.slice(0, 20), covered.slice(0, 20)], '*');
}, 500));
</script>"""
# Collects the pages' measures (frame name, its width, what is too wide) once every frame has sent its own.
_LAYOUT_HARNESS = """<html><body style="margin: 0">FRAMES<script>
const measured = {};
window.addEventListener('message', (event) => {
  measured[event.data[0]] = event.data.slice(1);
  if (Object.keys(measured).length === COUNT) {
    const out = document.createElement('div');
    out.id = 'layout-probe';
    out.textContent = JSON.stringify(measured);
    document.body.appendChild(out);
  }
});
</script></body></html>"""


def _laid_out_pages(site):
    """Every page but the API reference's (generated from docstrings, laid out by the theme alone)."""
    return sorted(
        str(path.parent.relative_to(site))
        for path in site.glob("**/index.html")
        if path.parent != site and not str(path.parent.relative_to(site)).startswith(("reference/api", "search"))
    )


def test_no_code_block_table_or_word_passes_the_column_at_1400_px(site):
    """In a real browser at 1400 px: no code block or table wrapper passes the text column, no table cell breaks a
    word, no copy button covers code text."""
    import html
    import json

    browser = next(
        (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
    )
    if browser is None:
        pytest.skip("needs a headless Chromium (apt-get install chromium) to lay the pages out")
    # One browser start for every page: each loads in a frame 1400 px wide, the width of the window.
    frames = []
    pages = _laid_out_pages(site)
    for page in pages:
        probe = site / page / "layout_probe.html"
        probe.write_text((site / page / "index.html").read_text().replace("</body>", _LAYOUT_PROBE + "</body>"))
        frames.append(f'<iframe name="{page}" src="{probe.as_uri()}" width="1400" height="900"></iframe>')
    harness = site / "layout_probe.html"
    harness.write_text(_LAYOUT_HARNESS.replace("FRAMES", "\n".join(frames)).replace("COUNT", str(len(frames))))
    dom = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--window-size=1400,900",
            "--virtual-time-budget=15000",
            "--dump-dom",
            harness.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    found = re.search(r'<div id="layout-probe">(.*?)</div>', dom)
    assert found, "the probes did not run"
    measured = json.loads(html.unescape(found.group(1)))
    assert sorted(measured) == sorted(pages) and len(pages) > 30, measured
    assert all(width == 1400 for width, *_ in measured.values()), measured
    wide = {page: found[0] for page, (_, *found) in measured.items() if found[0]}
    assert not wide, f"wider than the text column at 1400 px: {wide}"
    broken = {page: found[1] for page, (_, *found) in measured.items() if found[1]}
    assert not broken, f"words broken inside a table cell: {broken}"
    covered = {page: found[2] for page, (_, *found) in measured.items() if found[2]}
    assert not covered, f"code text under a copy button: {covered}"


def test_an_argument_documented_as_in_a_function_gets_its_description():
    import griffe_shared_args

    docs = {"f": "F.\n\nArgs:\n    margin: the gap\n      between the boundaries.\n    alpha: the boundary.\n"}
    text = "C.\n\nArgs:\n    margin: as in `f`.\n    beta: as in `g`.\n    name: loss name.\n"
    assert griffe_shared_args.resolve_as_in(text, docs.get) == (
        "C.\n\nArgs:\n    margin: the gap between the boundaries. (as in `f`)\n    beta: as in `g`.\n"
        "    name: loss name.\n"
    )
