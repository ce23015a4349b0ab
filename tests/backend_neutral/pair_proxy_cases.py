"""Backend-neutral reference cases of the ranked-list, group, pair-based, proxy, classifier, softmax-contrastive
and Smooth-AP losses: pytorch-metric-learning's values and gradients (`tests/references/pml_reference.json`,
`tests/references/smooth_ap_reference.json`), the shared reference file (`tests/references/reference_losses.json`), the
authors' RLL layer (`tests/references/reference_official.json`) and NumPy readings of the formulas. NumPy and
`keras.ops` only; `cases(Case)` builds them with the harness's `Case` type (`reference_cases`).

The proxy losses are checked through their pure functions with the reference's float64 proxies (the classes
hold a float32 variable, checked against the functions on TensorFlow).
"""

import json
import os

import numpy as np

import tfdml.losses as losses
from tests import REFERENCES
from tests.references import numpy_losses, official_reference_cases, shared_reference_cases
from tests.references import numpy_margin_group as numpy_group

DATA = REFERENCES


def _load(name):
    with open(os.path.join(DATA, name)) as file:
        return json.load(file)


_PROXY_FUNCTIONS = {
    "proxy_anchor": losses.proxy_anchor_loss,
    "proxy_nca": losses.proxy_nca_loss,
    "normalized_softmax": losses.normalized_softmax_loss,
    "arcface": losses.arcface_loss,
    "cosface": losses.cosface_loss,
}


def _pml_make(name, spec, batch):
    if not spec["proxies"]:
        cls = getattr(losses, spec["tfdml"])
        return lambda: cls(**spec["args"])
    function, proxies = _PROXY_FUNCTIONS[name], np.asarray(batch["proxies"], np.float64)
    return lambda: lambda y, x: function(y, x, proxies, **spec["args"])


def _pml(Case):
    reference = _load("pml_reference.json")
    for name, spec in reference["losses"].items():
        for batch_name, expected in spec["cases"].items():
            batch = reference["batches"][batch_name]
            yield Case(
                f"pml/{name}/{batch_name}",
                _pml_make(name, spec, batch),
                np.asarray(batch["labels"], np.int32),
                np.asarray(batch["embeddings"], np.float64),
                expected["value"],
                np.asarray(expected["grad_embeddings"]),
                rtol=1e-10,
            )


def _smooth_ap(Case):
    reference = _load("smooth_ap_reference.json")
    for number, expected in enumerate(reference["cases"]):
        batch = reference["batches"][expected["batch"]]
        # PML sums each anchor's AP in float32: its values carry float32 round-off (no gradient at 1e-9, and
        # only the values well above that round-off).
        if expected["value"] < 1e-3:
            continue
        yield Case(
            f"pml/smooth_ap/{expected['batch']}/{number}",
            lambda t=expected["temperature"]: losses.SmoothAPLoss(t),
            np.asarray(batch["labels"], np.int32),
            np.asarray(batch["embeddings"], np.float64),
            expected["value"],
            rtol=1e-6,
        )


def _ranked_list(Case):
    for number, (case, expected) in enumerate(shared_reference_cases("RankedListLoss")):
        yield Case(
            f"shared/RankedListLoss/{number}",
            lambda params=expected["params"]: losses.RankedListLoss(query_weighting="uniform", **params),
            np.asarray(case["labels"], np.int32),
            np.asarray(case["embeddings"], np.float64),
            expected["value"],
            rtol=1e-6,
        )
    rng = np.random.default_rng(3)
    for number, params in enumerate([dict(), dict(margin=0.2, alpha=1.1, tn=4.0, tp=5.0, lam=0.7)]):
        labels = rng.integers(0, 3, size=10).astype(np.int32)
        x = rng.normal(size=(10, 4)) * 0.5
        yield Case(
            f"numpy/RankedListLoss/{number}",
            lambda p=params: losses.RankedListLoss(query_weighting="uniform", **p),
            labels,
            x,
            numpy_losses.ranked_list_loss(labels, x, **params),
            rtol=1e-6,
        )


def _ranked_list_official(Case):
    """The gradient of the authors' Caffe layer (which adds 1e-6 to distances in its backward pass)."""
    for case in official_reference_cases("rll_official_gradient"):
        params = {k: case[k] for k in ("margin", "alpha", "tn", "tp", "lam")}
        gradient = np.asarray(case["gradient"])
        yield Case(
            f"official/RankedListLoss/B{len(case['labels'])}-tn{case['tn']}-tp{case['tp']}",
            lambda p=params: losses.RankedListLoss(**p),
            np.asarray(case["labels"], np.int32),
            np.asarray(case["embeddings"], np.float64),
            None,
            gradient,
            gradient_atol=1e-5 * np.abs(gradient).max(),
        )


def _group(Case):
    for number, (case, expected) in enumerate(shared_reference_cases("group_loss")):
        logits = np.asarray(case["logits"], np.float64)
        yield Case(
            f"shared/group_loss/{number}",
            lambda c=logits.shape[1], params=expected["params"]: losses.GroupLoss(c, **params),
            np.asarray(case["labels"], np.int32),
            np.concatenate([np.asarray(case["embeddings"], np.float64), logits], axis=1),
            expected["value"],
            rtol=1e-9,
        )
    rng = np.random.default_rng(7)
    for number, params in enumerate(
        [dict(temperature=1.0, num_iterations=3), dict(temperature=24.0, zero_diagonal=True)]
    ):
        labels = rng.integers(0, 4, size=9).astype(np.int32)
        f, z = rng.normal(size=(9, 5)), rng.normal(size=(9, 4)) * 2
        yield Case(
            f"numpy/group_loss/{number}",
            lambda p=params: losses.GroupLoss(4, **p),
            labels,
            np.concatenate([f, z], axis=1),
            numpy_group.group_loss(labels, f, z, **params),
            rtol=1e-6,
        )


def cases(Case):
    """Every case of these losses, as `Case`s of the backend harness."""
    return [*_pml(Case), *_smooth_ap(Case), *_ranked_list(Case), *_ranked_list_official(Case), *_group(Case)]


# Losses whose `model.fit` of a small embedder must lower the loss on every backend: `name -> make()`. RLL with
# the uniform weighting, whose value is the objective it descends (the official weighting's value moves its
# weight to the hard queries as training goes, so it need not fall; its gradient is checked above).
FIT_LOSSES = {
    "ranked_list": lambda: losses.RankedListLoss(query_weighting="uniform"),
    "multi_similarity": lambda: losses.MultiSimilarityLoss(),
    "supcon": lambda: losses.SupConLoss(),
}
