"""tfdml.plots: each figure is written as a readable PNG; bad input gets a clear error."""

import numpy as np
import pytest
from matplotlib import image as mpimg

from tfdml import plots


def read(path):
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    return image


def test_recall_curve_single_and_compared_runs(tmp_path):
    run = {"recall@1": 0.5, "recall@2": 0.6, "recall@4": 0.7, "recall@8": 0.8, "map@r": 0.3}
    read(plots.plot_recall_curve(run, tmp_path / "one.png"))
    other = {k: v / 2 for k, v in run.items()}
    path = plots.plot_recall_curve({"rll": run, "triplet": other}, tmp_path / "sub" / "two.png")
    read(path)
    assert plots._recall_points(run) == [(1, 0.5), (2, 0.6), (4, 0.7), (8, 0.8)]
    with pytest.raises(ValueError, match="no 'recall@K' entries"):
        plots.plot_recall_curve({"map@r": 0.3}, tmp_path / "x.png")


def test_retrieval_grid(tmp_path):
    rng = np.random.default_rng(0)
    queries = [rng.integers(0, 255, (8, 8, 3), dtype=np.uint8), rng.random((10, 6))]
    neighbours = [[rng.integers(0, 255, (8, 8, 3), dtype=np.uint8) for _ in range(3)],
                  [rng.random((5, 5, 1)) for _ in range(3)]]
    flags = np.array([[True, False, True], [False, False, True]])
    image = read(plots.plot_retrieval_grid(queries, neighbours, flags, tmp_path / "grid.png"))
    assert image.shape[1] > image.shape[0]  # 4 columns, 2 rows
    read(plots.plot_retrieval_grid(queries, neighbours, None, tmp_path / "grey.png"))
    with pytest.raises(ValueError, match="one neighbour list per query"):
        plots.plot_retrieval_grid(queries, neighbours[:1], flags, tmp_path / "bad.png")


def test_training_curves(tmp_path):
    class FakeHistory:
        history = {"loss": [1.0, 0.6, 0.4], "val_loss": [1.1, 0.8, 0.7], "recall@1": [0.2, 0.4, 0.5],
                   "val_recall@1": [0.1, 0.3, 0.35], "lr": [0.1, 0.1, 0.01]}

    read(plots.plot_training_curves(FakeHistory(), tmp_path / "h.png"))
    read(plots.plot_training_curves({"loss": [3.0, 2.0]}, tmp_path / "h2.png"))
    with pytest.raises(ValueError, match="history is empty"):
        plots.plot_training_curves({}, tmp_path / "h3.png")
