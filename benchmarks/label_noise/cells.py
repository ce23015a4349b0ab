"""The label-noise table's cells: mean +- standard error over seeds, in percent, and the row labels."""

import numpy as np


def mean_se(values):
    values = np.asarray(values, float)
    se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("nan")
    return float(values.mean()), float(se)


def cell(values):
    if not len(values):
        return "-"
    mean, se = mean_se(100 * np.asarray(values))
    return f"{mean:.1f} +- {se:.1f}" if len(values) > 1 else f"{mean:.1f}"


def _value(value):
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):  # e.g. validation_loss_params
        return "(" + ", ".join(f"{k} {_value(v)}" for k, v in sorted(value.items())) + ")"
    return str(value)


def row_label(method, options):
    if method == "base":
        return "base loss"
    text = ", ".join(f"{k} {_value(v)}" for k, v in sorted(options.items()))
    label = {"heuristic": "+ small-loss heuristic", "prism": "+ PRISM", "ala": "+ DML-ALA"}.get(method, method)
    return f"{label} ({text})" if text else label


def signed(values):
    if not len(values):
        return "-"
    mean, se = mean_se(100 * np.asarray(values))
    return f"{mean:+.1f} +- {se:.1f}" if len(values) > 1 else f"{mean:+.1f}"


def paired_versus(runs, other, metric="recall@1"):
    """`runs` minus `other` (records by seed) on their common seeds, paired: mean +- standard error in points,
    and on how many seeds `runs` is above ("-" without a common seed)."""
    seeds = sorted(set(runs) & set(other))
    if not seeds:
        return "-"
    differences = [runs[s][metric] - other[s][metric] for s in seeds]
    above = sum(d > 0 for d in differences)
    return f"{signed(differences)} ({above}/{len(seeds)} above)"
