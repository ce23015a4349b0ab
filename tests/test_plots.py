"""tfdml.plots: each figure is written as a readable PNG; bad input gets a clear error."""

import warnings

import numpy as np
import pytest
from matplotlib import image as mpimg
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import same_color

from tfdml import plots


def read(path):
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    return image


def test_recall_curve_single_and_compared_runs(tmp_path):
    run = {"recall@1": 0.5, "recall@2": 0.6, "recall@4": 0.7, "recall@8": 0.8, "map@r": 0.3}
    read(plots.plot_recall_curve(run, tmp_path / "one.png"))
    other = {k: v / 2 for k, v in run.items()}
    path = plots.plot_recall_curve({"rll": run, "triplet": other}, tmp_path / "sub" / "two.png")
    read(path)
    assert plots._recall_points(run) == [(1, 0.5), (2, 0.6), (4, 0.7), (8, 0.8)]
    with pytest.raises(ValueError, match="no 'recall@K' entries"):
        plots.plot_recall_curve({"map@r": 0.3}, tmp_path / "x.png")


def test_retrieval_grid(tmp_path):
    rng = np.random.default_rng(0)
    queries = [rng.integers(0, 255, (8, 8, 3), dtype=np.uint8), rng.random((10, 6))]
    neighbours = [
        [rng.integers(0, 255, (8, 8, 3), dtype=np.uint8) for _ in range(3)],
        [rng.random((5, 5, 1)) for _ in range(3)],
    ]
    flags = np.array([[True, False, True], [False, False, True]])
    image = read(plots.plot_retrieval_grid(queries, neighbours, flags, tmp_path / "grid.png"))
    assert image.shape[1] > image.shape[0]  # 4 columns, 2 rows
    read(plots.plot_retrieval_grid(queries, neighbours, None, tmp_path / "grey.png"))
    with pytest.raises(ValueError, match="one neighbour list per query"):
        plots.plot_retrieval_grid(queries, neighbours[:1], flags, tmp_path / "bad.png")


def test_training_curves(tmp_path):
    class FakeHistory:
        history = {
            "loss": [1.0, 0.6, 0.4],
            "val_loss": [1.1, 0.8, 0.7],
            "recall@1": [0.2, 0.4, 0.5],
            "val_recall@1": [0.1, 0.3, 0.35],
            "lr": [0.1, 0.1, 0.01],
        }

    read(plots.plot_training_curves(FakeHistory(), tmp_path / "h.png"))
    read(plots.plot_training_curves({"loss": [3.0, 2.0]}, tmp_path / "h2.png"))
    with pytest.raises(ValueError, match="history is empty"):
        plots.plot_training_curves({}, tmp_path / "h3.png")


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions draw (kept before they are saved and closed)."""
    drawn = []
    save = plots._save

    def keep(fig, path, **options):
        drawn.append(fig)
        return save(fig, path, **options)

    monkeypatch.setattr(plots, "_save", keep)
    return drawn


def longest_blank_band(path):
    """Longest run of all-white pixel rows in a PNG, as a fraction of its height."""
    image = mpimg.imread(path)[..., :3]
    longest = run = 0
    for blank in (image > 0.98).all(axis=(1, 2)):
        run = run + 1 if blank else 0
        longest = max(longest, run)
    return longest / image.shape[0]


def test_recall_curves_of_close_runs_are_apart(tmp_path, figures):
    """The default job's figures (model vs raw pixels differ by < 0.01): the lines must not overlap."""
    model = {"recall@1": 0.9810, "recall@2": 0.9911, "recall@4": 0.9956, "recall@8": 0.9978, "map@r": 0.557}
    raw = {"recall@1": 0.9878, "recall@2": 0.9933, "recall@4": 0.9967, "recall@8": 0.9978, "map@r": 0.618}
    plots.plot_recall_curve({"tfdml": model, "raw pixels": raw}, tmp_path / "r.png")
    ax = figures[-1].axes[0]
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    low, high = ax.get_ylim()
    assert 0.95 < low < 0.981 and 0.9978 < high < 1.01  # fitted to the data, not 0-100
    lines = ax.get_lines()
    assert len({line.get_marker() for line in lines}) == 2
    to_pixels = ax.transData.transform
    gap = abs(to_pixels((1, model["recall@1"]))[1] - to_pixels((1, raw["recall@1"]))[1])
    assert gap > 25  # pixels between the two lines at K = 1 (0.68 points of recall)
    texts = {t.get_text() for t in ax.texts}
    assert {"0.981", "0.988", "0.998"} <= texts  # values as fractions, as the job prints them
    assert "map@r 0.557" in ax.get_title() and "map@r 0.618" in ax.get_title()


