"""Writes pytorch-metric-learning's values and gradients of the losses tfdml ports from it to
`tests/references/pml_reference.json`, which `tests/losses/test_losses_pml.py` reads (the tests do not need torch).

For a few small float64 batches (labels, embeddings and, for the proxy losses, proxies) the file holds each PML
loss's value and its gradients with respect to the embeddings and the proxies. PML's `W` (`[D, C]`, used by
NormalizedSoftmax, CosFace and ArcFace) is the transpose of tfdml's `[C, D]` proxies; the file stores both the
inputs and the gradients in tfdml's layout.

Needs the bench extra (torch, pytorch-metric-learning 2.9):
    python tests/references/generators/pml_reference.py [--output tests/references/pml_reference.json]
"""

import argparse
import json
import os

import numpy as np
import pytorch_metric_learning
import torch
from pytorch_metric_learning import losses, miners

DEFAULT_OUTPUT = os.path.join(os.path.dirname(__file__), "..", "pml_reference.json")

# name -> (factory of (loss(embeddings, labels), parameter holding the proxies or None, transposed?), tfdml loss
# class name, tfdml constructor arguments). Every loss uses PML's defaults.
PAIR_LOSSES = {
    "multi_similarity_mined": (
        "MultiSimilarityLoss",
        {},
        lambda: _with_miner(
            losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5), miners.MultiSimilarityMiner(epsilon=0.1)
        ),
    ),
    "multi_similarity_all_pairs": (
        "MultiSimilarityLoss",
        {"mining_epsilon": None},
        lambda: losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5),
    ),
    "circle": ("CircleLoss", {}, lambda: losses.CircleLoss(m=0.4, gamma=80)),
    "lifted_structure": ("LiftedStructureLoss", {}, lambda: losses.LiftedStructureLoss(neg_margin=1, pos_margin=0)),
    "n_pairs": ("NPairsLoss", {}, lambda: losses.NPairsLoss()),
    "supcon": ("SupConLoss", {}, lambda: losses.SupConLoss(temperature=0.1)),
    "ntxent": ("NTXentLoss", {}, lambda: losses.NTXentLoss(temperature=0.07)),
}

# PML's ContrastiveLoss measures LpDistance with normalize_embeddings=True: it L2-normalises the embeddings
# itself, tfdml's ContrastiveLoss takes them as given (tfdml's embedders normalise). These entries (kept apart,
# under "normalizing_losses") are compared with tfdml's loss of l2_normalize(embeddings), value and gradient.
NORMALIZING_LOSSES = {
    "contrastive": ("ContrastiveLoss", {}, lambda: losses.ContrastiveLoss()),
    "contrastive_margins": (
        "ContrastiveLoss",
        {"pos_margin": 0.2, "neg_margin": 0.8},
        lambda: losses.ContrastiveLoss(pos_margin=0.2, neg_margin=0.8),
    ),
}

# name -> (tfdml class, tfdml arguments besides num_classes/embedding_dim, PML factory(num_classes, dim),
# name of PML's weight parameter, whether PML stores it transposed ([D, C]))
PROXY_LOSSES = {
    "proxy_anchor": (
        "ProxyAnchorLoss",
        {},
        lambda c, d: losses.ProxyAnchorLoss(c, d, margin=0.1, alpha=32),
        "proxies",
        False,
    ),
    "proxy_nca": ("ProxyNCALoss", {}, lambda c, d: losses.ProxyNCALoss(c, d, softmax_scale=1), "proxies", False),
    "normalized_softmax": (
        "NormalizedSoftmaxLoss",
        {},
        lambda c, d: losses.NormalizedSoftmaxLoss(c, d, temperature=0.05),
        "W",
        True,
    ),
    "arcface": ("ArcFaceLoss", {}, lambda c, d: losses.ArcFaceLoss(c, d, margin=28.6, scale=64), "W", True),
    "cosface": ("CosFaceLoss", {}, lambda c, d: losses.CosFaceLoss(c, d, margin=0.35, scale=64), "W", True),
}


def _with_miner(loss, miner):
    def call(embeddings, labels):
        return loss(embeddings, labels, miner(embeddings, labels))

    return call


