"""Match calibration: the cosine score above which a top-1 neighbour is the query's class, at a target precision.

A served search returns neighbours for any photo, also for one of a class the gallery does not hold; the
caller needs a yes/no "this is a match". `calibrate` fits that decision on held-out labelled embeddings
(the job's evaluation data): each item queries all the others (leave-one-out), its top-1 neighbour by
cosine similarity gives a score `s_i` and whether the match is correct, `c_i = [label(top1) == label(i)]`.
For a threshold `t`, the accepted queries are those with `s_i >= t`:

    precision(t) = sum_i c_i [s_i >= t] / sum_i [s_i >= t]
    recall(t)    = sum_i c_i [s_i >= t] / sum_i c_i

The chosen threshold is the smallest observed score `t` with `precision(t) >= target_precision` (the most
matches at that precision); when no threshold reaches the target, it is `+inf` (nothing is a match) and
`reached` is False. Items whose class has no other member count as queries whose match is wrong, as a
photo of an unknown product would be.
"""

import dataclasses
import math

import numpy as np

DEFAULT_PRECISIONS = (0.5, 0.8, 0.9, 0.95, 0.99)
_QUERY_BLOCK = 1024


@dataclasses.dataclass
class Calibration:
    """The result of `calibrate`.

    Attributes:
      target_precision: the precision asked for.
      threshold: the score threshold (`match = score >= threshold`); `inf` when the target is not reached.
      precision, recall: at `threshold` on the fitted queries (0 when nothing is accepted).
      reached: whether some threshold reaches the target.
      scores, correct: per query, the top-1 score and whether that neighbour has the query's label.
      curve_thresholds, curve_precision, curve_recall: the curve at each distinct score, descending.
      table: `[{"target_precision", "threshold", "precision", "recall"}, ...]` for `DEFAULT_PRECISIONS` and
        the target (thresholds `None` where not reached), as written to `tfdml_metadata.json`.
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

    def to_dict(self):
        """JSON-compatible summary (no per-query arrays); `threshold` is `None` when not reached."""
        return {
            "target_precision": self.target_precision,
            "threshold": self.threshold if self.reached else None,
            "precision": self.precision,
            "recall": self.recall,
            "queries": int(len(self.scores)),
            "correct_top1": int(self.correct.sum()),
            "method": "leave-one-out top-1 cosine",
            "thresholds": self.table,
        }


def top1_neighbours(embeddings, labels):
    """`(scores, correct)`: each row's best cosine similarity to another row, and whether that row has the
    same label (leave-one-out; blocks of queries keep memory at `1024 x N`)."""
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
    for start in range(0, len(x), _QUERY_BLOCK):
        block = x[start : start + _QUERY_BLOCK] @ x.T
        rows = np.arange(len(block))
        block[rows, start + rows] = -np.inf  # not itself
        best[start : start + len(block)] = np.argmax(block, axis=1)
        scores[start : start + len(block)] = block[rows, best[start : start + len(block)]]
    return scores, labels[best] == labels


def _curve(scores, correct):
    order = np.argsort(-scores, kind="stable")
    sorted_scores, hits = scores[order], correct[order].astype(np.float64)
    true_positives = np.cumsum(hits)
    accepted = np.arange(1, len(scores) + 1)
    # A threshold at a score accepts every query with that score: the curve is read at each group's end.
    last = np.r_[sorted_scores[1:] != sorted_scores[:-1], True]
    total = max(hits.sum(), 1.0)
    return (sorted_scores[last], true_positives[last] / accepted[last], true_positives[last] / total)


def _choose(thresholds, precision, recall, target):
    ok = np.flatnonzero(precision >= target)
    if not len(ok):
        return math.inf, 0.0, 0.0, False
    i = ok[-1]  # the smallest threshold (thresholds are descending) that keeps the target precision
    return float(thresholds[i]), float(precision[i]), float(recall[i]), True


def calibrate(embeddings, labels, target_precision=0.9, precisions=DEFAULT_PRECISIONS):
    """Score threshold at which a top-1 match is correct with `target_precision` (see the module docstring).

    Args:
      embeddings: `[N, D]` held-out embeddings (normalised here: scores are cosine similarities, as the
        served `search` signature returns).
      labels: `[N]` class labels (any comparable values).
      target_precision: in `(0, 1]`.
      precisions: further targets listed in `table`.

    Returns a `Calibration`.

    Example:
      >>> cal = calibrate(eval_embeddings, eval_labels, target_precision=0.9)
      >>> cal.threshold, cal.recall
    """
    for value in (target_precision, *precisions):
        if not 0.0 < float(value) <= 1.0:
            raise ValueError(f"precision targets must be in (0, 1], got {value}.")
    scores, correct = top1_neighbours(embeddings, labels)
    thresholds, precision, recall = _curve(scores, correct)
    threshold, reached_precision, reached_recall, reached = _choose(thresholds, precision, recall, target_precision)
    table = []
    for target in sorted({float(p) for p in (*precisions, target_precision)}):
        t, p, r, ok = _choose(thresholds, precision, recall, target)
        table.append({"target_precision": target, "threshold": t if ok else None, "precision": p, "recall": r})
    return Calibration(
        float(target_precision),
        threshold,
        reached_precision,
        reached_recall,
        reached,
        scores,
        correct,
        thresholds,
        precision,
        recall,
        table,
    )
