"""The label-noise table's paired comparison cell (benchmarks/label_noise/cells.py) and the cell-by-cell summary
(summary.py): against NumPy, and the summary's choice made on the validation split, never on the test seeds."""

import json

import numpy as np
import pytest

from benchmarks.label_noise.cells import paired_versus


def records(values):
    return {seed: {"recall@1": value} for seed, value in values.items()}


def test_paired_versus_is_the_mean_and_standard_error_of_the_differences_on_common_seeds():
    row = records({0: 0.80, 1: 0.75, 2: 0.70, 3: 0.90})
    other = records({0: 0.78, 1: 0.76, 2: 0.65, 4: 0.50})  # seed 3 and 4 have no pair
    differences = 100 * np.array([0.80 - 0.78, 0.75 - 0.76, 0.70 - 0.65])
    se = differences.std(ddof=1) / np.sqrt(3)
    assert paired_versus(row, other) == f"{differences.mean():+.1f} +- {se:.1f} (2/3 above)"


def test_paired_versus_without_a_common_seed_is_a_dash():
    assert paired_versus(records({0: 0.8}), records({1: 0.7})) == "-"
    assert paired_versus(records({0: 0.8}), {}) == "-"


def _line(phase, noise, method, options, seed, recall, map_r=0.3, base="margin"):
    record = {"phase": phase, "noise": noise, "base": base, "base_method": "margin_dw", "method": method}
    return {**record, "options": options, "seed": seed, "steps": 300, "recall@1": recall, "map@r": map_r}


