"""The pretrained benchmark's table is what its script writes from its results, and every method it names
ran on every seed it claims: a benchmark's own test, beside it."""

import collections
import json
import os

from benchmarks.pretrained import pretrained

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_tables_are_their_results():
    for name, lines in (
        ("table.md", pretrained.table_lines(pretrained.RESULTS)),
        ("paired.md", pretrained.paired_lines(pretrained.RESULTS)),
        ("nested.md", pretrained.nested_lines(pretrained.NESTED_RESULTS)),
    ):
        with open(os.path.join(HERE, name), encoding="utf-8") as f:
            assert f.read() == "\n".join(lines) + "\n", name


def test_every_head_method_ran_once_per_seed_on_each_data_set_it_names():
    seeds = collections.defaultdict(list)
    with open(pretrained.RESULTS, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["method"].startswith("heads: "):
                seeds[(row["data"], row["method"])].append(row["seed"])
    names = (*pretrained.HEAD_LOSSES, "rll_lmh", *pretrained.GROUP_METHODS, *pretrained.ALA_METHODS)
    methods = {f"heads: {name}" for name in names}
    assert {method for _, method in seeds} <= methods
    for key, ran in seeds.items():
        assert sorted(ran) == [0, 1, 2, 3, 4], key  # five seeds, none twice: a rerun replaces, not appends
