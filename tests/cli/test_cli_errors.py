"""What a user can get wrong on the command line gives one clear line and an exit status, never a traceback.

The cases run the CLI in one subprocess, one after another, each with its own stderr and stdout files (so
that a traceback would show there) and its exit status (`SystemExit`'s code, as the shell would see it). The
usage and configuration errors that can be told from the arguments, the configuration and the file system are
also checked to come before TensorFlow is imported (which takes seconds): they run first, and the process
records after each case whether TensorFlow is imported yet; the others (backbone names, ImageNet weights) need
the library, which the process imports once for them all. Ctrl-C during training is tested with the training
runs in test_cli_train.py.
"""

import re

import numpy as np
import pytest
from PIL import Image

from tests import cli_process


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A working directory with what the cases point at: a file, an empty folder, a folder of empty class
    folders, a tiny RGB image folder, a config folder, a (fake) model file and two query images."""
    root = tmp_path_factory.mktemp("errors")
    (root / "a_file").write_text("not a folder")
    (root / "empty").mkdir()
    for name in ("ant", "bee"):
        (root / "hollow" / name).mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("ant", "bee", "cat", "dog"):
        (root / "rgb" / name).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / "rgb" / name / f"{i}.png")
    (root / "configs").mkdir()
    (root / "model.keras").write_bytes(b"")
    for name in ("a.png", "b.png"):
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / name)
    return root


# (arguments, exit status, message on stderr, whether TensorFlow may be imported first); every case runs without
# network and with an empty Keras cache (the `runs` fixture)
CASES = {
    "image-dir-without-class-folders": (
        ["train", "--image-dir", "empty"],
        2,
        "data.path (--image-dir): empty has no class sub-folders",
        False,
    ),
    "image-dir-with-empty-class-folders": (
        ["train", "--image-dir", "hollow"],
        2,
        "none of the 2 class sub-folders of hollow holds a file",
        False,
    ),
    "export-dir-is-a-file": (["train", "--export-dir", "a_file"], 2, "export.base_dir (--export-dir): ", False),
    "report-dir-is-a-file": (["train", "--report-dir", "a_file"], 2, "report.dir (--report-dir): ", False),
    "config-is-a-directory": (
        ["train", "--config", "configs"],
        2,
        "--config configs is a directory; give a YAML file",
        False,
    ),
    "one-sample-per-class": (
        ["train", "--set", "data.samples_per_class=1"],
        2,
        "data.samples_per_class: ranked_list compares images of one class, so a batch needs at least 2",
        False,
    ),
    "unknown-key": (["train", "--set", "training.epoch=2"], 2, "unknown configuration key 'training.epoch'", False),
    "backbone-typo": (
        ["train", "--set", "model.backbone=resnet5O"],
        2,
        "model.backbone: unknown backbone 'resnet5O' (did you mean 'resnet50'?); valid: small_cnn, ",
        True,
    ),
    "imagenet-weights-on-the-small-cnn": (
        ["train", "--set", "model.weights=imagenet"],
        2,
        "model.weights: the small CNN has no pretrained weights: use null",
        True,
    ),
    "imagenet-weights-on-grayscale-glyphs": (
        [
            "train",
            "--set",
            "model.backbone=resnet50",
            "--set",
            "model.weights=imagenet",
            "--no-export",
            "--report-dir",
            "r_gray",
        ],
        2,
        "model.weights: ImageNet weights take 3-channel (RGB) images, but the training data (glyphs",
        True,
    ),
    "imagenet-weights-offline": (
        [
            "train",
            "--image-dir",
            "rgb",
            "--set",
            "model.backbone=mobilenetv3small",
            "--set",
            "model.weights=imagenet",
            "--no-export",
            "--report-dir",
            "r_offline",
        ],
        2,
        "offline, train from scratch with --set model.weights=null",
        True,
    ),
    "evaluate-negative-batch-size": (
        ["evaluate", "--model", "x", "--batch-size", "-5"],
        2,
        "argument --batch-size: must be a positive integer, got -5",
        False,
    ),
    "search-labels-before-the-images": (
        ["search", "--model", "x", "--query-labels", "M", "a.png", "b.png"],
        2,
        "1 --query-label for 2 query images: give one --query-label CLASS per image",
        False,
    ),
    "export-base-dir-is-a-file": (
        ["export", "--model", "model.keras", "--name", "m", "--base-dir", "a_file"],
        2,
        "tfdml export: error: --base-dir: ",
        False,
    ),
}


@pytest.fixture(scope="module")
def runs(place, tmp_path_factory):
    """`{case: (exit status, stderr, stdout, whether TensorFlow was imported by then)}`: the cases that come
    before TensorFlow first, in one process with no network (every download goes to a closed local port) and
    an empty Keras cache (no cached weights file)."""
    order = sorted(CASES, key=lambda case: CASES[case][3])  # stable: the TensorFlow-free cases first
    results = cli_process.run_in_one_process(
        [CASES[case][0] for case in order],
        cwd=place,
        out=tmp_path_factory.mktemp("errors_out"),
        HTTPS_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        KERAS_HOME="keras_home",
    )
    return dict(zip(order, results))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_one_line_and_no_traceback(case, runs):
    _, status, message, needs_tensorflow = CASES[case]
    returncode, err, out, tensorflow_imported = runs[case]
    assert returncode == status, err[-3000:]
    assert "Traceback" not in err and message in err, err[-3000:]
    errors = [line for line in err.splitlines() if re.match(r"tfdml \w+: error: ", line)]
    assert len(errors) == 1 and message in errors[0], err[-3000:]
    if not needs_tensorflow:
        assert not tensorflow_imported, "this error should come before TensorFlow is imported"
    assert not out.strip() or "Traceback" not in out