def test_summary_chooses_dml_ala_on_the_validation_split_and_pairs_it_with_the_heuristic(tmp_path):
    from benchmarks.label_noise import summary

    seeds = range(5)
    better_on_test, better_on_validation = {"heuristic": 0.25}, {"lookahead_variables": "head", "trusted": [30, 3]}
    lines = [_line("final", 0.0, "base", {}, s, 0.80) for s in seeds]
    # on clean labels the same setting without the verified set (every label is true) counts as the same
    lines += [_line("final", 0.0, "ala", {"lookahead_variables": "head"}, s, 0.79 - 0.01 * s) for s in seeds]
    lines += [_line("final", 0.4, "base", {}, s, 0.60) for s in seeds]
    lines += [_line("final", 0.4, "heuristic", {"drop_rate": 0.5}, s, 0.65) for s in seeds]
    lines += [_line("final", 0.4, "heuristic", {"drop_rate": 0.25}, 0, 0.99)]  # one seed: not the validated rate
    lines += [_line("final", 0.4, "ala", better_on_test, s, 0.75) for s in seeds]
    lines += [_line("final", 0.4, "ala", better_on_validation, s, 0.70 + 0.01 * s) for s in seeds]
    lines += [_line("validation", 0.4, "ala", better_on_test, 0, 0.5, map_r=0.10)]
    # a line that writes a library default out ran the same setting as one that leaves it out
    lines += [_line("validation", 0.4, "ala", {**better_on_validation, "state": "per_step"}, 0, 0.5, map_r=0.20)]
    lines += [_line("validation", 0.4, "ala", {"weight_floor": 0.5}, 0, 0.5, map_r=0.90)]  # no test seeds: not a choice
    # validated on seed 1 too, the two above on seed 0 only: it competes alone
    twice = {"lookahead_variables": "head", "trusted": [30, 3], "output_penalty": 0.3}
    lines += [_line("final", 0.4, "ala", twice, s, 0.60) for s in seeds]
    lines += [_line("validation", 0.4, "ala", twice, s, 0.5, map_r=0.05) for s in (0, 1)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    (row,) = summary.cell_lines(summary.read(str(path))[""], "protocol")
    assert "output_penalty 0.3 (of 1)" in row
    path.write_text("".join(json.dumps(line) + "\n" for line in lines[: -len(seeds) - 2]))
    (row,) = summary.cell_lines(summary.read(str(path))[""], "protocol")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "head-only (of 2)"
    gain, cost = 100 * np.mean([0.10 + 0.01 * s for s in seeds]), 20.0
    assert cells[4] == f"{gain / cost:.2f} / {5 / 20:.2f}"
    versus = 100 * np.array([0.05 + 0.01 * s for s in seeds])
    assert cells[5] == f"{versus.mean():+.1f} +- {versus.std(ddof=1) / np.sqrt(5):.1f} (5/5 above)"
    on_clean = 100 * np.array([-0.01 - 0.01 * s for s in seeds])
    assert cells[6] == f"{on_clean.mean():+.1f} +- {on_clean.std(ddof=1) / np.sqrt(5):.1f} (0/5 above)"


def test_summary_names_a_cell_without_a_validated_setting_and_refuses_a_mixed_file(tmp_path):
    from benchmarks.label_noise import summary

    lines = [_line("final", 0.0, "base", {}, s, 0.8) for s in range(5)]
    lines += [_line("final", 0.2, m, {}, s, 0.7) for m in ("base", "heuristic", "ala") for s in range(5)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (row,) = summary.cell_lines(summary.read(str(path))[""], "protocol")
    assert "no setting both validated and run on the test seeds" in row

    mixed = dict(lines[0], base_method="margin_all")
    path.write_text("".join(json.dumps(line) + "\n" for line in [*lines, mixed]))
    with pytest.raises(ValueError, match="margin ran as"):
        summary.read(str(path))


def test_summary_pairs_runs_of_one_machine_only(tmp_path):
    from benchmarks.label_noise import summary

    lines = []
    for machine, shift in (({}, 0.0), ({"machine": "another CPU"}, 0.10)):  # the earlier runs record none
        ala = {"lookahead_variables": "head"}
        rows = [_line("final", 0.0, "base", {}, s, 0.80 + shift) for s in range(5)]
        rows += [_line("final", 0.4, "base", {}, s, 0.60 + shift) for s in range(5)]
        rows += [_line("final", 0.4, "heuristic", {"drop_rate": 0.5}, s, 0.65 + shift) for s in range(5)]
        rows += [_line("final", 0.4, "ala", ala, s, 0.70 + shift + 0.01 * s) for s in range(5)]
        rows += [_line("validation", 0.4, "ala", ala, 0, 0.5)]
        lines += [dict(row, **machine) for row in rows]
    for name in ("results_600.jsonl", "results_pretrained.jsonl", "results_fashion.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(line) + "\n" for line in lines))

    text = summary.summary(sources=[("results_600.jsonl", "glyphs", "")], here=str(tmp_path))
    rows = [line for line in text.splitlines() if line.startswith("| glyphs")]
    assert [row.split("|")[1].strip() for row in rows] == ["glyphs [A]", "glyphs [B]"]
    versus = 100 * np.array([0.05 + 0.01 * s for s in range(5)])  # the same within each machine
    expected = f"{versus.mean():+.1f} +- {versus.std(ddof=1) / np.sqrt(5):.1f} (5/5 above)"
    assert all(row.split("|")[6].strip() == expected for row in rows)
    assert "B: another CPU" in text.splitlines()[0]


def test_the_table_keeps_rows_and_pairs_per_machine():
    from benchmarks.label_noise import label_noise

    lines = []
    for machine, shift in (({}, 0.0), ({"machine": "another CPU"}, 0.10)):
        rows = [_line("final", 0.0, "base", {}, s, 0.80 + shift) for s in range(3)]
        rows += [_line("final", 0.4, "base", {}, s, 0.60 + shift) for s in range(3)]
        rows += [_line("final", 0.4, "heuristic", {"drop_rate": 0.5}, s, 0.65 + shift) for s in range(3)]
        rows += [_line("final", 0.4, "ala", {}, s, 0.70 + shift + 0.01 * s) for s in range(3)]
        lines += [dict(row, **machine) for row in rows]
    records = {label_noise.key(line): line for line in lines}

    text = label_noise.table(records, steps=300)
    ala = [row for row in text.splitlines() if row.startswith("| margin | 40% | + DML-ALA")]
    assert [row.split("|")[3].strip() for row in ala] == ["+ DML-ALA [A]", "+ DML-ALA [B]"]
    versus = 100 * np.array([0.05, 0.06, 0.07])  # paired within each machine: the shift between them cancels
    expected = f"{versus.mean():+.1f} +- {versus.std(ddof=1) / np.sqrt(3):.1f} (3/3 above)"
    assert [row.split("|")[11].strip() for row in ala] == [expected, expected]
    assert "B: another CPU" in text.splitlines()[0]


def test_summary_reads_the_defaults_with_the_verified_set_apart_with_their_cpu_ratio(tmp_path):
    from benchmarks.label_noise import summary

    seeds = range(5)
    lines = [dict(_line("final", 0.0, "base", {}, s, 0.80), train_cpu_s=10.0) for s in seeds]
    lines += [dict(_line("final", 0.4, "base", {}, s, 0.60), train_cpu_s=10.0 + s) for s in seeds]
    lines += [_line("final", 0.4, "heuristic", {"drop_rate": 0.5}, s, 0.65) for s in seeds]
    # the defaults with the verified set, and a written-out default that is the same setting
    defaults = {"trusted": [30, 3], "state": "per_step"}
    lines += [dict(_line("final", 0.4, "ala", defaults, s, 0.62 + 0.01 * s), train_cpu_s=50.0) for s in seeds]
    lines += [_line("final", 0.4, "ala", {}, s, 0.99) for s in seeds]  # noisy validation labels: not this table
    lines += [_line("final", 0.4, "ala", {"trusted": [30, 3], "heuristic": 0.5}, s, 0.99) for s in seeds]
    lines += [_line("final", 0.0, "ala", {"trusted": [30, 3]}, s, 0.805) for s in seeds]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    (row,) = summary.defaults_lines(summary.read(str(path))[""], "protocol")
    cells = [c.strip() for c in row.strip("|").split("|")]
    gain = 100 * np.mean([0.02 + 0.01 * s for s in seeds])
    assert cells[3] == f"{gain / 20:.2f} / {5 / 20:.2f}"
    versus = 100 * np.array([-0.03 + 0.01 * s for s in seeds])
    above = int(np.sum(versus > 0))
    assert cells[4] == f"{versus.mean():+.1f} +- {versus.std(ddof=1) / np.sqrt(5):.1f} ({above}/5 above)"
    assert cells[5] == "+0.5 +- 0.0 (5/5 above)"
    assert cells[6] == f"{50 / np.mean([10.0 + s for s in seeds]):.1f}x"


def test_the_verdicts_table_reads_one_machine_and_pairs_each_remedy_with_the_heuristic(tmp_path):
    from benchmarks.label_noise import summary

    seeds, cut = range(5), {"trusted": [30, 3], "lookahead_variables": "head", "distance_cut": 1.0}
    lines = []
    for machine, shift in (({"machine": "an earlier CPU"}, 0.10), ({"machine": "the latest CPU"}, 0.0)):
        rows = [
            dict(_line("final", n, "base", {}, s, 0.80 - n), train_cpu_s=10.0) for n in (0.0, 0.2, 0.4) for s in seeds
        ]
        rows += [
            _line("final", n, "heuristic", {"drop_rate": 0.5}, s, 0.85 - n + 0.01 * s)
            for n in (0.2, 0.4)
            for s in seeds
        ]
        rows += [dict(_line("final", 0.4, "ala", cut, s, 0.50 + shift), train_cpu_s=20.0) for s in seeds]
        rows += [_line("final", 0.0, "ala", cut, s, 0.81) for s in seeds]
        lines += [dict(row, **machine) for row in rows]
    for name in ("results_pretrained.jsonl", "results_600.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(line) + "\n" for line in lines))

    text = summary.verdicts(sources=[("results_pretrained.jsonl", "warm", None)], here=str(tmp_path))
    assert "the latest CPU" in text and "an earlier CPU" not in text and "[A]" not in text
    rows = {
        row.split("|")[3].strip(): [c.strip() for c in row.strip("|").split("|")]
        for row in text.splitlines()
        if row.startswith("| warm")
    }
    assert set(rows) == {"the heuristic", "DML-ALA on the verified cut's pairs"}  # remedies not run: no row
    versus = 100 * np.array([0.50 - (0.45 + 0.01 * s) for s in seeds])  # the latest machine's pairs
    heuristic = 100 * np.array([0.85 - 0.4 + 0.01 * s - 0.40 for s in seeds])
    assert rows["DML-ALA on the verified cut's pairs"][3:] == [
        f"{versus.mean():+.1f} +- {versus.std(ddof=1) / np.sqrt(5):.1f} (5/5 above)",
        "-",
        "+1.0 +- 0.0 (5/5 above)",
        "2.0x",
    ]
    assert rows["the heuristic"][3] == (
        f"{heuristic.mean():+.1f} +- {heuristic.std(ddof=1) / np.sqrt(5):.1f} (5/5 above) over the plain loss"
    )


def test_the_committed_verdicts_table_is_what_the_results_give():
    """The page's one table is written from the results files; a hand edit or a run without the rewrite fails."""
    import os

    from benchmarks.label_noise import summary

    with open(os.path.join(summary.HERE, "verdicts.md"), encoding="utf-8") as f:
        assert f.read() == summary.verdicts(), "run python -m benchmarks.label_noise.summary"
