"""PNG figures for reports: Recall@K curves, retrieval grids, training curves and the match calibration
(matplotlib, Agg backend).

Each function writes one PNG to `path`, closes its figure and returns `path`.
"""

import functools
import math
import os
import re

import numpy as np

_RECALL_KEY = re.compile(r"^recall@(\d+)$")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only: works without a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path, bbox_inches="tight"):
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches=bbox_inches)
    _pyplot().close(fig)
    return path


@functools.cache
def _font_charmaps():
    """`[(family, set of code points)]`: matplotlib's default font first, then every other font installed."""
    _pyplot()
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    default = font_manager.findfont(font_manager.FontProperties())
    paths = [default] + sorted({entry.fname for entry in font_manager.fontManager.ttflist} - {default})
    fonts = []
    for path in paths:
        try:
            font = FT2Font(path)
        except (OSError, RuntimeError):  # a font file FreeType cannot read
            continue
        if not font.family_name.startswith("Last Resort"):  # maps every code point to a "missing" box
            fonts.append((font.family_name, frozenset(font.get_charmap())))
    return fonts


def font_families(texts):
    """The font families that draw every character of `texts` (matplotlib falls back along the list, glyph by
    glyph), or None when some character has no installed font (matplotlib would draw an empty box and warn
    "Glyph ... missing from font(s)")."""
    fonts = _font_charmaps()
    needed = {ord(c) for text in texts for c in text if not c.isspace()}
    families, missing = [fonts[0][0]], needed - fonts[0][1]
    for family, charmap in fonts[1:]:
        if not missing:
            break
        if missing & charmap:
            families.append(family)
            missing -= charmap
    return None if missing else families


def drawable_name(name, index):
    """A class name for a figure: `name` when the installed fonts draw it, else `[index]` (CJK names on a
    machine without a CJK font, say): `#n` is already the rank in a grid."""
    return name if font_families([name]) is not None else f"[{index}]"


def _recall_points(results):
    points = sorted((int(m.group(1)), float(v)) for key, v in results.items() if (m := _RECALL_KEY.match(key)))
    if not points:
        raise ValueError(f"no 'recall@K' entries in the results (keys: {sorted(results)}).")
    return points


_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _fitted_range(values, floor=0.0, ceiling=1.0):
    """A y range around `values` with room for the labels, kept inside `[floor, ceiling]`."""
    low, high = min(values), max(values)
    margin = max(0.08 * (high - low), 0.004)
    return max(floor, low - 2 * margin), min(ceiling + 1.5 * margin, high + 2.5 * margin)


def plot_recall_curve(results, path, title="Recall@K"):
    """Recall@K against K (log2 axis, one marker style per run, values written at the points, the y axis
    fitted to the data so that close runs stay apart) from `evaluate` results (fractions).

    Args:
      results: one `evaluate` dict, or `{run_name: evaluate_dict}` to compare runs on one plot.
      path: output PNG path.
    """
    plt = _pyplot()
    runs = results if results and all(isinstance(v, dict) for v in results.values()) else {"": results}
    points = {label: _recall_points(run) for label, run in runs.items()}
    fig, ax = plt.subplots(figsize=(6, 4.2))
    everything = [v for run in points.values() for _, v in run]
    low, high = _fitted_range(everything)
    offset = (high - low) * 0.035
    for n, (label, run) in enumerate(points.items()):
        ks, values = zip(*run)
        (line,) = ax.plot(
            ks, values, marker=_MARKERS[n % len(_MARKERS)], markersize=6, linewidth=1.8, label=label or None
        )
        if len(points) <= 2:  # values at the points: the higher run's above, the lower run's below
            for k, v in zip(ks, values):
                others = [x for m, r in enumerate(points.values()) if m != n for kk, x in r if kk == k]
                above = all(v > x or (v == x and n == 0) for x in others)
                ax.annotate(
                    f"{v:.3f}",
                    (k, v),
                    textcoords="offset points",
                    xytext=(0, 7 if above else -13),
                    ha="center",
                    fontsize=7.5,
                    color=line.get_color(),
                )
    ax.set_xscale("log", base=2)
    all_ks = sorted({k for run in points.values() for k, _ in run})
    ax.set_xticks(all_ks)
    ax.set_xticklabels([str(k) for k in all_ks])
    ax.minorticks_off()
    ax.set_xlim(all_ks[0] / 1.25, all_ks[-1] * 1.25)
    ax.set_ylim(low - offset, high)
    ax.set_xlabel("K (log scale)")
    ax.set_ylabel("Recall@K")
    ax.grid(True, alpha=0.3)
    extras = []
    for label, run in runs.items():
        found = [f"{key} {float(run[key]):.3f}" for key in ("map@r", "r_precision", "nmi", "f1") if key in run]
        if found:
            extras.append((f"{label}: " if label else "") + ", ".join(found))
    ax.set_title(title + "".join(f"\n{line}" for line in extras), fontsize=9)
    if len(runs) > 1:
        ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def _as_image(image):
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype != np.uint8:
        low, high = float(np.min(image)), float(np.max(image))
        image = (image - low) / (high - low) if high > low else np.zeros_like(image, np.float32)
    return image