def make_batches(seed=0):
    """Small float64 batches: unequal classes, class-balanced, all distinct, one class, near-duplicates."""
    rng = np.random.default_rng(seed)
    batches = {}

    def add(name, labels, embeddings, num_classes):
        # float32-representable: tfdml's proxies are a float32 variable (cast to the embeddings' float64).
        proxies = rng.normal(size=(num_classes, embeddings.shape[1])).astype(np.float32).astype(np.float64)
        batches[name] = {
            "labels": np.asarray(labels, np.int64),
            "embeddings": embeddings,
            "proxies": proxies,
            "num_classes": num_classes,
        }

    labels = rng.integers(0, 4, size=12)
    labels[:2] = 0
    add("unequal_classes", labels, rng.normal(size=(12, 6)), 5)  # class 4 of 5 absent
    labels = np.repeat(np.arange(4), 4)
    rng.shuffle(labels)
    add("class_balanced", labels, rng.normal(size=(16, 6)) * 0.5, 4)
    add("all_distinct", np.arange(6), rng.normal(size=(6, 6)), 6)
    add("one_class", np.zeros(6, np.int64), rng.normal(size=(6, 6)), 3)
    centres = rng.normal(size=(3, 6))
    labels = np.array([0, 0, 1, 1, 2, 2, 0, 1])
    add("near_duplicates", labels, centres[labels] + 0.05 * rng.normal(size=(8, 6)), 3)
    return batches


def pml_pair_value_and_grad(make_loss, labels, embeddings):
    x = torch.tensor(embeddings, dtype=torch.float64, requires_grad=True)
    value = make_loss()(x, torch.tensor(labels))
    value.backward()
    grad = x.grad if x.grad is not None else torch.zeros_like(x)
    return float(value.detach()), grad.numpy()


def pml_proxy_value_and_grad(make_loss, weight_name, transposed, labels, embeddings, proxies):
    loss = make_loss(proxies.shape[0], proxies.shape[1]).double()
    weight = getattr(loss, weight_name)
    with torch.no_grad():
        weight.copy_(torch.tensor(proxies.T if transposed else proxies, dtype=torch.float64))
    x = torch.tensor(embeddings, dtype=torch.float64, requires_grad=True)
    value = loss(x, torch.tensor(labels))
    value.backward()
    weight_grad = weight.grad.numpy()
    return float(value.detach()), x.grad.numpy(), (weight_grad.T if transposed else weight_grad)


def _round(array):
    return np.asarray(array, np.float64).round(15).tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    torch.manual_seed(0)
    batches = make_batches()
    out = {
        "pml_version": pytorch_metric_learning.__version__,
        "torch_version": torch.__version__,
        "dtype": "float64",
        "batches": {
            name: {
                "labels": b["labels"].tolist(),
                "embeddings": _round(b["embeddings"]),
                "proxies": _round(b["proxies"]),
                "num_classes": b["num_classes"],
            }
            for name, b in batches.items()
        },
        "losses": {},
    }
    for key, table in (("losses", PAIR_LOSSES), ("normalizing_losses", NORMALIZING_LOSSES)):
        out.setdefault(key, {})
        for name, (tfdml_class, tfdml_args, make_loss) in table.items():
            cases = {}
            for batch_name, batch in batches.items():
                value, grad = pml_pair_value_and_grad(make_loss, batch["labels"], batch["embeddings"])
                cases[batch_name] = {"value": value, "grad_embeddings": _round(grad)}
            out[key][name] = {"tfdml": tfdml_class, "args": tfdml_args, "proxies": False, "cases": cases}
    for name, (tfdml_class, tfdml_args, make_loss, weight_name, transposed) in PROXY_LOSSES.items():
        cases = {}
        for batch_name, batch in batches.items():
            value, grad, proxy_grad = pml_proxy_value_and_grad(
                make_loss, weight_name, transposed, batch["labels"], batch["embeddings"], batch["proxies"]
            )
            cases[batch_name] = {"value": value, "grad_embeddings": _round(grad), "grad_proxies": _round(proxy_grad)}
        out["losses"][name] = {"tfdml": tfdml_class, "args": tfdml_args, "proxies": True, "cases": cases}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
