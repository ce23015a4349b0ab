"""DML-ALA against the small-loss heuristic, cell by cell: one line per data set, regime, base loss and noise rate
of the label-noise results files, written to `summary.md` (the top of the benchmark's page).

In each cell DML-ALA's setting is the one with the best validation MAP@R among every setting run on that cell's
validation split and on the test seeds (so the choice never looks at a test seed), and the heuristic is the one
the cell's table compares with (its validated rate). Figures: the share of the noise's R@1 cost each recovers, DML-ALA's
R@1 minus the heuristic's paired by seed, and the same DML-ALA setting on clean labels minus the plain loss.

    python -m benchmarks.label_noise.summary
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.glyph_methods import benchmark_methods as bm  # noqa: E402
from benchmarks.label_noise import cells as fmt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARY = os.path.join(HERE, "summary.md")
VERDICTS = os.path.join(HERE, "verdicts.md")
# (results file, what its cells are called, which test metrics): the protocols and their test sets. Fashion-MNIST's
# runs are scored twice: on the unseen classes (`recall@1`), where its noise costs little, and on new images of
# the training classes (`seen_recall@1`), where it costs what it does on glyphs.
SOURCES = (
    ("results_600.jsonl", "glyphs, from scratch, 600 steps", ""),
    ("results_pretrained.jsonl", "glyphs, warm start, 300 steps", ""),
    ("results_fashion.jsonl", "Fashion-MNIST, from scratch, 300 steps, unseen classes", ""),
    ("results_fashion.jsonl", "Fashion-MNIST, from scratch, 300 steps, new images of the training classes", "seen_"),
)
MIN_SEEDS = 5
# Options every DML-ALA row of the benchmark sets (None), or their library defaults: not named in a setting, and
# a line that writes a default out counts as the same setting as one that does not.
QUIET = {"trusted": None, "state": "per_step", "assessed": "positive_pairs", "weight_range": 1.0}


def read(path, test_metrics=""):
    """`{machine: {(phase, noise, base, method, options, seed): line}}` of the final and validation lines of
    `path`, the latest kept, the machines in the order they first appear (runs are paired within a machine only:
    `cells.machine_letters`); a final line's R@1 and MAP@R are its `test_metrics` ones (a validation line's are
    the split's, which choose). A file holds one protocol: `ValueError` if one base loss ran under two
    implementations or step counts."""

    def key(r):
        options = canonical(r["method"], r["options"])
        return r.get("machine", ""), r["phase"], r["noise"], r["base"], r["method"], options, r["seed"]

    machines, protocol = {}, {}
    for (machine, *cell), r in bm.latest_records(path, key, lambda r: r["phase"] in ("final", "validation")).items():
        ran = protocol.setdefault(r["base"], (r["base_method"], r["steps"]))
        if ran != (r["base_method"], r["steps"]):
            raise ValueError(f"{path}: {r['base']} ran as {ran} and as {(r['base_method'], r['steps'])}")
        if r["phase"] == "final" and test_metrics:
            r = dict(r, **{m: r[test_metrics + m] for m in ("recall@1", "map@r")})
        machines.setdefault(machine, {})[tuple(cell)] = r
    return machines


def canonical(method, options):
    """`options` as a key, without the DML-ALA switches that state the library default (`QUIET`): a line that
    writes `"state": "per_step"` out ran the same setting as one that leaves it to the default."""
    if method == "ala":
        options = {k: v for k, v in options.items() if not (k in QUIET and QUIET[k] is not None and v == QUIET[k])}
    return json.dumps(options, sort_keys=True)


def runs_of(records, phase, noise, base, method):
    """`{options: {seed: record}}` of one phase, noise, base loss and method."""
    found = {}
    for (p, n, b, m, options, seed), r in records.items():
        if (p, n, b, m) == (phase, noise, base, method):
            found.setdefault(options, {})[seed] = r
    return found


def chosen_ala(records, noise, base):
    """`(options, how many settings were validated)`: the DML-ALA setting run on the test seeds
    (at least `MIN_SEEDS`) with the best mean validation MAP@R at this noise, among those validated on the most
    seeds (a setting explored on fewer does not narrow the comparison to its seeds), over the validation seeds
    they all ran (each its own where they share none); None when no setting has both."""
    finals = {o: r for o, r in runs_of(records, "final", noise, base, "ala").items() if len(r) >= MIN_SEEDS}
    validated = {o: runs for o, runs in runs_of(records, "validation", noise, base, "ala").items() if o in finals}
    if not validated:
        return None
    most = max(len(runs) for runs in validated.values())
    validated = {o: runs for o, runs in validated.items() if len(runs) == most}
    common = set.intersection(*(set(runs) for runs in validated.values()))
    scored = {
        o: float(np.mean([r["map@r"] for s, r in runs.items() if s in common or not common]))
        for o, runs in validated.items()
    }
    best = max(scored, key=scored.get)
    return best, len(scored)


def heuristic_runs(records, noise, base):
    """The heuristic's final runs the cell's table compares with (`cells.validated_heuristic`)."""
    return fmt.validated_heuristic(runs_of(records, "final", noise, base, "heuristic").values())


def clean_runs(records, base, options):
    """DML-ALA's final runs on clean labels at `options`; failing those, at `options` without the verified set
    (`trusted`): on clean labels every label is true, so the verified set only draws from fewer images."""
    finals = runs_of(records, "final", 0.0, base, "ala")
    if len(finals.get(options, {})) >= MIN_SEEDS:
        return finals[options]
    untrusted = {k: v for k, v in json.loads(options).items() if k != "trusted"}
    return finals.get(canonical("ala", untrusted), {})


def setting_label(options):
    """A short name of a DML-ALA setting: the look-ahead, the heuristic's pairs, then what else it sets."""
    options = dict(options)
    words = ["head-only" if options.pop("lookahead_variables", "all") == "head" else "exact step"]
    if "heuristic" in options:
        words.append(f"on the heuristic's pairs ({options.pop('heuristic'):g})")
    if "distance_cut" in options:
        words.append(f"on the verified cut's pairs ({options.pop('distance_cut'):g})")
    if "validation_loss" in options:
        params = options.pop("validation_loss_params", {})
        margin = f" neg_margin {params['neg_margin']:g}" if "neg_margin" in params else ""
        words.append(f"validation loss {options.pop('validation_loss')}{margin}")
    for key, value in sorted(options.items()):
        if key not in QUIET or (QUIET[key] is not None and value != QUIET[key]):
            words.append(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}")
    return ", ".join(words)


