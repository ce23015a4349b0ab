"""Writes pytorch-metric-learning's `CrossBatchMemory` values and gradients around several losses, on one fixed
sequence of batches, to `tests/references/xbm_reference.json`;
`tests/losses/test_cross_batch_memory.py` reads it (the tests
do not need torch).

For each loss, a fresh `CrossBatchMemory(loss, embedding_size=D, memory_size=M)` is called on the same float64
batches in order (batch sizes vary, so the ring buffer wraps at different offsets); the file holds each call's
value and gradient with respect to that batch's embeddings, and the queue (labels, embeddings, next index)
after the last call. PML's losses use a Euclidean distance without normalisation
(`LpDistance(normalize_embeddings=False)`) where tfdml's counterpart computes distances of the embeddings as
given (contrastive, triplet, margin); the cosine losses normalise on both sides. Multi-Similarity with the
paper's mining is PML's `CrossBatchMemory(..., miner=MultiSimilarityMiner(epsilon))`, as tfdml's
`MultiSimilarityLoss(mining_epsilon=...)` mines inside the loss.

Needs the bench extra (torch, pytorch-metric-learning 2.9):
    python tests/references/generators/xbm_reference.py [--output tests/references/xbm_reference.json]
"""

import argparse
import json
import os

import numpy as np
import pytorch_metric_learning
import torch
from pytorch_metric_learning import losses, miners
from pytorch_metric_learning.distances import LpDistance

DEFAULT_OUTPUT = os.path.join(os.path.dirname(__file__), "..", "xbm_reference.json")
MEMORY_SIZE = 20
EMBEDDING_DIM = 5
NUM_CLASSES = 4
BATCH_SIZES = (8, 8, 6, 8, 4, 8)


def _euclidean():
    return LpDistance(normalize_embeddings=False)


# name -> (tfdml class, tfdml arguments, factory of (PML loss, PML miner or None))
LOSSES = {
    "contrastive": (
        "ContrastiveLoss",
        {"pos_margin": 0.0, "neg_margin": 1.0},
        lambda: (losses.ContrastiveLoss(pos_margin=0, neg_margin=1, distance=_euclidean()), None),
    ),
    "triplet_all": (
        "TripletLoss",
        {"margin": 0.2, "mining": "all"},
        lambda: (losses.TripletMarginLoss(margin=0.2, triplets_per_anchor="all", distance=_euclidean()), None),
    ),
    # beta 1.25: PML holds beta in a float32 tensor, 1.2 would differ from tfdml's float64 1.2 by 5e-8.
    "margin_all_triplets": (
        "MarginLoss",
        {"sampling": "all", "learn_beta": False, "alpha": 0.2, "beta": 1.25},
        lambda: (
            losses.MarginLoss(margin=0.2, beta=1.25, nu=0, triplets_per_anchor="all", distance=_euclidean()),
            None,
        ),
    ),
    "multi_similarity_mined": (
        "MultiSimilarityLoss",
        {},
        lambda: (losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5), miners.MultiSimilarityMiner(epsilon=0.1)),
    ),
    "multi_similarity_all_pairs": (
        "MultiSimilarityLoss",
        {"mining_epsilon": None},
        lambda: (losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5), None),
    ),
    "circle": ("CircleLoss", {}, lambda: (losses.CircleLoss(m=0.4, gamma=80), None)),
    "supcon": ("SupConLoss", {}, lambda: (losses.SupConLoss(temperature=0.1), None)),
    "ntxent": ("NTXentLoss", {}, lambda: (losses.NTXentLoss(temperature=0.07), None)),
}


def make_batches(seed=0):
    """float64 batches of roughly unit-norm embeddings (distances straddle the margins), 4 classes."""
    rng = np.random.default_rng(seed)
    batches = []
    for size in BATCH_SIZES:
        labels = rng.integers(0, NUM_CLASSES, size=size)
        labels[:2] = labels[0]  # at least one positive pair in every batch
        embeddings = rng.normal(size=(size, EMBEDDING_DIM)) / np.sqrt(EMBEDDING_DIM)
        batches.append({"labels": labels.astype(np.int64), "embeddings": embeddings})
    return batches


def run_sequence(make_loss, batches):
    loss, miner = make_loss()
    xbm = losses.CrossBatchMemory(loss, embedding_size=EMBEDDING_DIM, memory_size=MEMORY_SIZE, miner=miner)
    steps = []
    for batch in batches:
        x = torch.tensor(batch["embeddings"], dtype=torch.float64, requires_grad=True)
        value = xbm(x, torch.tensor(batch["labels"]))
        value.backward()
        grad = x.grad if x.grad is not None else torch.zeros_like(x)
        steps.append({"value": float(value.detach()), "grad_embeddings": _round(grad.numpy())})
    queue = {
        "labels": xbm.label_memory.numpy().tolist(),
        "embeddings": _round(xbm.embedding_memory.numpy()),
        "queue_idx": int(xbm.queue_idx),
        "has_been_filled": bool(xbm.has_been_filled),
    }
    return steps, queue


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
        "memory_size": MEMORY_SIZE,
        "embedding_dim": EMBEDDING_DIM,
        "batches": [{"labels": b["labels"].tolist(), "embeddings": _round(b["embeddings"])} for b in batches],
        "losses": {},
    }
    for name, (tfdml_class, tfdml_args, make_loss) in LOSSES.items():
        steps, queue = run_sequence(make_loss, batches)
        out["losses"][name] = {"tfdml": tfdml_class, "args": tfdml_args, "steps": steps, "queue": queue}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
