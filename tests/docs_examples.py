"""The Python examples of the documentation site, as the tests run them (`tests/docs/test_docs_examples.py`).

Every ```python block of a page under `docs/` (a `--8<-- "file:section"` include resolved, as the site shows
it) runs in order in one namespace per page, in a scratch directory that holds a link to `configs/`. The
namespace starts with what the guides take as imported: `keras`, `numpy as np`, `tensorflow as tf`, `tfdml`.

A comment on the line before a block says how the tests treat it:

- `<!-- skip: reason -->`: not run (it needs a GPU, the network, data sets or a long run); the reason is
  reported as the pytest skip reason, so `pytest -ra` lists and counts them.
- `<!-- test: old => new; other => new -->`: run at test size, with each `old` text replaced (each must occur).

Run a page's examples as written (full size, no replacements), e.g. the main job in plain Keras:

    python tests/docs_examples.py docs/guides/concepts.md
"""

import dataclasses
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

_FENCE = re.compile(r"^(?P<indent>[ ]*)```python[^\n]*\n(?P<code>.*?)^(?P=indent)```[ ]*$", re.S | re.M)
_MARKER = re.compile(r"<!--\s*(?P<kind>skip|test):\s*(?P<text>.*?)\s*-->\s*$")
_SNIPPET = re.compile(r'^(?P<indent>[ ]*)--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"[ ]*$', re.M)


@dataclasses.dataclass
class Block:
    page: str  # relative to the repository root
    line: int
    code: str
    skip: str | None = None  # the reason
    replacements: tuple = ()  # (old, new) pairs for the test size

    @property
    def name(self):
        return f"{self.page}:{self.line}"

    def test_code(self):
        """The code at test size: each replacement applied; a replacement whose text is missing is an error,
        so that an example cannot grow back to full size unnoticed."""
        code = self.code
        for old, new in self.replacements:
            if old not in code:
                raise AssertionError(f"{self.name}: the test replacement {old!r} matches nothing in the block")
            code = code.replace(old, new)
        return code


def include(text):
    """`text` with pymdownx.snippets' `--8<-- "path"` and `--8<-- "path:section"` lines replaced by the file
    (relative to the repository root) or its `[start:section]` ... `[end:section]` part."""

    def replace(match):
        with open(os.path.join(ROOT, match.group("path"))) as f:
            content = f.read()
        section = match.group("section")
        if section:
            part = re.search(rf"--8<-- \[start:{section}\][^\n]*\n(.*?)\n[^\n]*--8<-- \[end:{section}\]", content, re.S)
            if not part:
                raise AssertionError(f"{match.group('path')} has no snippet section {section!r}")
            content = part.group(1)
        return include(content)

    return _SNIPPET.sub(replace, text)


def blocks(page):
    """The ```python blocks of one Markdown page (a path relative to the repository root), with their markers."""
    with open(os.path.join(ROOT, page)) as f:
        text = include(f.read())
    found = []
    for match in _FENCE.finditer(text):
        indent = len(match.group("indent"))
        code = "\n".join(line[indent:] for line in match.group("code").splitlines())
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        block = Block(page, text.count("\n", 0, match.start()) + 1, code)
        if marker and marker.group("kind") == "skip":
            block.skip = marker.group("text")
        elif marker:
            pairs = [pair.split("=>") for pair in marker.group("text").split(";") if pair.strip()]
            if any(len(pair) != 2 for pair in pairs):
                raise AssertionError(f"{block.name}: a test marker reads '<!-- test: old => new; ... -->'")
            block.replacements = tuple((old.strip(), new.strip()) for old, new in pairs)
        found.append(block)
    return found


def pages():
    """Every Markdown page under docs/, relative to the repository root, sorted."""
    found = []
    for folder, _, files in os.walk(DOCS):
        found += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".md")]
    return sorted(found)


def namespace():
    import keras
    import numpy as np
    import tensorflow as tf

    import tfdml

    return {"__name__": "__docs__", "keras": keras, "np": np, "tf": tf, "tfdml": tfdml}


def run(block, names, full=False):
    """Runs one block in `names` (at test size unless `full`)."""
    code = block.code if full else block.test_code()
    exec(compile(code, block.name, "exec"), names)


def scratch_directory(path):
    """Prepares `path` as the examples' working directory: `configs/` linked in."""
    os.makedirs(path, exist_ok=True)
    link = os.path.join(path, "configs")
    if not os.path.exists(link):
        os.symlink(os.path.join(ROOT, "configs"), link)
    return path


if __name__ == "__main__":
    import tempfile

    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} docs/<page>.md   (runs its examples as written)")
    page = os.path.relpath(os.path.abspath(sys.argv[1]), ROOT)
    sys.path.insert(0, ROOT)  # this checkout's tfdml
    names = namespace()
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch_directory(scratch))
        for block in blocks(page):
            if block.skip:
                print(f"# {block.name}: skipped ({block.skip})", flush=True)
                continue
            print(f"# {block.name}", flush=True)
            run(block, names, full=True)
