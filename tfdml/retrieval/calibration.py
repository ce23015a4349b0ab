"""Match calibration: the cosine score above which a top-1 neighbour is the query's class, at a target precision,
for queries whose class is in the gallery and for queries whose class is not (open set).

A served search returns neighbours for any photo, also for one of a class the gallery does not hold; the
caller needs a yes/no "this is a match". `calibrate` fits that decision on held-out labelled embeddings (the
job's evaluation data), using every item twice: as a **present** query (leave-one-out: its top-1 score `s_i`
and whether that match is correct, `c_i`), and as an **absent** query (its whole class taken out of the
gallery: its top-1 score `a_i` is always a wrong match). A query is accepted when its top-1 score is `>= t`;
on a stream of which a share `pi = absent_share` (default 0.5) belongs to absent classes:

    precision(t) = (1 - pi) P_c(t) / ((1 - pi) P_s(t) + pi A(t))
    P_c(t) = mean_i c_i [s_i >= t],  P_s(t) = mean_i [s_i >= t],  A(t) = mean_i [a_i >= t]
    recall(t)    = sum_i c_i [s_i >= t] / sum_i c_i          (correct top-1 matches of present queries kept)

The closed-set mode (`mode="closed"`, or `absent_share=0`) is `pi = 0`: it says nothing about queries of absent
classes, which it matches as readily as present ones. `mode="auto"` (the default) is open set when the data
hold at least `MIN_OPEN_SET_CLASSES` classes. Leaving one class out keeps the gallery an absent query meets as
large as the served one, so its impostor scores are those a served absent query gets.

The threshold is the smallest observed score with `precision(t) >= target_precision` (the most matches at
that precision), or `+inf` with `reached` False when none reaches it. Items whose class has no other member
count as present queries whose match is wrong. A calibration that cannot be measured (fewer than
`MIN_CLASSES` classes or `MIN_QUERIES` items with a classmate) records no threshold: `measurable` is False,
`note` says why, and `match` is always false."""

import dataclasses
import math

import numpy as np

from tfdml.retrieval_options import CALIBRATION_MODES

DEFAULT_PRECISIONS = (0.5, 0.8, 0.9, 0.95, 0.99)
MODES = CALIBRATION_MODES
DEFAULT_ABSENT_SHARE = 0.5
MIN_CLASSES = 2
MIN_OPEN_SET_CLASSES = 4
MIN_QUERIES = 10
_QUERY_BLOCK = 1024


@dataclasses.dataclass
class Calibration:
    """The result of `calibrate`.

    Attributes:
      target_precision: the precision asked for.
      threshold: the score threshold (`match = score >= threshold`); `inf` when the target is not reached or
        the calibration cannot be measured.
      precision: at `threshold`, on the stream the mode describes (present queries only for closed set;
        a share `absent_share` of absent-class queries for open set). 0 when nothing is accepted.
      recall: at `threshold`, the share of the present queries' correct top-1 matches that are accepted.
      reached: whether some threshold reaches the target.
      scores, correct: per item as a present query, the top-1 score and whether that neighbour has its label.
      absent_scores: per item as an absent query (its class left out), the top-1 score (empty for closed set).
      curve_thresholds, curve_precision, curve_recall: the curve at each distinct score, descending.
      table: `[{"target_precision", "threshold", "precision", "recall", "present_precision",
        "absent_match_rate"}, ...]` for `DEFAULT_PRECISIONS` and the target (thresholds `None` where not
        reached), as written to `tfdml_metadata.json`.
      mode: `"open"` or `"closed"` (what `"auto"` chose).
      absent_share: the share of absent-class queries in the stream the precision is stated for (0 closed).
      present_precision: at `threshold`, the precision of the accepted present queries alone.
      absent_match_rate: at `threshold`, the share of absent queries that are (wrongly) matched.
      classes: number of classes in the calibration data.
      measurable: False when the data cannot measure a precision (`note` says why; no threshold).
      note: why the calibration is not measurable, else None.
    """

    target_precision: float
    threshold: float
    precision: float
    recall: float
    reached: bool
    scores: np.ndarray
    correct: np.ndarray
    curve_thresholds: np.ndarray
    curve_precision: np.ndarray
    curve_recall: np.ndarray
    table: list
    mode: str = "closed"
    absent_share: float = 0.0
    absent_scores: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))
    present_precision: float = 0.0
    absent_match_rate: float = 0.0
    classes: int = 0
    measurable: bool = True
    note: str | None = None

    @property
    def method(self):
        """How the threshold was fitted, in words."""
        if self.mode == "open":
            return (
                f"open set: leave-one-class-out top-1 cosine, precision on a stream of queries of which "
                f"{self.absent_share:.0%} are of classes absent from the gallery"
            )
        return "closed set: leave-one-out top-1 cosine, precision on queries whose class is in the gallery"

    def promise(self):
        """What `match` promises, in one sentence (the metadata's `search.match`, printed by `tfdml search`)."""
        if not self.measurable:
            return f"no threshold: the calibration cannot be measured ({self.note}); match is always false"
        if not self.reached:
            return (
                f"precision {self.target_precision:g} is not reached on the calibration data ({self.method}): "
                "match is always false"
            )
        stream = (
            f"on a stream of queries of which {self.absent_share:.0%} are of classes absent from the gallery, "
            f"{self.precision:.1%} of the top-1 matches are the query's class"
            if self.mode == "open"
            else f"of the top-1 matches of queries whose class is in the gallery, {self.precision:.1%} are the "
            "query's class (queries of absent classes are not controlled: closed-set calibration)"
        )
        absent = (
            f"; absent-class queries matched: {self.absent_match_rate:.1%}; present: precision "
            f"{self.present_precision:.3f}"
            if self.mode == "open"
            else ""
        )
        return (
            f"score >= {self.threshold:.6g}: {stream} (recall {self.recall:.3f} of correct top-1 matches{absent}; "
            f"measured on {len(self.scores)} items of {self.classes} classes)"
        )

    def to_dict(self):
        """JSON-compatible summary (no per-query arrays); `threshold` is `None` when not reached or not
        measurable."""
        return {
            "mode": self.mode,
            "method": self.method,
            "absent_share": self.absent_share,
            "measurable": self.measurable,
            "note": self.note,
            "target_precision": self.target_precision,
            "threshold": self.threshold if self.reached else None,
            "precision": self.precision,
            "recall": self.recall,
            "present": {
                "queries": int(len(self.scores)),
                "correct_top1": int(self.correct.sum()),
                "precision": self.present_precision,
                "recall": self.recall,
            },
            "absent": (
                {"queries": int(len(self.absent_scores)), "match_rate": self.absent_match_rate}
                if self.mode == "open"
                else None
            ),
            "classes": self.classes,
            "queries": int(len(self.scores)),
            "correct_top1": int(self.correct.sum()),
            "thresholds": self.table,
        }


