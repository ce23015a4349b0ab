"""`tfdml train` with DML-ALA on labels the job declares noisy (`loss.label_noise`) and no verified validation
set (`ala.val_path`) says so in one warning line before any work, naming the option to set; with the
verified set, or without declared noise, it says nothing of it. The job is stopped right after by a batch the
data cannot fill (a refusal found once the data is read: the first work), so nothing trains."""

import contextlib
import io

import numpy as np
import pytest
from PIL import Image

from tfdml import cli

WARNING = "tfdml train: warning: ala.enabled with loss.label_noise and no ala.val_path"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two image folders of 4 classes x 3 images, 16 px: the training data and a verified set."""
    rng = np.random.default_rng(0)
    base = tmp_path_factory.mktemp("ala_noisy_labels")
    for folder in ("data", "verified"):
        for label, name in enumerate(("ant", "bee", "cat", "dog")):
            (base / folder / name).mkdir(parents=True)
            for i in range(3):
                pixels = rng.integers(0, 40, size=(16, 16, 3)) + 50 * label
                Image.fromarray(pixels.astype(np.uint8)).save(base / folder / name / f"{i}.png")
    return base


def _train(folders, monkeypatch, *overrides):
    """stderr lines of `tfdml train` on the folder with DML-ALA and a 22-class batch the data cannot fill."""
    monkeypatch.chdir(folders)
    options = ["ala.enabled=true", "loss.name=contrastive", "data.classes_per_batch=22", *overrides]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["train", "--image-dir", str(folders / "data"), *[f"--set={o}" for o in options]])
    assert rc == 2, err.getvalue()
    return err.getvalue().splitlines()


def _refusal(lines):
    """The line of the job's refusal of the episode: 22 training classes, the data has fewer."""
    return next(
        (i for i, line in enumerate(lines) if line.startswith("tfdml train: error: ala.episode: ") and "22" in line),
        None,
    )


@pytest.mark.slow
def test_noisy_labels_without_a_verified_set_warn_once_before_any_work(folders, monkeypatch):
    lines = _train(folders, monkeypatch, "loss.label_noise.rate=0.25")
    warnings = [i for i, line in enumerate(lines) if line.startswith(WARNING)]
    assert len(warnings) == 1, lines
    warning = lines[warnings[0]]
    assert "weigh mislabelled pairs above correct ones" in warning and "trained below the plain loss" in warning
    assert "set ala.val_path to an image folder" in warning and "benchmarks" not in warning  # a plain message
    # Before the job read the data: the refusal of the batch, found in the data, comes after it.
    assert warnings[0] < _refusal(lines)


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides", [["loss.label_noise.rate=0.25", "ala.val_path=verified"], []], ids=["verified set", "no noise"]
)
def test_a_verified_set_or_no_declared_noise_says_nothing_of_it(folders, monkeypatch, overrides):
    lines = _train(folders, monkeypatch, *overrides)
    assert not [line for line in lines if "ala.val_path" in line and "warning" in line], lines
    assert _refusal(lines) is not None
