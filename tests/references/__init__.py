"""Independent NumPy reference implementations used by the tests (never import tfdml here), and the
expected loss values shipped in `../shared/testdata/reference_losses.json`."""

import json
import os

# The checkout sits beside the shared folder (as in CI); TFDML_SHARED_DIR points elsewhere if needed.
SHARED_DIR = os.environ.get(
    "TFDML_SHARED_DIR", os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir, "shared"))
REFERENCE_FILE = os.path.join(SHARED_DIR, "testdata", "reference_losses.json")


def shared_reference_cases(*loss_names):
    """`[(case, expected)]` of the shared reference file whose `expected["loss"]` is one of `loss_names`."""
    if not os.path.exists(REFERENCE_FILE):
        raise FileNotFoundError(
            f"{REFERENCE_FILE} not found: the tests expect the shared folder beside the checkout "
            "(or set TFDML_SHARED_DIR).")
    with open(REFERENCE_FILE) as handle:
        cases = json.load(handle)["cases"]
    return [(case, expected) for case in cases for expected in case["expected"] if expected["loss"] in loss_names]


OFFICIAL_FILE = os.path.join(SHARED_DIR, "testdata", "reference_official.json")


def official_reference_cases(name):
    """Cases `name` (`"rll_official_gradient"`, `"margin_sampling_probabilities"`) of the outputs of the
    papers' official code in `../shared/testdata/reference_official.json`."""
    if not os.path.exists(OFFICIAL_FILE):
        raise FileNotFoundError(f"{OFFICIAL_FILE} not found: the tests expect the shared folder beside the "
                                "checkout (or set TFDML_SHARED_DIR).")
    with open(OFFICIAL_FILE) as handle:
        return json.load(handle)[name]
