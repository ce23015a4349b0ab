"""The reference cases every stateless loss must pass on every backend: values (and gradients where the
reference has them) against pytorch-metric-learning (`tests/references/pml_reference.json`), the shared reference
file (`tests/references/reference_losses.json`), tensorflow-addons' semantics and NumPy readings of the formulas
(`tests/references`). NumPy and `keras.ops` only.

A case is `Case(name, make, labels, embeddings, value, gradient=None, normalise=False)`: `make()` builds the
loss (any `MetricLoss`), `normalise` L2-normalises the embeddings inside the differentiated function (PML's
losses normalise their input).
"""

import dataclasses
import json
import os

import numpy as np

import tfdml.losses as losses
from tests import REFERENCES
from tests.backend_neutral import pair_proxy_cases
from tests.references import numpy_losses as ref
from tests.references import numpy_margin_group as margin_ref
from tests.references import shared_reference_cases

DATA = REFERENCES
with open(os.path.join(DATA, "pml_reference.json")) as _file:
    PML = json.load(_file)


@dataclasses.dataclass
class Case:
    name: str
    make: object
    labels: np.ndarray
    embeddings: np.ndarray
    value: float
    gradient: np.ndarray = None
    normalise: bool = False
    rtol: float = 1e-8
    gradient_atol: float = 1e-9  # value None: a gradient-only case


def _pml_contrastive():
    for name, spec in PML["normalizing_losses"].items():
        for batch_name, case in spec["cases"].items():
            batch = PML["batches"][batch_name]
            yield Case(
                f"pml/{name}/{batch_name}",
                lambda args=spec["args"]: losses.ContrastiveLoss(**args),
                np.asarray(batch["labels"], np.int32),
                np.asarray(batch["embeddings"], np.float64),
                case["value"],
                np.asarray(case["grad_embeddings"]),
                normalise=True,
            )


_SHARED = {
    "TripletLoss": losses.TripletLoss,
    "TripletSemiHardLoss": losses.TripletSemiHardLoss,
    "MarginLoss": losses.MarginLoss,
}


def _shared_reference():
    for number, (case, expected) in enumerate(shared_reference_cases(*_SHARED)):
        yield Case(
            f"shared/{expected['loss']}/{number}",
            lambda cls=_SHARED[expected["loss"]], params=expected["params"]: cls(**params),
            np.asarray(case["labels"], np.int32),
            np.asarray(case["embeddings"], np.float64),
            expected["value"],
            rtol=1e-6,
        )


# pytorch-metric-learning 2.9: MarginLoss(margin=0.2, beta=1.2, nu=0.1, learn_beta=True, num_classes=10),
# all triplets, float64, on the two MarginLoss cases of the shared reference data.
PML_MARGIN_PER_CLASS_NU = [0.5310872569895259, 0.4245209130837688]


def _pml_margin():
    cases = [case for case, _ in shared_reference_cases("MarginLoss")]
    for number, (case, expected) in enumerate(zip(cases, PML_MARGIN_PER_CLASS_NU)):
        yield Case(
            f"pml/margin/per_class_nu/{number}",
            lambda: losses.MarginLoss(sampling="all", nu=0.1, num_classes=10, learn_beta=True),
            np.asarray(case["labels"], np.int32),
            np.asarray(case["embeddings"], np.float64),
            expected,
            rtol=1e-6,
        )


def _random_batch(seed, batch_size=12, num_classes=3, dim=5):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=batch_size).astype(np.int32)
    labels[1] = labels[0]
    return labels, rng.normal(size=(batch_size, dim)) * 0.6