def top1_neighbours(embeddings, labels, absent=False):
    """`(scores, correct, absent_scores)`: each row's best cosine similarity to another row, whether that row
    has the same label (leave-one-out), and, with `absent=True`, its best similarity to a row of another
    class (its class left out; `-inf` when there is none), else None. Blocks of queries keep memory at
    `1024 x N`."""
    x = np.asarray(embeddings, np.float32)
    labels = np.asarray(labels).reshape(-1)
    if x.ndim != 2 or len(x) != len(labels):
        raise ValueError(f"embeddings must be [N, D] with one label per row, got shapes {x.shape} and {labels.shape}.")
    if len(x) < 2:
        raise ValueError(f"calibration needs at least 2 labelled items, got {len(x)}.")
    if not np.isfinite(x).all():
        raise ValueError("embeddings contain NaN or Inf values.")
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    scores, best = np.empty(len(x), np.float32), np.empty(len(x), np.int64)
    others = np.empty(len(x), np.float32) if absent else None
    for start in range(0, len(x), _QUERY_BLOCK):
        block = x[start : start + _QUERY_BLOCK] @ x.T
        rows = np.arange(len(block))
        block[rows, start + rows] = -np.inf  # not itself
        best[start : start + len(block)] = np.argmax(block, axis=1)
        scores[start : start + len(block)] = block[rows, best[start : start + len(block)]]
        if absent:
            block[labels[start : start + len(block), None] == labels[None, :]] = -np.inf  # its class left out
            others[start : start + len(block)] = block.max(axis=1)
    return scores, labels[best] == labels, others


def _curve(scores, correct, absent_scores=None, absent_share=0.0):
    """`(thresholds, precision, recall, present precision, absent match rate)` at each distinct score,
    descending (see the module docstring for the weighting)."""
    if absent_scores is None or not len(absent_scores) or absent_share <= 0:
        absent_scores, absent_share = np.zeros(0, np.float32), 0.0
    values = np.concatenate([scores, absent_scores])
    hits = np.concatenate([correct.astype(np.int64), np.zeros(len(absent_scores), np.int64)])
    is_absent = np.r_[np.zeros(len(scores), bool), np.ones(len(absent_scores), bool)]
    order = np.argsort(-values, kind="stable")
    values, hits, is_absent = values[order], hits[order], is_absent[order]
    # A threshold at a score accepts every query with that score: the curve is read at each group's end; an
    # absent query with no other class to meet (-inf) is never matched.
    last = np.r_[values[1:] != values[:-1], True] & np.isfinite(values)
    # Counts, not float weights, so that a precision of exactly the target compares equal to it.
    true_positives = np.cumsum(hits)
    present_accepted = np.cumsum(~is_absent)
    absent_accepted = np.cumsum(is_absent)
    present_rate = present_accepted / len(scores)
    absent_rate = absent_accepted / max(len(absent_scores), 1)
    if absent_share:
        accepted = (1.0 - absent_share) * present_rate + absent_share * absent_rate
        precision = (1.0 - absent_share) * (true_positives / len(scores)) / np.maximum(accepted, 1e-300)
    else:
        precision = true_positives / np.maximum(present_accepted, 1)
    present_precision = true_positives / np.maximum(present_accepted, 1)
    recall = true_positives / max(float(correct.sum()), 1.0)
    return values[last], precision[last], recall[last], present_precision[last], absent_rate[last]


