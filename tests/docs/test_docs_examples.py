"""Every Python example of the documentation site runs (at test size: a few steps), in page order, so that no
example rots. A block that needs a GPU, the network, a data set or a long run carries a
`<!-- skip: reason -->` comment and is reported as skipped with that reason (`pytest -ra` counts them);
`<!-- test: old => new -->` shrinks a block to test size (`tests/docs_examples.py` says how)."""

import os
import warnings

import pytest

from tests import docs_examples
from tests.docs.test_readme import main_job_example
from tests.models.ala.test_ala_episodes import guide_example

BLOCKS = [block for page in docs_examples.pages() for block in docs_examples.blocks(page)]
# Blocks that another test runs at the same test size, with stricter checks: running them here too would train
# the same models a second time.
RUN_ELSEWHERE = {
    main_job_example().strip(): "the README's main job, run by tests/docs/test_readme.py (which checks it is the job)",
    guide_example().strip(): "run in a fresh process, every warning an error, by tests/models/ala/test_ala_episodes.py",
}
_NAMESPACES = {}  # page -> the namespace its blocks share, in order


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_example_runs(block, tmp_path_factory, monkeypatch):
    if block.skip:
        pytest.skip(f"{block.name}: {block.skip}")
    if block.code.strip() in RUN_ELSEWHERE:
        pytest.skip(f"{block.name}: {RUN_ELSEWHERE[block.code.strip()]}")
    if block.page not in _NAMESPACES:
        _NAMESPACES[block.page] = (docs_examples.namespace(), str(tmp_path_factory.mktemp("docs")))
    names, scratch = _NAMESPACES[block.page]
    monkeypatch.chdir(docs_examples.scratch_directory(scratch))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an example that warns is an example to fix
        # Keras 3 warns on every fit over a tf.data.Dataset that it ignores its shuffle=True default.
        warnings.filterwarnings("ignore", message=r"`shuffle=True` was passed", category=UserWarning)
        docs_examples.run(block, names)


def test_the_guides_have_examples_and_say_why_one_is_skipped():
    skipped = [block for block in BLOCKS if block.skip]
    assert len(BLOCKS) >= 15, f"only {len(BLOCKS)} Python blocks found: is the fence pattern still right?"
    assert len(skipped) < len(BLOCKS) / 2, f"{len(skipped)} of {len(BLOCKS)} examples skipped"
    for block in skipped:
        assert len(block.skip.split()) >= 2, f"{block.name}: say why it is skipped, got {block.skip!r}"


def test_snippet_includes_and_markers_are_read(tmp_path, monkeypatch):
    """The extraction itself: an include resolved to its section, markers attached to the next block only."""
    monkeypatch.setattr(docs_examples, "ROOT", str(tmp_path))
    (tmp_path / "source.md").write_text(
        "text\n<!-- --8<-- [start:part] -->\n```python\nx = 1\n```\n<!-- --8<-- [end:part] -->\n"
    )
    (tmp_path / "page.md").write_text(
        '--8<-- "source.md:part"\n\n<!-- test: 2 => 3 -->\n```python\ny = 2\n```\n\n'
        "<!-- skip: needs a GPU -->\n  ```python\n  z = 1\n  ```\n"
    )
    first, second, third = docs_examples.blocks("page.md")
    assert (first.code, first.skip, first.replacements) == ("x = 1", None, ())
    assert second.test_code() == "y = 3" and second.skip is None
    assert (third.code, third.skip) == ("z = 1", "needs a GPU")
    bad = docs_examples.Block("page.md", 1, "y = 2", replacements=(("4", "5"),))
    with pytest.raises(AssertionError, match="matches nothing"):
        bad.test_code()
    assert os.path.basename(first.page) == "page.md"