def grid_cells(fig, rows, columns):
    """The title (a Text) and the frame colour (RGB in [0, 1]) of each cell of a retrieval grid, `[rows,
    columns]` each, found in the composed picture: a cell's frame is the border of its inked pixels, one
    colour all round; its title stands over the frame."""
    (ax,) = fig.axes
    texts = np.asarray(ax.texts, dtype=object).reshape(rows, columns)
    canvas = np.asarray(ax.images[0].get_array())[..., :3]
    height, width = canvas.shape[0] // rows, canvas.shape[1] // columns
    frames = np.empty((rows, columns), dtype=object)
    for q in range(rows):
        for c in range(columns):
            cell = canvas[q * height : (q + 1) * height, c * width : (c + 1) * width]
            inked = np.argwhere((cell < 250).any(axis=-1))
            (top, left), (bottom, right) = inked.min(axis=0), inked.max(axis=0)
            ring = np.concatenate(
                [
                    cell[top, left : right + 1],
                    cell[bottom, left : right + 1],
                    cell[top:bottom, left],
                    cell[top:bottom, right],
                ]
            )
            assert (ring == ring[0]).all(), (q, c)  # one colour all round
            frames[q, c] = tuple(ring[0] / 255.0)
            x, y = texts[q, c].get_position()
            assert c * width + left < x < c * width + right and y < q * height + top, (q, c)  # over its frame
    return texts, frames


def test_retrieval_grid_has_classes_scores_and_no_blank_band(tmp_path, figures):
    rng = np.random.default_rng(1)
    queries = [rng.integers(0, 255, (32, 32, 1), dtype=np.uint8) for _ in range(8)]  # the job's 8 x 5
    neighbours = [[rng.integers(0, 255, (32, 32, 1), dtype=np.uint8) for _ in range(5)] for _ in range(8)]
    flags = rng.random((8, 5)) > 0.3
    titles = [[f"{5 + j} 0.9{j}" for j in range(5)] for _ in range(8)]
    path = plots.plot_retrieval_grid(
        queries,
        neighbours,
        flags,
        tmp_path / "g.png",
        titles=titles,
        query_titles=[f"class {5 + q % 5}" for q in range(8)],
    )
    texts, frames = grid_cells(figures[-1], 8, 6)
    assert texts[0, 0].get_text() == "query\nclass 5" and texts[2, 3].get_text() == "#3\n7 0.92"
    assert all(same_color(frames[q, 0], "black") and texts[q, 0].get_fontweight() == "bold" for q in range(8))
    for q in range(8):  # each neighbour's title and frame say its own flag
        for j in range(5):
            colour = "tab:green" if flags[q, j] else "tab:red"
            assert same_color(texts[q, j + 1].get_color(), colour), (q, j)
            assert same_color(frames[q, j + 1], colour), (q, j)
    assert longest_blank_band(path) < 0.03  # the old layout left ~9 % of the height blank under the title


def test_retrieval_grid_without_classes_has_grey_frames_and_black_titles(tmp_path, figures):
    rng = np.random.default_rng(2)
    images = [[rng.integers(0, 255, (12, 9), dtype=np.uint8) for _ in range(3)] for _ in range(12)]
    queries, names = [row[0] for row in images], [f"q{q}" for q in range(12)]
    plots.plot_retrieval_grid(queries, images, None, tmp_path / "grey.png", query_titles=names, note="line 2")
    fig = figures[-1]  # as tall as the job's worst queries (12 rows), with a two-line title
    texts, frames = grid_cells(fig, 12, 4)
    assert [t.get_text() for t in texts[1]] == ["query\nq1", "#1", "#2", "#3"]
    assert all(same_color(frame, "grey") for frame in frames[:, 1:].ravel())
    assert all(same_color(text.get_color(), "black") for text in texts.ravel())
    assert fig.get_suptitle() == "Nearest neighbours (grey frames: classes unknown)\nline 2"
    renderer = FigureCanvasAgg(fig).get_renderer()  # the figure is closed: a canvas of its own to measure on
    title = fig._suptitle.get_window_extent(renderer)
    assert title.y1 <= fig.bbox.y1 and all(title.y0 > t.get_window_extent(renderer).y1 for t in texts[0])


