"""Independent NumPy reference implementations used by the tests (never import tfdml here), and beside them
the expected values the tests compare with (see `README.md` here for where each file came from)."""

import json
import os

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
REFERENCE_FILE = os.path.join(DATA_DIR, "reference_losses.json")
OFFICIAL_FILE = os.path.join(DATA_DIR, "reference_official.json")


def _load(path):
    with open(path) as handle:
        return json.load(handle)


def shared_reference_cases(*loss_names):
    """`[(case, expected)]` of `tests/references/reference_losses.json` whose `expected["loss"]` is one of
    `loss_names`."""
    cases = _load(REFERENCE_FILE)["cases"]
    return [(case, expected) for case in cases for expected in case["expected"] if expected["loss"] in loss_names]


def official_reference_cases(name):
    """Cases `name` (`"rll_official_gradient"`, `"margin_sampling_probabilities"`) of the outputs of the
    papers' official code, in `tests/references/reference_official.json`."""
    return _load(OFFICIAL_FILE)[name]
