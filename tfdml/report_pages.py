"""HTML pages of a report, readable offline: the worst queries (`write_worst_queries_page`).

The page is plain HTML with its images as PNG files in a folder beside it (no script, no network), so the
report folder can be copied, zipped or opened from disk. Class names are written as text (UTF-8, HTML-escaped,
isolated for right-to-left scripts), so the browser draws them in any script its fonts cover; the PNG grid
beside the page draws them with matplotlib's fonts (`tfdml.plots.drawable_name`).
"""

import html
import os

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
.query { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 6px; margin: 0 0 14px;
  padding-bottom: 10px; border-bottom: 1px solid #ddd; }
.item { width: 104px; font-size: 12px; text-align: center; overflow-wrap: anywhere; }
.item img { width: 96px; height: 96px; image-rendering: pixelated; border: 4px solid #999; display: block;
  margin: 0 auto 2px; background: #fff; object-fit: contain; }
.item.the-query img { border-color: #222; }
.item.same img { border-color: #2ca02c; }
.item.other img { border-color: #d62728; }
.item .name { font-size: 15px; font-weight: bold; }
.gap { align-self: center; font-size: 22px; color: #888; padding: 0 4px; }
.noimage { width: 96px; height: 96px; border: 4px solid #999; display: flex; align-items: center;
  justify-content: center; margin: 0 auto 2px; color: #777; }
"""


def write_worst_queries_page(
    folder, worst, images=None, query_images=None, class_names=None, title="Worst queries", grid=True
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
    """
    os.makedirs(folder, exist_ok=True)
    query_images = images if query_images is None else query_images
    if images is not None:
        os.makedirs(os.path.join(folder, IMAGES), exist_ok=True)
    html_rows = [_query_html(folder, query, images, query_images, class_names) for query in worst.queries]
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


def _query_html(folder, query, images, query_images, class_names):
    """One query's row: the query, its neighbours, then its nearest correct item."""
    name = class_name(query.label, class_names)
    caption = f"query {query.query}<br>AP {query.average_precision:.2f}, nearest correct #{query.first_correct_rank}"
    cells = [_cell(folder, query_images, query.query, "q", name, caption, "the-query")]
    for rank, (j, label, score) in enumerate(zip(query.neighbours, query.neighbour_labels, query.scores), 1):
        kind = "same" if label == query.label else "other"
        caption = f"#{rank}<br>{score:.3f}"
        cells.append(_cell(folder, images, j, "g", class_name(label, class_names), caption, kind))
    if query.first_correct_rank > len(query.neighbours):
        cells.append('<div class="gap">&hellip;</div>')
        cells.append(
            _cell(
                folder,
                images,
                query.first_correct,
                "g",
                name,
                f"#{query.first_correct_rank}<br>{query.first_correct_score:.3f}<br>nearest correct",
                "same",
            )
        )
    return f'<div class="query" id="query-{query.query}">' + "".join(cells) + "</div>"


def _cell(folder, images, row, prefix, name, caption, kind):
    if images is None:
        picture = f'<div class="noimage">{prefix}{row}</div>'
    else:
        file = f"{IMAGES}/{prefix}{row}.png"
        _write_image(os.path.join(folder, file), images[row])
        picture = f'<img src="{file}" alt="{html.escape(name, quote=True)}">'
    return (
        f'<div class="item {kind}">{picture}<div class="name"><bdi>{html.escape(name)}</bdi></div>'
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

    rows, titles, ranks, flags = [], [], [], []
    for query in worst.queries:
        items = list(zip(query.neighbours, query.scores, range(1, len(query.neighbours) + 1)))
        if query.first_correct_rank > len(query.neighbours):
            items.append((query.first_correct, query.first_correct_score, query.first_correct_rank))
        rows.append([images[j] for j, _, _ in items])
        labels = list(query.neighbour_labels) + [query.label] * (len(items) - len(query.neighbours))
        titles.append([f"{drawable(label)} {score:.2f}" for (_, score, _), label in zip(items, labels)])
        ranks.append([rank for _, _, rank in items])
        flags.append([label == query.label for label in labels])
    width = max(len(row) for row in flags)
    return plots.plot_retrieval_grid(
        [query_images[query.query] for query in worst.queries],
        rows,
        np.array([row + [False] * (width - len(row)) for row in flags]),
        path,
        titles=titles,
        query_titles=[f"class {drawable(query.label)}" for query in worst.queries],
        note=f"worst queries {_ORDER_TEXT[worst.by].split(' (')[0]}; scores: {worst.score_name}",
        ranks=ranks,
    )