def _numpy_references():
    minings = {"all": ref.triplet_all, "hard": ref.triplet_batch_hard, "semi_hard": ref.triplet_semi_hard}
    for seed in (0,):  # one batch: the TensorFlow tests cover more; here each backend's run stays short
        labels, x = _random_batch(seed)
        for mining, reference in minings.items():
            for soft, squared, margin in [(False, False, 0.2), (False, True, 0.5), (True, False, 0.3)]:
                yield Case(
                    f"numpy/triplet/{mining}/{soft}/{squared}/{seed}",
                    lambda a=(margin, mining, soft, squared): losses.TripletLoss(*a),
                    labels,
                    x,
                    reference(labels, x, margin=margin, soft=soft, squared=squared),
                    rtol=1e-6,
                )
        yield Case(
            f"numpy/contrastive/{seed}",
            lambda: losses.ContrastiveLoss(0.3, 1.2),
            labels,
            x,
            ref.contrastive(labels, x, 0.3, 1.2),
        )


def _numpy_margin():
    labels, x = _random_batch(0)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    # 1.25 and 0.25 are exact in float32: a learned beta is a float32 variable.
    yield Case(
        "numpy/margin/all/learned_beta",
        lambda: losses.MarginLoss(alpha=0.25, beta=1.25, nu=0.1, sampling="all"),
        labels,
        x,
        margin_ref.margin_loss_all(labels, x, 1.25, alpha=0.25, nu=0.1),
        rtol=1e-6,
    )
    yield Case(
        "numpy/margin/all/per_class_beta",
        lambda: losses.MarginLoss(beta=1.25, num_classes=3, nu=0.1, sampling="all"),
        labels,
        x,
        margin_ref.margin_loss_all(labels, x, np.full(3, 1.25), nu=0.1),
        rtol=1e-6,
    )
    # Distance-weighted draws differ between backends: a finite value and gradient is what they share.
    yield Case("margin/distance_weighted/finite", lambda: losses.MarginLoss(seed=1), labels, x, None)


def _tfa_references():
    for seed in (0,):
        labels, x = _random_batch(seed + 10)
        for margin in (0.1, 1.0):
            yield Case(
                f"tfa/semihard/{margin}/{seed}",
                lambda m=margin: losses.TripletSemiHardLoss(m),
                labels,
                x,
                ref.tfa_triplet_semihard(labels, x, margin),
                rtol=1e-6,
            )
            for soft in (False, True):
                yield Case(
                    f"tfa/hard/{margin}/{soft}/{seed}",
                    lambda m=margin, s=soft: losses.TripletHardLoss(m, soft=s),
                    labels,
                    x,
                    ref.tfa_triplet_hard(labels, x, margin, soft=soft),
                    rtol=1e-6,
                )


CASES = [
    *_pml_contrastive(),
    *_shared_reference(),
    *_pml_margin(),
    *_numpy_references(),
    *_numpy_margin(),
    *_tfa_references(),
    *pair_proxy_cases.cases(Case),
]

# Losses whose `model.fit` must lower the loss on every backend: `name -> make()`.
FIT_LOSSES = {
    "triplet": lambda: losses.TripletLoss(margin=0.2),
    "contrastive": lambda: losses.ContrastiveLoss(),
    "margin": lambda: losses.MarginLoss(),
    **pair_proxy_cases.FIT_LOSSES,
    "nested/contrastive": lambda: losses.NestedLoss(losses.ContrastiveLoss(), (4, 8)),
}

# Tuple losses whose `compute` (its fast path) must equal `reduce_terms` of its dense terms, value and gradient.
TERMS_LOSSES = {
    **{f"triplet/{mining}": (lambda m=mining: losses.TripletLoss(mining=m)) for mining in ("all", "hard", "semi_hard")},
    "triplet/all/soft": lambda: losses.TripletLoss(soft=True),
    "contrastive": lambda: losses.ContrastiveLoss(0.3, 1.2),
    "margin/all": lambda: losses.MarginLoss(beta=1.25, num_classes=3, nu=0.1, sampling="all"),
}

# NestedLoss(loss, dims, weights) must equal the weighted sum of `loss` on the L2-normalised prefixes:
# `name -> (make_loss(), dims, weights)`.
NESTED_LOSSES = {"nested/multi_similarity": (lambda: losses.MultiSimilarityLoss(), (2, 4, 8), (1.0, 0.5, 2.0))}