def test_training_curves_draw_a_single_level_loss_once(tmp_path, figures):
    """A per-level loss equal to `loss` (a model that logged its only level beside the sum): one panel says so;
    distinct levels keep theirs."""
    single = {"loss": [1.0, 0.6, 0.4], "loss_H": [1.0, 0.6, 0.4], "val_map@r": [0.1, 0.2, 0.3]}
    plots.plot_training_curves(single, tmp_path / "single.png")
    titles = [ax.get_title() for ax in figures[-1].axes if ax.get_visible()]
    assert titles == ["loss = loss_H", "map@r"]
    levels = {"loss": [3.0, 2.0], "loss_L": [1.2, 0.9], "loss_H": [1.8, 1.1]}
    plots.plot_training_curves(levels, tmp_path / "levels.png")
    assert [ax.get_title() for ax in figures[-1].axes if ax.get_visible()] == ["loss", "loss_L", "loss_H"]


def test_match_calibration_marks_the_chosen_threshold(tmp_path, figures):
    from tfdml.retrieval import calibrate

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 6)
    embeddings = rng.normal(size=(5, 4))[labels] + 0.8 * rng.normal(size=(30, 4))
    cal = calibrate(embeddings, labels, target_precision=0.9)
    read(plots.plot_match_calibration(cal, tmp_path / "cal.png"))
    left, right = figures[-1].axes
    assert [line.get_xdata()[0] for line in left.get_lines() if line.get_linestyle() == "--"] == [cal.threshold]
    point = [line for line in right.get_lines() if line.get_marker() == "o"][0]
    assert (point.get_xdata()[0], point.get_ydata()[0]) == (cal.recall, cal.precision)
    assert f"threshold {cal.threshold:.3f}" in left.get_legend().get_texts()[-1].get_text()


def _grid_with_names(path, names):
    images = [np.full((8, 8), 40 * i, np.uint8) for i in range(len(names))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph ... missing from font(s)" included
        return plots.plot_retrieval_grid(
            images[:1],
            [images[1:]],
            np.array([[True] * (len(names) - 1)]),
            path,
            titles=[[f"{name} 0.90" for name in names[1:]]],
            query_titles=[f"class {names[0]}"],
        )


def test_cyrillic_and_greek_class_names_are_drawn_as_they_are(tmp_path, figures):
    """DejaVu Sans (matplotlib's default) covers Cyrillic and Greek: the names are kept, no glyph is missing."""
    names = ["Жук", "Ёлка", "Ωμέγα"]
    assert plots.font_families(names) is not None
    _grid_with_names(tmp_path / "cyrillic.png", names)
    texts, _ = grid_cells(figures[-1], 1, 3)
    assert texts[0, 0].get_text() == "query\nclass Жук" and texts[0, 2].get_text() == "#2\nΩμέγα 0.90"


def test_cjk_class_names_use_a_font_that_covers_them_or_fall_back(tmp_path, figures):
    names = ["汉字", "かな", "Жук"]
    families = plots.font_families(names)
    _grid_with_names(tmp_path / "cjk.png", names)  # no missing-glyph warning either way
    texts, _ = grid_cells(figures[-1], 1, 3)
    if families is not None:  # a CJK font is installed: the names are drawn with it
        assert texts[0, 0].get_text() == "query\nclass 汉字" and len(families) > 1
        assert texts[0, 0].get_fontfamily() == families
        assert plots.drawable_name("汉字", 4) == "汉字"
    else:
        assert texts[0, 0].get_text() == "query\nclass ?" and texts[0, 2].get_text() == "#2\nЖук 0.90"
        assert 'names no installed font can draw are shown as "?"' in figures[-1].get_suptitle()
        assert plots.drawable_name("汉字", 4) == "[4]" and plots.drawable_name("Жук", 2) == "Жук"


def test_font_families_falls_back_glyph_by_glyph(monkeypatch):
    """A second font that covers what the first lacks is added to the list; none that does gives None."""
    latin, cjk = frozenset(map(ord, "class0.9 ")), frozenset(map(ord, "汉字"))
    monkeypatch.setattr(plots, "_font_charmaps", lambda: [("Base", latin), ("Other", frozenset()), ("CJK", cjk)])
    assert plots.font_families(["class 汉字 0.9"]) == ["Base", "CJK"]
    assert plots.font_families(["class 0.9"]) == ["Base"]
    assert plots.font_families(["class Жук"]) is None
    assert plots.drawable_name("Жук", 7) == "[7]"
