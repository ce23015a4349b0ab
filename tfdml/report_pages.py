"""HTML pages of a report, readable offline: the worst queries (`write_worst_queries_page`).

The page is plain HTML with its images as PNG files in a folder beside it (no script, no network), so the
report folder can be copied, zipped or opened from disk. Class names are written as text (UTF-8, HTML-escaped,
isolated for right-to-left scripts, never broken inside a word), so the browser draws them in any script its
fonts cover; a one-character name also carries its code point, which tells a lowercase letter drawn as large as
its capital from the capital. The PNG grid beside the page draws them with matplotlib's fonts
(`tfdml.plots.drawable_name`), each name on a line of its own. Items of an image folder show their file, relative
to the folder (`item_files`).
"""

import html
import math
import os
import unicodedata

import numpy as np
from PIL import Image

from tfdml import plots

PAGE = "worst_queries.html"
GRID = "worst_queries.png"
IMAGES = "worst_queries_images"

_ORDER_TEXT = {
    "rank": "by the rank of their nearest correct item (worst first; ties by average precision)",
    "ap": "by their average precision, their term of MAP@R (lowest first; ties by the rank of their nearest "
    "correct item)",
}

_STYLE = """
body { font-family: "DejaVu Sans", "Noto Sans", sans-serif; margin: 1.5em; color: #222; }
.query { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 8px; margin: 0 0 14px;
  padding-bottom: 10px; border-bottom: 1px solid #ddd; }
.item { flex: 1 1 0; max-width: 220px; min-width: min-content; font-size: 12px; text-align: center;
  word-break: normal; overflow-wrap: normal; hyphens: none; }
.item img { width: 100%; height: auto; aspect-ratio: 1; image-rendering: pixelated; border: 4px solid #999;
  box-sizing: border-box; display: block; margin: 0 auto 2px; background: #fff; object-fit: contain; }
.item .file { font-size: 11px; color: #555; overflow-wrap: anywhere; }
.item.the-query img { border-color: #222; }
.item.same img { border-color: #2ca02c; }
.item.other img { border-color: #d62728; }
.item .name { font-size: 15px; font-weight: bold; }
.gap { align-self: center; font-size: 22px; color: #888; padding: 0 4px; }
.noimage { width: 100%; aspect-ratio: 1; box-sizing: border-box; border: 4px solid #999; display: flex;
  align-items: center; justify-content: center; margin: 0 auto 2px; color: #777; }
"""


def write_worst_queries_page(
    folder,
    worst,
    images=None,
    query_images=None,
    class_names=None,
    title="Worst queries",
    grid=True,
    files=None,
    query_files=None,
):
    """Writes `worst_queries.html` (with its images in `worst_queries_images/`) and, with images and `grid`,
    `worst_queries.png` into `folder`; returns `{"page": path, "grid": path or None}`.

    Args:
      folder: output folder (created if missing).
      worst: a `tfdml.retrieval.WorstQueries`.
      images: the gallery images `[N, H, W(, C)]` (uint8, or floats drawn from their own range); None: a
        page without images.
      query_images: the query set's images in query / gallery mode (default `images`).
      class_names: names indexed by label (any script); a label outside them is shown as its number.
      title: the page's heading.
      grid: also write the PNG grid (`tfdml.plots.plot_retrieval_grid`) beside the page.
      files: the gallery items' files as the page shows them (`item_files`), indexed by gallery row; the
        query's and its other-class neighbours' are written under them. None: items are named by their row.
      query_files: the query set's files in query / gallery mode (default `files`).
    """
    os.makedirs(folder, exist_ok=True)
    query_images = images if query_images is None else query_images
    query_files = files if query_files is None and worst.same_set else query_files
    if images is not None:
        os.makedirs(os.path.join(folder, IMAGES), exist_ok=True)
    shown = _Shown(images, query_images, class_names, files, query_files)
    html_rows = [_query_html(folder, query, shown) for query in worst.queries]
    grid_path = None
    if grid and images is not None and worst.queries:
        grid_path = _write_grid(os.path.join(folder, GRID), worst, images, query_images, class_names)
    page = os.path.join(folder, PAGE)
    with open(page, "w", encoding="utf-8") as f:
        f.write(_page(worst, html_rows, title, grid_path is not None))
    return {"page": page, "grid": grid_path}


def class_name(label, class_names):
    """The name of `label` (`class_names[label]`), or the label's number when there is no such name."""
    if class_names is not None and 0 <= int(label) < len(class_names):
        return str(class_names[int(label)])
    return str(int(label))


def item_files(paths):
    """Each file of an image folder (`folder/<class name>/<file>`, as `tfdml.data.image_folder` lists them) as
    the page shows it, relative to the folder: `<class name>/<file>`."""
    return [os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path)) for path in paths]


def average_precision_text(value):
    """An average precision with the digits that tell it from zero: two places, or two significant digits
    below 0.1 (`0.0043`, not `0.00`), and `0` when it is exactly zero."""
    if value == 0:
        return "0"  # exactly: no correct item within the first R
    if value >= 0.1:
        return f"{value:.2f}"
    return f"{value:.{1 - math.floor(math.log10(value))}f}"


def code_point(name):
    """`U+0438 CYRILLIC SMALL LETTER I` for a one-character name (its case, which a glyph drawn to fill its
    image does not show), else ""."""
    if len(name) != 1:
        return ""
    return f"U+{ord(name):04X} {unicodedata.name(name, '')}".strip()


def query_title(name):
    """A grid's query title: `class и (U+0438)`, the code point of a one-character name with it."""
    point = code_point(name).split(" ")[0]
    return f"class {name}" + (f" ({point})" if point else "")


