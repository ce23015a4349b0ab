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


def validated_heuristic(rates):
    """The heuristic's runs a row is compared with, among those of each drop rate (`{seed: record}` each): the
    rate whose runs cover the most test seeds, its validated one (another rate runs on the validation split, or
    on a seed or two while exploring)."""
    return max(rates, key=len, default={})


def recovered(runs, noisy, clean, seeds, metric="recall@1"):
    """`(fraction, standard error)` of the noise's cost that `runs` recover on `seeds` (records by seed): the mean
    gain over the noisy base loss over the mean cost (clean minus noisy base); None without a seed or where the
    noise costs nothing."""
    cost = [clean[s][metric] - noisy[s][metric] for s in seeds]
    if not cost or np.mean(cost) <= 0:
        return None
    mean, se = mean_se([runs[s][metric] - noisy[s][metric] for s in seeds])
    return mean / np.mean(cost), se / np.mean(cost)


def recovered_cell(runs, noisy, clean, seeds, metric="recall@1"):
    value = recovered(runs, noisy, clean, seeds, metric)
    return "-" if value is None else f"{value[0]:.2f} +- {value[1]:.2f} (n={len(seeds)})"


def paired_versus(runs, other, metric="recall@1"):
    """`runs` minus `other` (records by seed) on their common seeds, paired: mean +- standard error in points,
    and on how many seeds `runs` is above ("-" without a common seed)."""
    seeds = sorted(set(runs) & set(other))
    if not seeds:
        return "-"
    differences = [runs[s][metric] - other[s][metric] for s in seeds]
    above = sum(d > 0 for d in differences)
    return f"{signed(differences)} ({above}/{len(seeds)} above)"


def machine_letters(records):
    """`{machine: letter}` over `records` (an iterable of result lines), in the order the machines first appear.
    Runs repeat exactly on one machine but not across machines, so rows and pairs are kept per machine; a line
    that does not record its machine (the earlier runs) counts as one machine, ""."""
    letters = {}
    for record in records:
        letters.setdefault(record.get("machine", ""), chr(ord("A") + len(letters)))
    return letters


def machine_legend(letters):
    """The sentence naming each machine's letter, after a space ("" when there is one machine)."""
    if len(letters) < 2:
        return ""
    earlier = "the earlier runs, which do not record it"
    names = [f"{letter}: {machine or earlier}" for machine, letter in letters.items()]
    return " Machines (rows and pairs are per machine): " + "; ".join(names) + "."


def machine_tag(letters, machine):
    """A row label's suffix naming its machine when there are several."""
    return f" [{letters[machine]}]" if len(letters) > 1 else ""
