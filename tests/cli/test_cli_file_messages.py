"""A library's message passed through as it stands can mislead: Keras says "File not found" for a .keras file
that is there but truncated, h5py "file signature not found", NumPy "pickled data" for an --embeddings file that
is text. The cases run the user's commands one after another in one subprocess (`cli_process.run_in_one_process`)
and each expects one line that says what the file is, before TensorFlow is imported."""

import re
import zipfile

import numpy as np
import pytest

from tests import cli_process

CASES = {
    "keras-archive-truncated": (
        ["export", "--model", "truncated.keras", "--name", "m"],
        "--model: truncated.keras exists but is not a readable Keras archive",
    ),
    "keras-file-of-text": (
        ["export", "--model", "notes.keras", "--name", "m"],
        "--model: notes.keras exists but is not a readable Keras archive",
    ),
    "zip-without-a-model": (
        ["export", "--model", "other.keras", "--name", "m"],
        "--model: other.keras is a zip archive but not a Keras model (it has no config.json)",
    ),
    "savedmodel-folder": (
        ["export", "--model", "exported", "--name", "m"],
        "--model: exported is a SavedModel folder (what 'tfdml export' writes), not a Keras model",
    ),
    "h5-of-text": (
        ["export", "--model", "weights.h5", "--name", "m"],
        "--model: weights.h5 exists but is not a readable HDF5 (.h5) Keras file",
    ),
    "another-extension": (
        ["export", "--model", "model.pt", "--name", "m"],
        "--model: model.pt is not a .keras file",
    ),
    "embeddings-npy-not-npz": (
        ["evaluate", "--embeddings", "vectors.npy"],
        "--embeddings: vectors.npy is not an .npz archive (np.savez writes one",
    ),
    "embeddings-text": (
        ["evaluate", "--embeddings", "vectors.npz"],
        "--embeddings: vectors.npz is not an .npz archive",
    ),
}


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    root = tmp_path_factory.mktemp("messages")
    with zipfile.ZipFile(root / "whole.keras", "w") as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("model.weights.h5", b"\0" * 4096)
    data = (root / "whole.keras").read_bytes()
    (root / "truncated.keras").write_bytes(data[: len(data) // 2])  # an interrupted copy
    (root / "notes.keras").write_text("not a model")
    with zipfile.ZipFile(root / "other.keras", "w") as archive:
        archive.writestr("readme.txt", "a zip, but no Keras model")
    (root / "exported").mkdir()
    (root / "exported" / "saved_model.pb").write_bytes(b"\0")
    (root / "weights.h5").write_text("not HDF5")
    (root / "model.pt").write_bytes(b"\0")
    np.save(root / "vectors.npy", np.zeros((4, 2)))
    (root / "vectors.npz").write_text("embeddings,labels\n")
    return root


@pytest.fixture(scope="module")
def runs(place, tmp_path_factory):
    """`{case: (exit status, stderr, stdout, whether TensorFlow was imported by then)}`."""
    out = tmp_path_factory.mktemp("messages_out")
    return dict(zip(CASES, cli_process.run_in_one_process([args for args, _ in CASES.values()], place, out)))


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_message_says_what_the_file_is(case, runs):
    _, message = CASES[case]
    returncode, err, out, tensorflow_imported = runs[case]
    assert returncode == 2, err[-3000:]
    errors = [line for line in err.splitlines() if re.match(r"tfdml \w+: error: ", line)]
    assert len(errors) == 1 and message in errors[0], err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    assert not tensorflow_imported, "this error should come before TensorFlow is imported"