class _Shown:
    """What the page shows of the items: images, class names and files, of the gallery and of the queries."""

    def __init__(self, images, query_images, class_names, files, query_files):
        self.images, self.query_images, self.class_names = images, query_images, class_names
        self.files, self.query_files = files, query_files


def _page(worst, rows, title, has_grid):
    kind = "each item queries all the others" if worst.same_set else "queries search the gallery"
    intro = (
        f"The {len(worst.queries)} worst of {worst.evaluated} queries ({kind}), "
        f"{_ORDER_TEXT[worst.by]}. Each row: the query, its top neighbours (rank, class, {worst.score_name}; "
        "green frame: same class, red: other class), then its nearest correct item with its rank. "
        "AP: the query's average precision (its term of MAP@R)."
    )
    grid = f'<p>The same queries as a figure: <a href="{GRID}">{GRID}</a>.</p>' if has_grid else ""
    return (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n<p>{html.escape(intro)}</p>\n{grid}\n"
        + "\n".join(rows)
        + "\n</body>\n</html>\n"
    )


def _query_html(folder, query, shown):
    """One query's row: the query, its neighbours, then its nearest correct item; the query's file and those of
    its other-class neighbours under them."""
    name = class_name(query.label, shown.class_names)
    file = _file(shown.query_files, query.query)
    caption = (
        f"{_file_html(file) if file else f'query {query.query}'}<br>"
        f"AP {average_precision_text(query.average_precision)}, nearest correct #{query.first_correct_rank}"
    )
    cells = [_cell(folder, shown.query_images, query.query, "q", name, caption, "the-query", file)]
    for rank, (j, label, score) in enumerate(zip(query.neighbours, query.neighbour_labels, query.scores), 1):
        kind = "same" if label == query.label else "other"
        file = _file(shown.files, j)
        caption = f"#{rank}<br>{score:.3f}" + (f"<br>{_file_html(file)}" if file and kind == "other" else "")
        cells.append(_cell(folder, shown.images, j, "g", class_name(label, shown.class_names), caption, kind, file))
    if query.first_correct_rank > len(query.neighbours):
        cells.append('<div class="gap">&hellip;</div>')
        caption = f"#{query.first_correct_rank}<br>{query.first_correct_score:.3f}<br>nearest correct"
        file = _file(shown.files, query.first_correct)
        cells.append(_cell(folder, shown.images, query.first_correct, "g", name, caption, "same", file))
    return f'<div class="query" id="query-{query.query}">' + "".join(cells) + "</div>"


def _file(files, row):
    return "" if files is None else str(files[row])


def _breakable(text):
    """`text` as escaped HTML with a line break allowed after each `_` (a snake_case name's words), so that a
    long name wraps between its words, never inside one."""
    return "_<wbr>".join(html.escape(part) for part in text.split("_"))


def _file_html(file):
    """A file as escaped HTML, a line break allowed after each `/` and `_` before one inside a word."""
    return '<span class="file" dir="ltr">' + "/<wbr>".join(_breakable(part) for part in file.split("/")) + "</span>"


def _cell(folder, images, row, prefix, name, caption, kind, file=""):
    if images is None:
        picture = f'<div class="noimage">{prefix}{row}</div>'
    else:
        path = f"{IMAGES}/{prefix}{row}.png"
        _write_image(os.path.join(folder, path), images[row])
        alt = html.escape(name + (f" ({file})" if file else ""), quote=True)
        picture = f'<img src="{path}" alt="{alt}">'
    tip = code_point(name)
    title = f' title="{html.escape(tip, quote=True)}"' if tip else ""
    return (
        f'<div class="item {kind}">{picture}<div class="name"{title}><bdi>{_breakable(name)}</bdi></div>'
        f"<div>{caption}</div></div>"
    )


def _write_image(path, image):
    """A PNG of one image: uint8 as is, floats scaled from their own range."""
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype != np.uint8:
        low, high = float(np.min(image)), float(np.max(image))
        scaled = (image - low) / (high - low) if high > low else np.zeros(image.shape)
        image = np.round(scaled * 255.0).astype(np.uint8)
    Image.fromarray(image).save(path)


def _write_grid(path, worst, images, query_images, class_names):
    """The worst queries as `plot_retrieval_grid`: the top neighbours, then the nearest correct item when it
    is not among them (its own rank above it)."""

    def drawable(label):
        return plots.drawable_name(class_name(label, class_names), int(label))

    rows, titles, ranks, flags, scores = [], [], [], [], []
    for query in worst.queries:
        items = list(zip(query.neighbours, query.scores, range(1, len(query.neighbours) + 1)))
        if query.first_correct_rank > len(query.neighbours):
            items.append((query.first_correct, query.first_correct_score, query.first_correct_rank))
        rows.append([images[j] for j, _, _ in items])
        labels = list(query.neighbour_labels) + [query.label] * (len(items) - len(query.neighbours))
        titles.append([drawable(label) for label in labels])  # alone on its line: any script reads right
        scores.append([f"{score:.2f}" for _, score, _ in items])
        ranks.append([rank for _, _, rank in items])
        flags.append([label == query.label for label in labels])
    width = max(len(row) for row in flags)
    return plots.plot_retrieval_grid(
        [query_images[query.query] for query in worst.queries],
        rows,
        np.array([row + [False] * (width - len(row)) for row in flags]),
        path,
        titles=titles,
        query_titles=[query_title(drawable(query.label)) for query in worst.queries],
        note=f"worst queries {_ORDER_TEXT[worst.by].split(' (')[0]}; scores: {worst.score_name}",
        ranks=ranks,
        scores=scores,
    )
