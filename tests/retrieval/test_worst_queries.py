"""The worst queries (`tfdml.retrieval.worst_queries`) against a NumPy ranking written from the definitions, and
their offline page (`tfdml.report_pages`): every image it names exists, every class name shown is in it,
escaped; `tfdml evaluate --worst-queries`; the report's summary links the page."""

import html.parser
import os
import re

import numpy as np
import pytest

from tfdml import report_pages
from tfdml.cli import main
from tfdml.pipeline.report import write_summary
from tfdml.retrieval import worst_queries

# Names in several scripts (the glyph set's kinds: Armenian, Georgian, Hebrew, Greek, Cyrillic), one CJK, and
# names a page must escape.
NAMES = ["ա", "ბ", "א", "λ", "ж", "漢字", "<b>bold</b> & co", 'say "hi"']


def _data(seed=0, classes=8, per_class=6, dim=5):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), per_class)
    centres = rng.normal(size=(classes, dim))
    x = centres[labels] * 0.6 + rng.normal(size=(len(labels), dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), labels


def _reference(queries, gallery, q_labels, g_labels, same_set):
    """Per query (with a same-class item): the stable ranking by squared L2, the first correct rank and AP@R."""
    out = {}
    for q in range(len(queries)):
        d = np.sum((gallery.astype(np.float64) - queries[q]) ** 2, axis=1)
        order = np.argsort(d, kind="stable")
        if same_set:
            order = order[order != q]
        hits = g_labels[order] == q_labels[q]
        r = int(hits.sum())
        if r == 0:
            continue
        precision = np.cumsum(hits[:r]) / np.arange(1, r + 1)
        out[q] = (order, int(np.argmax(hits)) + 1, float(np.sum(precision * hits[:r]) / r))
    return out


@pytest.mark.parametrize("by", ["rank", "ap"])
def test_worst_queries_match_a_numpy_ranking(by):
    x, y = _data()
    worst = worst_queries(x, y, count=len(y), neighbours=4, by=by)
    reference = _reference(x, x, y, y, same_set=True)
    assert worst.evaluated == len(y) and worst.same_set and worst.score_name == "cosine"
    for query in worst.queries:
        order, rank, ap = reference[query.query]
        assert query.neighbours == tuple(order[:4])
        assert query.neighbour_labels == tuple(y[order[:4]])
        assert query.first_correct_rank == rank and query.first_correct == order[rank - 1]
        np.testing.assert_allclose(query.average_precision, ap, atol=1e-12)
        cosines = x[order[:4]] @ x[query.query]
        np.testing.assert_allclose(query.scores, cosines, atol=1e-5)
        np.testing.assert_allclose(query.first_correct_score, x[order[rank - 1]] @ x[query.query], atol=1e-5)
    keys = [(-reference[q.query][1], reference[q.query][2], q.query) for q in worst.queries]
    if by == "ap":
        keys = [(ap, rank, q) for rank, ap, q in keys]
    assert keys == sorted(keys)
    assert max(q.first_correct_rank for q in worst.queries) > 4  # some nearest correct item lies beyond the top 4


def test_query_gallery_mode_and_classes_absent_from_the_gallery():
    x, y = _data(seed=1)
    queries, q_labels = x[:10] + 0.05, np.concatenate([y[:9], [99]])  # the last query's class is not in the gallery
    worst = worst_queries(x, y, queries, q_labels, count=20, neighbours=3, distance="dot_product")
    reference = _reference(queries, x, q_labels, y, same_set=False)
    assert worst.evaluated == 9 and not worst.same_set and worst.score_name == "dot product"
    assert sorted(q.query for q in worst.queries) == sorted(reference)
    for query in worst.queries:
        _, rank, ap = reference[query.query]
        assert query.first_correct_rank == rank
        np.testing.assert_allclose(query.average_precision, ap, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"by": "precision"}, "by must be one of"),
        ({"count": 0}, "must be positive"),
        ({"distance": "cosine"}, "distance"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    x, y = _data()
    with pytest.raises(ValueError, match=message):
        worst_queries(x, y, **kwargs)


def test_no_rankable_query_is_an_error():
    x = np.eye(3, dtype=np.float32)
    with pytest.raises(ValueError, match="no query has a same-class item"):
        worst_queries(x, np.arange(3))


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.links, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "a":
            self.links.append(attrs["href"])

    def handle_data(self, data):
        self.text.append(data)


def _read_page(path):
    page = _Page()
    with open(path, encoding="utf-8") as f:
        source = f.read()
    page.feed(source)
    return page, source


def _shown_names(worst, names):
    labels = {q.label for q in worst.queries} | {label for q in worst.queries for label in q.neighbour_labels}
    return {names[label] for label in labels}


def test_page_names_existing_images_and_every_shown_class(tmp_path):
    x, y = _data()
    images = np.random.default_rng(0).integers(0, 256, size=(len(y), 12, 12), dtype=np.uint8)
    worst = worst_queries(x, y, count=6, neighbours=3)
    written = report_pages.write_worst_queries_page(tmp_path, worst, images, class_names=NAMES, title="Worst")
    page, source = _read_page(written["page"])
    assert page.images and all((tmp_path / src).is_file() for src in page.images)
    # the queries, their neighbours and the nearest correct items beyond the top 3, each once
    beyond = sum(q.first_correct_rank > 3 for q in worst.queries)
    assert len(page.images) == len(worst.queries) * 4 + beyond
    text = "".join(page.text)
    assert _shown_names(worst, NAMES) <= {name for name in NAMES if name in text}
    assert "<b>" not in source  # the names are text, not markup
    assert report_pages.GRID in page.links and os.path.isfile(written["grid"])
    for query in worst.queries:
        assert f"#{query.first_correct_rank}" in text


def test_page_without_images(tmp_path):
    x, y = _data()
    worst = worst_queries(x, y, count=3, neighbours=2)
    written = report_pages.write_worst_queries_page(tmp_path, worst, None, class_names=None)
    page, _ = _read_page(written["page"])
    assert written["grid"] is None and page.images == [] and not (tmp_path / report_pages.IMAGES).exists()
    assert str(worst.queries[0].label) in "".join(page.text)


def test_summary_links_the_worst_queries_page(tmp_path):
    (tmp_path / report_pages.PAGE).write_text("<html></html>")
    write_summary(tmp_path, {"name": "job", "model": {"recall@1": 0.5}, "raw_pixels": {"recall@1": 0.25}})
    summary = (tmp_path / "summary.md").read_text()
    assert f"]({report_pages.PAGE})" in summary and "| recall@1 | 0.5000 | 0.2500 |" in summary


def test_evaluate_writes_the_page(tmp_path, capsys):
    x, y = _data()
    images = np.random.default_rng(1).random((len(y), 8, 8)).astype(np.float32)
    npz = tmp_path / "emb.npz"
    np.savez(npz, embeddings=x, labels=y, images=images, class_names=np.array(NAMES))
    out = tmp_path / "worst"
    code = main(["evaluate", "--embeddings", str(npz), "--metrics", "recall", "--worst-queries", str(out)])
    assert code == 0, capsys.readouterr()
    assert f"worst queries: {out / report_pages.PAGE}" in capsys.readouterr().out
    page, _ = _read_page(out / report_pages.PAGE)
    assert len(page.images) >= 12 and all((out / src).is_file() for src in page.images)
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--embeddings", str(npz), "--worst-queries", str(out), "--worst-order", "worst"])
    assert exit_info.value.code == 2 and "--worst-order" in capsys.readouterr().err


def test_query_gallery_page_shows_the_query_images(tmp_path, capsys):
    x, y = _data(seed=2)
    rng = np.random.default_rng(2)
    is_query = np.arange(len(y)) % 6 == 0  # one query per class, the others its gallery
    x, y = np.concatenate([x[is_query], x[~is_query]]), np.concatenate([y[is_query], y[~is_query]])
    npz = tmp_path / "emb.npz"
    np.savez(
        npz,
        embeddings=x[8:],
        labels=y[8:],
        images=rng.integers(0, 256, size=(len(y) - 8, 8, 8, 3), dtype=np.uint8),
        query_embeddings=x[:8],
        query_labels=y[:8],
        query_images=rng.integers(0, 256, size=(8, 8, 8, 3), dtype=np.uint8),
        class_names=np.array(NAMES),
    )
    out = tmp_path / "worst"
    code = main(["evaluate", "--embeddings", str(npz), "--metrics", "recall", "--worst-queries", str(out)])
    assert code == 0, capsys.readouterr()
    page, _ = _read_page(out / report_pages.PAGE)
    assert sum(src.split("/")[-1].startswith("q") for src in page.images) == 8  # every query, from its own set
    assert all((out / src).is_file() for src in page.images)
    worst = worst_queries(x[8:], y[8:], x[:8], y[:8], count=12)
    assert _shown_names(worst, NAMES) <= set(NAMES) and all(n in "".join(page.text) for n in _shown_names(worst, NAMES))


def test_an_image_folders_page_names_the_files_of_the_query_and_of_its_wrong_neighbours(tmp_path):
    x, y = _data()
    images = np.zeros((len(y), 8, 8), np.uint8)
    paths = [f"/data/photos/class {label}/IMG_{i:04d}.jpg" for i, label in enumerate(y)]
    files = report_pages.item_files(paths)
    assert files[0] == "class 0/IMG_0000.jpg"  # relative to the image folder
    worst = worst_queries(x, y, count=4, neighbours=3)
    written = report_pages.write_worst_queries_page(tmp_path, worst, images, files=files, grid=False)
    page, source = _read_page(written["page"])
    text = "".join(page.text)
    for query in worst.queries:
        assert files[query.query] in text and f"query {query.query}<" not in source
        for j, label in zip(query.neighbours, query.neighbour_labels):
            assert (files[j] in text) == (label != query.label or j == query.first_correct), (j, label)
    assert "/data/photos" not in source and "/<wbr>IMG_" in source  # a break at the slash, not in a name


def test_the_report_names_files_only_when_the_evaluation_met_the_folders_items_in_order():
    from tfdml.pipeline.report import evaluated_files

    class Folder:
        paths = ["/x/a/1.png", "/x/a/2.png", "/x/b/3.png"]
        labels = np.array([0, 0, 1])

    class Met:
        labels = np.array([0, 0, 1])

    class Shuffled:
        labels = np.array([0, 1, 0])

    assert evaluated_files(Folder, Met) == ["a/1.png", "a/2.png", "b/3.png"]
    assert evaluated_files(Folder, Shuffled) is None
    assert evaluated_files(object(), Met) is None  # an embedded data set has no files


def test_the_page_keeps_names_whole_and_uses_the_width():
    """No rule lets a class name break inside a word; the items grow with the window instead of a fixed width."""
    item = re.search(r"\.item \{(.*?)\}", report_pages._STYLE, re.S).group(1)
    assert "anywhere" not in item and "overflow-wrap: normal" in item and "word-break: normal" in item
    assert re.search(r"flex: 1 1 0", item) and not re.search(r"(?<![-\w])width: \d+px", item)  # the row shared
    assert "min-width: min-content" in item  # a cell as wide as its longest word
    name_rules = re.findall(r"\.item \.name \{(.*?)\}", report_pages._STYLE, re.S)
    assert all("anywhere" not in rule and "break-all" not in rule for rule in name_rules)


def test_a_long_class_name_wraps_between_its_words(tmp_path):
    x, y = _data(classes=2, per_class=3)
    names = ["mountain_bikes_with_disc_brakes", "road <bikes>"]
    worst = worst_queries(x, y, count=len(y), neighbours=2)
    written = report_pages.write_worst_queries_page(tmp_path, worst, None, class_names=names, grid=False)
    _, source = _read_page(written["page"])
    assert "<bdi>mountain_<wbr>bikes_<wbr>with_<wbr>disc_<wbr>brakes</bdi>" in source
    assert "<bdi>road &lt;bikes&gt;</bdi>" in source


@pytest.mark.parametrize("value, shown", [(0.004, "0.0040"), (0.0456, "0.046"), (0.87, "0.87"), (0.0, "0")])
def test_average_precision_is_printed_with_the_digits_that_tell_it_from_zero(value, shown):
    assert report_pages.average_precision_text(value) == shown
    assert value == 0 or abs(float(shown) - value) <= 0.05 * value


def test_the_grid_gives_a_class_name_its_own_line_and_keeps_its_case(tmp_path, monkeypatch):
    """A right-to-left name (Hebrew) never shares a line with its score, which a right-to-left layout would
    put first; a capital Cyrillic И stays И, labelled with its code point beside the lowercase и."""
    from tfdml import plots

    drawn = []
    original = plots._draw_cell
    monkeypatch.setattr(
        plots,
        "_draw_cell",
        lambda ax, canvas, corner, image, colour, label, families: (
            drawn.append(label),
            original(ax, canvas, corner, image, colour, label, families),
        )[1],
    )
    x, y = _data(classes=4, per_class=3)
    names = ["ל", "И", "и", "ж"]
    worst = worst_queries(x, y, count=len(y), neighbours=3)  # every query: every class is a query's
    images = np.zeros((len(y), 8, 8), np.uint8)
    written = report_pages.write_worst_queries_page(tmp_path, worst, images, class_names=names)
    assert os.path.isfile(written["grid"])
    neighbour_labels = [label for label in drawn if label.startswith("#")]
    assert len(neighbour_labels) >= len(y) * 3
    for label in neighbour_labels:
        rank_line, name_line = label.split("\n")
        assert re.fullmatch(r"#\d+  -?\d\.\d\d", rank_line) and name_line in names, label
    queries = [label for label in drawn if label.startswith("query")]
    assert len(queries) == len(worst.queries) == len(y)
    for query, label in zip(worst.queries, queries):
        assert label == f"query\nclass {names[query.label]} (U+{ord(names[query.label]):04X})"
    _, source = _read_page(written["page"])
    assert 'title="U+0418 CYRILLIC CAPITAL LETTER I"><bdi>И</bdi>' in source
    assert 'title="U+0438 CYRILLIC SMALL LETTER I"><bdi>и</bdi>' in source


def test_the_reports_retrieval_grid_gives_names_their_own_line(monkeypatch):
    """The report's retrieval_grid.png as the worst queries' grid: the score beside the rank, the class alone."""
    import types

    from tfdml import plots
    from tfdml.pipeline import report

    seen = {}
    monkeypatch.setattr(plots, "plot_retrieval_grid", lambda *args, **kwargs: seen.update(kwargs))
    x, y = _data(classes=3, per_class=3)
    evaluation = types.SimpleNamespace(embeddings=x, labels=y, pixels=np.zeros((len(y), 4, 4), np.float32))
    settings = types.SimpleNamespace(grid_queries=3, grid_neighbours=2)
    report._retrieval_grid(evaluation, settings, "unused.png", ["ל", "И", "ж"])
    assert all(name in ("ל", "И", "ж") for row in seen["titles"] for name in row)
    assert all(re.fullmatch(r"-?\d\.\d\d", score) for row in seen["scores"] for score in row)
    assert seen["query_titles"] == ["class ל (U+05DC)", "class И (U+0418)", "class ж (U+0436)"]
