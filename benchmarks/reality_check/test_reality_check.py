"""The Reality Check protocol's own pieces (benchmarks/reality_check/reality_check.py): its class split, its search
draws and its paired differences. No training here; the script's runs are the benchmark."""

import numpy as np
import pytest

from benchmarks.reality_check import reality_check as rc


def test_split_is_by_class_and_relabels_the_training_part():
    labels = np.repeat(np.arange(30), 4)
    data = {"train_x": np.arange(len(labels), dtype=np.float32)[:, None], "train_y": labels}
    part = rc.split_training_classes(data)
    validation_classes = np.unique(part["test_y"])
    assert len(validation_classes) == 10  # a third of 30, by class
    # no validation image is a training image, and every image is in one part
    train_items = set(part["train_x"][:, 0].tolist())
    validation_items = set(part["test_x"][:, 0].tolist())
    assert not train_items & validation_items
    assert len(train_items) + len(validation_items) == len(labels)
    assert not set(labels[part["test_x"][:, 0].astype(int)]) - set(validation_classes)
    # the training part's labels are contiguous for the classifier heads
    assert part["num_classes"] == 20
    assert sorted(np.unique(part["train_y"]).tolist()) == list(range(20))


def test_trials_start_with_the_default_and_draw_inside_the_space():
    for name in rc.METHODS:
        settings = rc.trials(name, count=6)
        assert settings[0] == {}
        assert settings == rc.trials(name, count=6)  # seeded: a resumed run draws the same settings
        assert len({tuple(sorted(s.items())) for s in settings}) == 6
        space = dict(rc.SEARCH_SPACE[name], learning_rate=rc.LEARNING_RATE)
        for setting in settings[1:]:
            assert set(setting) == set(space)
            for key, value in setting.items():
                kind, *bounds = space[key]
                if kind == "choice":
                    assert value in bounds
                else:
                    assert bounds[0] * 0.999 <= value <= bounds[1] * 1.001, (name, key, value)
            if name.startswith("rll"):
                assert setting["margin"] <= setting["alpha"]  # the positive boundary alpha - m stays >= 0
            if name == "contrastive":
                assert setting["pos_margin"] < setting["neg_margin"]


def test_trials_follow_the_module_budget():
    old = rc.TRIALS
    try:
        rc.TRIALS = 3
        assert len(rc.trials("contrastive")) == 3
    finally:
        rc.TRIALS = old


def test_paired_differences_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 0.9, 5), rng.uniform(0.5, 0.9, 5)
    lines = {}
    for method, values in (("x", a), ("y", b)):
        for seed, value in enumerate(values):
            record = {
                "phase": "final",
                "regime": "scratch",
                "method": method,
                "seed": seed,
                "recall@1": value,
                "map@r": value / 2,
                "r_precision": value / 3,
            }
            lines[rc._key(record)] = record
    result = rc.paired(lines, "scratch", "x", "y")
    difference = 100 * (a - b)
    assert result["seeds"] == [0, 1, 2, 3, 4]
    assert result["recall@1"]["mean"] == pytest.approx(difference.mean(), abs=0.01)
    assert result["recall@1"]["std"] == pytest.approx(difference.std(), abs=0.01)
    assert result["recall@1"]["a_higher"] == int((difference > 0).sum())
    assert result["map@r"]["mean"] == pytest.approx(difference.mean() / 2, abs=0.01)
    with pytest.raises(SystemExit, match="no common final seeds"):
        rc.paired(lines, "pretrained", "x", "y")
