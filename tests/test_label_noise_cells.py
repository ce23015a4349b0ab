"""The label-noise table's paired comparison cell (benchmarks/label_noise/cells.py), against NumPy."""

import numpy as np

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
