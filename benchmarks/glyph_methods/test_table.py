"""The glyph method table is what its script writes from its results: a benchmark's own test, beside it."""

import os

from benchmarks.glyph_methods import benchmark_methods as methods

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_glyph_method_table_is_its_results_without_rows_that_hold_none():
    """`benchmarks/glyph_methods/table.md` is what the script writes from `results.jsonl` (measures nothing), and
    a method not run on the current protocol is named below the table, not shown as a row without figures."""
    records = methods.read_lines(os.path.join(ROOT, "benchmarks", "glyph_methods", "results.jsonl"), methods.CONFIG)
    rows = methods.summarise(records)
    done = {row[0] for row in rows}
    missing = [name for name in methods.METHODS if name not in done]
    table = methods.markdown_table(rows, methods.CONFIG, missing, methods.paired_differences(records))
    with open(os.path.join(ROOT, "benchmarks", "glyph_methods", "table.md"), encoding="utf-8") as f:
        assert f.read() == table
    assert "not run yet |" not in table and missing and "\nNot run on this protocol yet: " in table
    shown = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines() if line.startswith("| ")]
    assert not {methods.METHODS[name][0] for name in missing} & set(shown)