def recovered(runs, noisy, clean):
    """The share of the noise's R@1 cost recovered on the seeds all three have ("-" where it has no meaning)."""
    value = fmt.recovered(runs, noisy, clean, sorted(set(runs) & set(noisy) & set(clean)))
    return "-" if value is None else f"{value[0]:.2f}"


def noisy_cells(records):
    """`(base, noise, clean base runs, noisy base runs, heuristic runs)` of every cell with a noisy base loss, a
    heuristic and a DML-ALA row, in the table's order."""
    bases = sorted({k[2] for k in records}, key=("contrastive", "margin", "triplet").index)
    for base in bases:
        clean = runs_of(records, "final", 0.0, base, "base").get("{}", {})
        for noise in sorted({k[1] for k in records if k[1] > 0 and k[2] == base}):
            noisy = runs_of(records, "final", noise, base, "base").get("{}", {})
            heuristic = heuristic_runs(records, noise, base)
            if noisy and heuristic and runs_of(records, "final", noise, base, "ala"):
                yield base, noise, clean, noisy, heuristic


def cell_lines(records, label):
    """The summary's lines of one results file."""
    lines = []
    for base, noise, clean, noisy, heuristic in noisy_cells(records):
        choice = chosen_ala(records, noise, base)
        if choice is None:
            gap = "no setting both validated and run on the test seeds"
            lines.append("| " + " | ".join([label, base, f"{noise:.0%}", gap, "-", "-", "-"]) + " |")
            continue
        options, candidates = choice
        ala = runs_of(records, "final", noise, base, "ala")[options]
        on_clean = clean_runs(records, base, options)
        cells = [
            label,
            base,
            f"{noise:.0%}",
            f"{setting_label(json.loads(options))} (of {candidates})",
            f"{recovered(ala, noisy, clean)} / {recovered(heuristic, noisy, clean)}",
            fmt.paired_versus(ala, heuristic),
            fmt.paired_versus(on_clean, clean) if len(on_clean) >= MIN_SEEDS else "not run",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def verified_defaults(options):
    """Whether `options` (a canonical key) is DML-ALA at the library's defaults with the verified set."""
    return set(json.loads(options)) == {"trusted"}


def cpu_ratio(runs, base_runs):
    """DML-ALA's training CPU seconds over the base loss's, means over their common seeds ("-" without one)."""
    seeds = sorted(set(runs) & set(base_runs))
    if not seeds or any("train_cpu_s" not in r[s] for r in (runs, base_runs) for s in seeds):
        return "-"
    ratio = np.mean([runs[s]["train_cpu_s"] for s in seeds]) / np.mean([base_runs[s]["train_cpu_s"] for s in seeds])
    return f"{ratio:.1f}x"


def defaults_lines(records, label):
    """The defaults table's lines of one results file: DML-ALA at the library's defaults with the verified set, no
    setting chosen, in every cell where it ran on the test seeds."""
    lines = []
    for base, noise, clean, noisy, heuristic in noisy_cells(records):
        found = {
            o: r
            for o, r in runs_of(records, "final", noise, base, "ala").items()
            if verified_defaults(o) and len(r) >= MIN_SEEDS
        }
        if not found:
            continue
        options, ala = next(iter(found.items()))
        on_clean = clean_runs(records, base, options)
        cells = [
            label,
            base,
            f"{noise:.0%}",
            f"{recovered(ala, noisy, clean)} / {recovered(heuristic, noisy, clean)}",
            fmt.paired_versus(ala, heuristic),
            fmt.paired_versus(on_clean, clean) if len(on_clean) >= MIN_SEEDS else "not run",
            cpu_ratio(ala, noisy),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(sources=SOURCES, here=HERE):
    lines = [
        "DML-ALA's setting in each cell: of the settings run on that cell's validation split and on the test "
        f"seeds ({MIN_SEEDS} or more) and validated on the most seeds, the one with the best validation MAP@R (how "
        "many there were in brackets); "
        "the heuristic at its validated drop rate. Recovered: the share of the noise's R@1 cost (clean base minus "
        "noisy base) each recovers. Minus the heuristic: DML-ALA's R@1 minus the heuristic's, paired by seed, "
        "mean +- standard error in points, and on how many seeds DML-ALA is above. Clean: the same DML-ALA "
        "setting on clean labels minus the plain loss, paired (with or without the verified set: on clean labels "
        "every label is true).",
        "",
        "| protocol | base loss | noise | DML-ALA setting (validated settings) | recovered, DML-ALA / heuristic "
        "| R@1 minus the heuristic | clean, R@1 minus the plain loss |",
        "|---|---|---|---|---|---|---|",
    ]
    defaults = [
        "",
        "DML-ALA at the library's defaults (the exact look-ahead step, DML-ALA alone) with the verified set, the "
        "setting a user gets without choosing one, where it ran on the test seeds; the columns as above, and its "
        "training CPU seconds over the plain loss's on the same machine.",
        "",
        "| protocol | base loss | noise | recovered, DML-ALA / heuristic | R@1 minus the heuristic "
        "| clean, R@1 minus the plain loss | CPU, DML-ALA / plain loss |",
        "|---|---|---|---|---|---|---|",
    ]
    files = [(read(os.path.join(here, name), metrics), label) for name, label, metrics in sources]
    letters = fmt.machine_letters({"machine": m} for machines, _ in files for m in machines)
    for machines, label in files:
        for machine, records in machines.items():
            lines += cell_lines(records, label + fmt.machine_tag(letters, machine))
            defaults += defaults_lines(records, label + fmt.machine_tag(letters, machine))
    lines[0] += fmt.machine_legend(letters)
    if len(defaults) > 6:
        lines += defaults
    return "\n".join(lines) + "\n"


# The verdicts' table: the protocols it reads (glyphs only: Fashion-MNIST ran the contrastive loss alone), each with
# the validation loss its head-only rows are scored by (`neg_margin` of a contrastive one; None: the base loss),
# and the remedies it compares, each a test on a DML-ALA row's options (None: the heuristic itself).
VERDICT_SOURCES = (
    ("results_pretrained.jsonl", "warm start, 300 steps", 1.4),
    ("results_600.jsonl", "from scratch, 600 steps", None),
)
REMEDIES = (
    ("the heuristic", None),
    ("DML-ALA on the verified cut's pairs", lambda o: "distance_cut" in o and "weighting" not in o),
    ("the verified cut alone", lambda o: "distance_cut" in o and o.get("weighting") == "uniform"),
    ("DML-ALA on the heuristic's pairs", lambda o: "heuristic" in o and "output_penalty" not in o),
    ("DML-ALA at the library's defaults", lambda o: set(o) == {"trusted"}),
)
NOISES = (0.4, 0.2)


def machine_of_record(machines):
    """The machine whose runs the verdicts read: the one of the file's latest lines (the order `read` keeps)."""
    return list(machines)[-1]


def scored_by(options, neg_margin):
    """Whether a DML-ALA row's look-ahead is the protocol's: the defaults' exact step, the cut alone, or the
    head-only step scored by the protocol's validation loss."""
    if set(options) == {"trusted"} or options.get("weighting") == "uniform":
        return True
    if options.get("lookahead_variables") != "head":
        return False
    if neg_margin is None:
        return "validation_loss" not in options
    return options.get("validation_loss_params", {}).get("neg_margin") == neg_margin


def remedy_runs(records, noise, base, test, neg_margin):
    """`(options, {seed: record})` of one remedy's final runs on the test seeds at `noise` (the heuristic at its
    validated rate when `test` is None); `(None, {})` when it did not run there."""
    if test is None:
        return None, heuristic_runs(records, noise, base)
    found = [
        (o, r)
        for o, r in runs_of(records, "final", noise, base, "ala").items()
        if test(json.loads(o)) and scored_by(json.loads(o), neg_margin) and len(r) >= MIN_SEEDS
    ]
    if len(found) > 1:
        raise ValueError(f"{base} at {noise:.0%}: several runs of one remedy: {[o for o, _ in found]}")
    return found[0] if found else (None, {})


def verdict_lines(records, label, neg_margin):
    """The verdicts' rows of one protocol: per base loss and remedy, R@1 minus the heuristic at each noise rate
    (the heuristic's row: minus the plain loss), the setting on clean labels minus the plain loss, and a run's CPU
    over the plain loss's at the heaviest noise it ran."""
    lines = []
    for base in ("contrastive", "triplet", "margin"):
        plain = {n: runs_of(records, "final", n, base, "base").get("{}", {}) for n in (0.0, *NOISES)}
        heuristic = {n: heuristic_runs(records, n, base) for n in NOISES}
        for name, test in REMEDIES:
            cells, cpu, options = [], "-", None
            for noise in NOISES:
                found, runs = remedy_runs(records, noise, base, test, neg_margin)
                if not runs or not heuristic[noise]:
                    cells.append("-")
                    continue
                options = options or found
                if test is None:
                    cells.append(fmt.paired_versus(runs, plain[noise]) + " over the plain loss")
                else:
                    cells.append(fmt.paired_versus(runs, heuristic[noise]))
                if cpu == "-":
                    cpu = cpu_ratio(runs, plain[noise])
            if all(c == "-" for c in cells):
                continue
            clean = clean_runs(records, base, options) if options else {}
            cells.append(fmt.paired_versus(clean, plain[0.0]) if len(clean) >= MIN_SEEDS else "-")
            lines.append("| " + " | ".join([label, base, name, *cells, cpu]) + " |")
    return lines


def verdicts(sources=VERDICT_SOURCES, here=HERE):
    """The one table the benchmark's page shows: the remedies per base loss, every row from one machine."""
    files = [read(os.path.join(here, name)) for name, _, _ in sources]
    machine = machine_of_record(files[0])
    lines = [
        "Glyphs; every row ran on one machine (" + (machine or "unrecorded") + "), five seeds, paired by seed: "
        "mean +- standard error in R@1 points, and on how many seeds the row is above. DML-ALA's rows have the "
        "verified set (3 true-labelled images of each of 30 training characters) and, but for the defaults' row "
        "(the exact look-ahead step), the head-only look-ahead, scored warm-started by a contrastive validation "
        "loss (`neg_margin` 1.4) and from scratch by the base loss; the heuristic is at its rate chosen on the "
        "validation split. Clean: the same setting on clean labels minus the plain loss. CPU: a whole run's "
        "training CPU seconds over the plain loss's at the same noise.",
        "",
        f"| protocol | base loss | remedy | {NOISES[0]:.0%} noise: R@1 minus the heuristic | {NOISES[1]:.0%} noise "
        "| clean labels: R@1 minus the plain loss | CPU, over the plain loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for machines, (_, label, neg_margin) in zip(files, sources):
        if machine in machines:
            lines += verdict_lines(machines[machine], label, neg_margin)
    return "\n".join(lines) + "\n"


def main(quiet=False):
    text = summary()
    with open(SUMMARY, "w") as f:
        f.write(text)
    with open(VERDICTS, "w") as f:
        f.write(verdicts())
    if not quiet:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