def _drawable_titles(titles, query_titles):
    """`(titles, query_titles, font families, whether a word was replaced)`: words that no installed font
    draws become "?"."""
    texts = [text for row in titles or [] for text in row] + list(query_titles or [])
    families = font_families(texts)
    if families is not None:
        return titles, query_titles, families, False

    def drawable(text):
        return " ".join(word if font_families([word]) is not None else "?" for word in text.split(" "))

    if titles is not None:
        titles = [[drawable(text) for text in row] for row in titles]
    if query_titles is not None:
        query_titles = [drawable(text) for text in query_titles]
    texts = [text for row in titles or [] for text in row] + list(query_titles or [])
    return titles, query_titles, font_families(texts), True


_CELL_INCHES = 1.35  # width of one grid cell (image, frame and gap)
_BOX = 96  # pixels of a cell's framed image in the composed picture
_GAP = 10  # white pixels between cells
_FRAME_COLOURS = {None: "grey", True: "tab:green", False: "tab:red"}


def plot_retrieval_grid(
    query_images,
    neighbour_images,
    same_class_flags,
    path,
    titles=None,
    query_titles=None,
    note=None,
    ranks=None,
    scores=None,
):
    """One row per query: the query, then its neighbours framed green (same class) or red (other class).

    Args:
      query_images: `Q` images (`[H, W, 3]` or `[H, W]`, uint8 or float; sizes may differ).
      neighbour_images: `Q` lists of `k` images, nearest first.
      same_class_flags: `[Q, k]` booleans, or `None` when labels are unknown (grey frames).
      titles: optional `[Q, k]` strings under the rank of each neighbour (e.g. its class and score).
      query_titles: optional `Q` strings under "query" (e.g. the file name or class).
      note: optional line under the figure's title (e.g. how undrawable class names are shown).
      ranks: optional `[Q, k]` ranks shown as `#rank` (default 1..k: the neighbours are the top k).
      scores: optional `[Q, k]` strings shown on the rank's line (`#rank  score`), so that a title (a class
        name, in any script) has a line of its own: a right-to-left name beside a number on one line would
        read in the wrong order once the line is laid out right to left.

    The grid is one picture (each image scaled into its cell, its frame drawn into the pixels) with each
    cell's title above it: one axes however many cells, so that a large grid draws fast. Titles are drawn
    with the installed fonts that cover their characters (DejaVu Sans covers Latin, Greek and Cyrillic; a
    CJK name needs a CJK font). A word no installed font can draw is shown as "?" (callers pass class names
    through `drawable_name`, which shows such a name as `[index]`).
    """
    plt = _pyplot()
    titles, query_titles, families, undrawable = _drawable_titles(titles, query_titles)
    if undrawable:
        note = (note + "; " if note else "") + 'names no installed font can draw are shown as "?"'
    num_queries = len(query_images)
    if num_queries == 0 or len(neighbour_images) != num_queries:
        raise ValueError(
            f"need one neighbour list per query, got {num_queries} queries and {len(neighbour_images)} lists."
        )
    k = max(len(row) for row in neighbour_images)
    lines = 1 + (titles is not None or query_titles is not None)
    cell = _BOX + _GAP
    band = round(cell * (0.16 * lines + 0.04) / _CELL_INCHES)  # the title lines above each image, in pixels
    canvas = np.full((num_queries * (band + cell), (k + 1) * cell, 3), 255, np.uint8)
    height = _CELL_INCHES * num_queries * (band + cell) / cell
    legend = (
        "green frame = same class, red = other class"
        if same_class_flags is not None
        else "grey frames: classes unknown"
    )
    suptitle = f"Nearest neighbours ({legend})" + (f"\n{note}" if note else "")
    top = 0.15 + 0.16 * (suptitle.count("\n") + 1)  # inches above the grid for the figure's title
    fig = plt.figure(figsize=(_CELL_INCHES * (k + 1), height + top))
    ax = fig.add_axes((0.0, 0.0, 1.0, height / (height + top)))
    ax.set_axis_off()
    for q in range(num_queries):
        cells = [(query_images[q], "black", "query" + (f"\n{query_titles[q]}" if query_titles is not None else ""))]
        row_ranks = range(1, k + 1) if ranks is None else ranks[q]
        for j, image in enumerate(neighbour_images[q]):
            flag = None if same_class_flags is None else bool(same_class_flags[q][j])
            label = f"#{row_ranks[j]}" + (f"  {scores[q][j]}" if scores is not None else "")
            label += f"\n{titles[q][j]}" if titles is not None else ""
            cells.append((image, _FRAME_COLOURS[flag], label))
        for column, (image, colour, label) in enumerate(cells):
            _draw_cell(
                ax, canvas, (q * (band + cell) + band, column * cell + _GAP // 2), image, colour, label, families
            )
    ax.imshow(canvas, interpolation="nearest")
    fig.suptitle(suptitle, fontsize=9, y=1.0 - 0.05 / (height + top), va="top")
    return _save(fig, path, bbox_inches=None)  # the layout is already tight: no second drawing to measure it


def _draw_cell(ax, canvas, corner, image, colour, label, families):
    """One cell of the retrieval grid: `image` framed in `colour` at `corner` (top, left) of `canvas`, and
    `label` above it (the query's, column 0 in a black frame, in bold)."""
    top, left = corner
    query = colour == "black"
    _frame_into(canvas[top : top + _BOX, left : left + _BOX], image, colour, 3 if query else 5)
    ax.text(
        left + _BOX / 2,
        top - 2,
        label,
        ha="center",
        va="bottom",
        fontsize=7.5,
        fontweight="bold" if query else "normal",
        color=colour if colour in ("tab:green", "tab:red") else "black",
        fontfamily=families,
        gid="query" if query else "neighbour",
    )


def _frame_into(box, image, colour, width):
    """`image` scaled to fit inside `box` (`[B, B, 3]` uint8, nearest pixel) and centred there, within a
    frame of `width` pixels in `colour`; grey levels are stretched to black-white as `imshow` shows them."""
    from matplotlib.colors import to_rgb

    box[:] = np.round(np.multiply(to_rgb(colour), 255))
    inner = box[width:-width, width:-width]
    inner[:] = 255
    pixels = _as_image(image)
    if pixels.ndim == 2:
        low, high = float(np.min(pixels)), float(np.max(pixels))
        grey = (pixels - low) / (high - low) if high > low else np.zeros(pixels.shape)
        pixels = np.repeat(np.round(grey[..., None] * 255), 3, axis=-1)
    elif pixels.dtype != np.uint8:
        pixels = np.round(pixels * 255)
    size, (rows, columns) = inner.shape[0], pixels.shape[:2]
    scale = size / max(rows, columns)
    picked_rows = np.minimum((np.arange(max(1, round(rows * scale))) / scale).astype(int), rows - 1)
    picked_columns = np.minimum((np.arange(max(1, round(columns * scale))) / scale).astype(int), columns - 1)
    top, left = (size - len(picked_rows)) // 2, (size - len(picked_columns)) // 2
    inner[top : top + len(picked_rows), left : left + len(picked_columns)] = pixels[picked_rows][:, picked_columns, :3]


def plot_match_calibration(calibration, path, title=None):
    """The precision / recall curve of a `tfdml.retrieval.Calibration`: left, precision and recall of the
    top-1 match against the score threshold; right, precision against recall. The chosen threshold (the
    served `match` decision) is marked on both."""
    plt = _pyplot()
    if title is None:
        title = f"Match calibration ({getattr(calibration, 'mode', 'closed')} set, top-1)"
    thresholds = np.asarray(calibration.curve_thresholds, np.float64)
    precision = np.asarray(calibration.curve_precision, np.float64)
    recall = np.asarray(calibration.curve_recall, np.float64)
    if not len(thresholds):
        raise ValueError("the calibration has an empty curve: nothing to plot.")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(thresholds, precision, label="precision", color="tab:blue")
    left.plot(thresholds, recall, label="recall", color="tab:orange")
    left.axhline(calibration.target_precision, color="tab:blue", linestyle=":", linewidth=1)
    right.plot(recall, precision, color="tab:blue")
    if calibration.reached:
        chosen = (
            f"threshold {calibration.threshold:.3f}: precision {calibration.precision:.3f}, "
            f"recall {calibration.recall:.3f}"
        )
        left.axvline(calibration.threshold, color="tab:red", linestyle="--", linewidth=1.2, label=chosen)
        right.plot([calibration.recall], [calibration.precision], "o", color="tab:red", label=chosen)
    else:
        if not getattr(calibration, "measurable", True):
            chosen = f"not measurable ({calibration.note}): nothing is a match"
        else:
            chosen = f"precision {calibration.target_precision:g} not reached: nothing is a match"
        right.plot([], [], " ", label=chosen)  # the legend says why no threshold is marked
    left.set_xlabel("score threshold (cosine)")
    left.set_ylabel("fraction of top-1 matches")
    left.set_ylim(-0.02, 1.02)
    left.legend(fontsize=8, loc="lower left")
    right.set_xlabel("recall")
    right.set_ylabel("precision")
    right.set_xlim(-0.02, 1.02)
    right.set_ylim(-0.02, 1.02)
    right.legend(fontsize=8, loc="lower left")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    correct = int(np.sum(calibration.correct))
    fig.suptitle(
        f"{title}: target precision {calibration.target_precision:g}, {len(calibration.scores)} "
        f"queries, {correct} correct top-1",
        fontsize=10,
    )
    fig.tight_layout()
    return _save(fig, path)


def plot_training_curves(history, path, title="Training"):
    """Loss and metric curves per epoch from a Keras `History` (or its `.history` dict of lists).

    Each metric gets one panel; `val_<name>` is drawn in the same panel as `<name>`. A per-level loss equal
    to `loss` at every epoch (a history in which a model logged the loss of its only level beside `loss`) is
    named in the `loss` panel's title instead of getting an identical panel of its own.
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    history = getattr(history, "history", history)
    if not history:
        raise ValueError("history is empty: nothing to plot.")
    names = [key for key in history if not key.startswith("val_")]
    names += [key[4:] for key in history if key.startswith("val_") and key[4:] not in names]
    same_as_loss = [
        key
        for key in names
        if key.startswith("loss_")
        and "loss" in history
        and _same_series(history[key], history["loss"])
        and _same_series(history.get(f"val_{key}"), history.get("val_loss"))
    ]
    names = [key for key in names if key not in same_as_loss]
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    for ax, key in zip(axes.flat, names):
        for series, style in ((key, "-"), (f"val_{key}", "--")):
            if series in history:
                values = np.asarray(history[series], np.float64)
                ax.plot(np.arange(1, len(values) + 1), values, style, marker=".", label=series)
        ax.set_title(" = ".join([key] + same_as_loss) if key == "loss" else key, fontsize=10)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def _same_series(a, b):
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-6, atol=0.0)


def plot_ala_weights(history, path, title="DML-ALA assessed weights", weights=None, hardness=None, groups=None):
    """The panels of DML-ALA's Fig. 4 over training from `ALAModel` logs, and/or the weight of each tuple
    against its hardness.

    Args:
      history: a Keras `History`, its `.history` dict, or a list of per-step log dicts, with the keys
        `weight_variance`, `weight_mean` and (triplet-type tuples) `hardness`, `weighted_hardness`; None
        to draw only the scatter of `weights` against `hardness`.
      path: output PNG path.
      weights, hardness: per-tuple weights (e.g. from `ALAModel.tuple_weights`) and hardness of the same
        tuples (`d(a,p) / d(a,n)`), `[T]`
        each: adds a panel with one point per tuple.
      groups: optional `[T]` labels of the tuples (e.g. "clean" / "corrupted"), one colour each.

    Panels: (a) variance and (b) mean of the weights; (c) average weighted hardness `(1/n) sum_i w_i
    d(a,p)/d(a,n)` of the assessed weights and of uniform weights 1; (d) their ratio, divided by the mean
    weight (> 1: the assessor weights harder tuples more than uniform weights of the same mean); (e) weight
    against hardness per tuple.
    """
    logs = _ala_logs(history)
    scatter = weights is not None or hardness is not None
    if scatter:
        weights, hardness = _ala_scatter_inputs(weights, hardness, groups)
    elif logs is None:
        raise ValueError("plot_ala_weights: nothing to draw; pass ALAModel logs and/or weights and hardness.")
    plt = _pyplot()
    has_hardness = logs is not None and "hardness" in logs and "weighted_hardness" in logs
    panels = (0 if logs is None else 4 if has_hardness else 2) + scatter
    fig, axes = plt.subplots(1, panels, figsize=(3.5 * panels, 3.2), squeeze=False)
    axes = list(axes[0])
    if logs is not None:
        _draw_ala_curves(axes[: panels - scatter], logs, has_hardness)
    if scatter:
        _draw_ala_scatter(axes[-1], weights, hardness, groups, f"({'abcde'[panels - 1]}) weight vs hardness")
    fig.suptitle(title, y=1.04)
    return _save(fig, path)


def _ala_logs(history):
    """The per-step logs of `plot_ala_weights`' `history` as a dict of lists, checked; None for None."""
    if history is None:
        return None
    logs = getattr(history, "history", history)
    if isinstance(logs, (list, tuple)):
        logs = {key: [float(step[key]) for step in logs] for key in (logs[0] if logs else {})}
    for key in ("weight_variance", "weight_mean"):
        if key not in logs:
            raise ValueError(f"plot_ala_weights needs ALAModel logs with {key!r}; got keys {sorted(logs)}.")
    return logs


def _ala_scatter_inputs(weights, hardness, groups):
    if weights is None or hardness is None:
        raise ValueError("plot_ala_weights: pass both weights and hardness (one value per tuple).")
    weights, hardness = np.asarray(weights, float).ravel(), np.asarray(hardness, float).ravel()
    if weights.shape != hardness.shape or (groups is not None and np.asarray(groups).shape != weights.shape):
        raise ValueError(
            f"plot_ala_weights: weights {weights.shape}, hardness {hardness.shape} and groups "
            f"{None if groups is None else np.asarray(groups).shape} must have one value per tuple."
        )
    return weights, hardness


def _draw_ala_curves(axes, logs, has_hardness):
    """Panels (a)-(b), and (c)-(d) with hardness logs, of DML-ALA's Fig. 4 over the logged steps."""
    steps = np.arange(1, len(logs["weight_mean"]) + 1)
    axes[0].plot(steps, logs["weight_variance"])
    axes[0].set_title("(a) weight variance")
    axes[1].plot(steps, logs["weight_mean"])
    axes[1].set_title("(b) weight mean")
    if has_hardness:
        axes[2].plot(steps, logs["weighted_hardness"], label="ALA weights")
        axes[2].plot(steps, logs["hardness"], label="uniform weights 1")
        axes[2].set_title("(c) average weighted hardness")
        axes[2].legend(fontsize=8)
        ratio = np.asarray(logs["weighted_hardness"]) / np.maximum(
            np.asarray(logs["hardness"]) * np.asarray(logs["weight_mean"]), 1e-12
        )
        axes[3].plot(steps, ratio)
        axes[3].axhline(1.0, color="gray", linewidth=0.8)
        axes[3].set_title("(d) AWH ratio / mean weight")
    for ax in axes:
        ax.set_xlabel("logged step (epoch)")


def _draw_ala_scatter(ax, weights, hardness, groups, title):
    if groups is None:
        ax.scatter(hardness, weights, s=6, alpha=0.5)
    else:
        groups = np.asarray(groups)
        for group in np.unique(groups):
            keep = groups == group
            ax.scatter(hardness[keep], weights[keep], s=6, alpha=0.5, label=f"{group} ({keep.sum()})")
        ax.legend(fontsize=8)
    ax.set_xlabel("hardness d(a,p) / d(a,n)")
    ax.set_ylabel("weight")
    ax.set_title(title)