def _choose(curve, target):
    thresholds, precision, recall, present_precision, absent_rate = curve
    ok = np.flatnonzero(precision >= target)
    if not len(ok):
        return math.inf, 0.0, 0.0, 0.0, 0.0, False
    i = ok[-1]  # the smallest threshold (thresholds are descending) that keeps the target precision
    return (
        float(thresholds[i]),
        float(precision[i]),
        float(recall[i]),
        float(present_precision[i]),
        float(absent_rate[i]),
        True,
    )


def _unmeasurable(labels):
    """Why the labels cannot measure a precision, or None."""
    values, counts = np.unique(labels, return_counts=True)
    if len(values) < MIN_CLASSES:
        return f"{len(values)} class: no top-1 match can be wrong, so no precision can be measured"
    answerable = int(counts[counts > 1].sum())
    if answerable < MIN_QUERIES:
        return (
            f"only {answerable} items have another item of their class; at least {MIN_QUERIES} are needed "
            "to measure a precision"
        )
    return None


def _check_settings(target_precision, precisions, mode, absent_share):
    for value in (target_precision, *precisions):
        if not 0.0 < float(value) <= 1.0:
            raise ValueError(f"precision targets must be in (0, 1], got {value}.")
    if mode not in MODES:
        raise ValueError(f"calibration mode must be one of {', '.join(MODES)}, got {mode!r}.")
    if not 0.0 <= float(absent_share) < 1.0:
        raise ValueError(f"absent_share must be in [0, 1), got {absent_share}.")


def _table(curve, targets, mode):
    """One row per precision target (ascending): the threshold that reaches it (None where none does) and what
    it gives."""
    table = []
    for target in sorted({float(p) for p in targets}):
        t, p, r, pp, ar, ok = _choose(curve, target)
        table.append(
            {
                "target_precision": target,
                "threshold": t if ok else None,
                "precision": p,
                "recall": r,
                "present_precision": pp,
                "absent_match_rate": ar if mode == "open" else None,
            }
        )
    return table


def calibrate(
    embeddings,
    labels,
    target_precision=0.9,
    precisions=DEFAULT_PRECISIONS,
    mode="auto",
    absent_share=DEFAULT_ABSENT_SHARE,
):
    """Score threshold at which a top-1 match is correct with `target_precision` (see the module docstring).

    Args:
      embeddings: `[N, D]` held-out embeddings (normalised here: scores are cosine similarities, as the
        served `search` signature returns).
      labels: `[N]` class labels (any comparable values).
      target_precision: in `(0, 1]`.
      precisions: further targets listed in `table`.
      mode: `"open"` (leave-one-class-out: the precision holds on a stream in which a share `absent_share`
        of the queries are of classes absent from the gallery), `"closed"` (leave-one-out: queries whose
        class is in the gallery only) or `"auto"` (open set from `MIN_OPEN_SET_CLASSES` classes).
      absent_share: in `[0, 1)`, the share of absent-class queries the open-set precision is stated for.

    Returns a `Calibration`.

    Example:
      >>> cal = calibrate(eval_embeddings, eval_labels, target_precision=0.9)
      >>> cal.threshold, cal.recall, cal.absent_match_rate
    """
    _check_settings(target_precision, precisions, mode, absent_share)
    labels = np.asarray(labels).reshape(-1)
    classes = len(np.unique(labels))
    mode = ("open" if classes >= MIN_OPEN_SET_CLASSES else "closed") if mode == "auto" else mode
    share = float(absent_share) if mode == "open" else 0.0
    scores, correct, absent_scores = top1_neighbours(embeddings, labels, absent=mode == "open")
    absent_scores = np.zeros(0, np.float32) if absent_scores is None else absent_scores
    note = _unmeasurable(labels)
    curve = _curve(scores, correct, absent_scores, share)
    if note is None:
        chosen, table = _choose(curve, target_precision), _table(curve, (*precisions, target_precision), mode)
    else:
        chosen, table = (math.inf, 0.0, 0.0, 0.0, 0.0, False), []
    threshold, precision, recall, present_precision, absent_rate, reached = chosen
    return Calibration(
        float(target_precision),
        threshold,
        precision,
        recall,
        reached,
        scores,
        correct,
        *curve[:3],
        table,
        mode=mode,
        absent_share=share,
        absent_scores=absent_scores,
        present_precision=present_precision,
        absent_match_rate=absent_rate,
        classes=classes,
        measurable=note is None,
        note=note,
    )
