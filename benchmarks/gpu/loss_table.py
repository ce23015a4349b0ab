"""The losses this benchmark measures, each with its pytorch-metric-learning (PML) counterpart, and their inputs.

The pairs are those of `benchmarks/losses/bench_losses.py` (`LOSSES` and `PORTED`) and of the PML reference
tests: the same tfdml arguments, the same PML class and options. That module imports TensorFlow at its top, which
the GPU machine does not have, so the pairs are restated here (the test of this benchmark checks that the PML
descriptions still match where both name a loss). Group Loss has no PML counterpart and is timed on tfdml alone.
"""

import dataclasses
from collections.abc import Callable

import numpy as np

SAMPLES_PER_CLASS = 4


@dataclasses.dataclass(frozen=True)
class LossCase:
    """One loss: how to build it in tfdml and in PML, and what its input is.

    `make_tfdml(num_classes, dim)` and `make_peer(num_classes, dim)` build the two losses; `peer` describes the PML
    side (None: PML has no such loss). `peer_proxies` names the PML attribute holding the proxies, which are copied
    from tfdml's so that both compute the same value (`peer_transposed`: PML stores them as [D, C]). `with_logits`:
    the loss reads `concat([embeddings, logits])` (Group Loss). `clustered`: timed on a mid-training-like batch.
    """

    name: str
    label: str
    make_tfdml: Callable
    peer: str | None = None
    make_peer: Callable | None = None
    peer_proxies: str | None = None
    peer_transposed: bool = False
    with_logits: bool = False
    clustered: bool = False


def _pml_with_miner(loss, miner):
    def call(embeddings, labels):
        return loss(embeddings, labels, miner(embeddings, labels))

    return call


def _tuple_cases(tl, pml):
    """Triplet (all, semi-hard), margin and contrastive: the tuple losses."""
    return [
        LossCase(
            "triplet_all",
            "Triplet, all triplets",
            lambda c, d: tl.TripletLoss(margin=0.2, mining="all"),
            "TripletMarginLoss(margin=0.2), all triplets",
            lambda c, d: pml()[0].TripletMarginLoss(margin=0.2),
        ),
        LossCase(
            "triplet_semi_hard",
            "Triplet, semi-hard",
            lambda c, d: tl.TripletLoss(margin=0.2, mining="semi_hard"),
            "TripletMarginLoss(margin=0.2) + TripletMarginMiner(0.2, 'semihard')",
            lambda c, d: _pml_with_miner(
                pml()[0].TripletMarginLoss(margin=0.2), pml()[1].TripletMarginMiner(0.2, type_of_triplets="semihard")
            ),
        ),
        LossCase(
            "margin",
            "Margin (all triplets, fixed beta)",
            lambda c, d: tl.MarginLoss(alpha=0.2, beta=1.2, learn_beta=False, sampling="all"),
            "MarginLoss(margin=0.2, beta=1.2), all triplets",
            lambda c, d: pml()[0].MarginLoss(margin=0.2, beta=1.2),
        ),
        LossCase(
            "contrastive",
            "Contrastive",
            lambda c, d: tl.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0),
            "ContrastiveLoss(pos_margin=0, neg_margin=1)",
            lambda c, d: pml()[0].ContrastiveLoss(pos_margin=0.0, neg_margin=1.0),
        ),
    ]


def _cases():
    # tfdml and PML load lazily, so that `--no-peer` runs without torch and listing the cases imports nothing.
    import tfdml.losses as tl

    def pml():
        from pytorch_metric_learning import losses, miners

        return losses, miners

    return [
        LossCase(
            "ranked_list",
            "Ranked List (uniform query weights)",
            lambda c, d: tl.RankedListLoss(margin=0.4, tn=10.0, query_weighting="uniform"),
            "RankedListLoss(margin=0.4, Tn=10)",
            lambda c, d: pml()[0].RankedListLoss(margin=0.4, Tn=10),
            clustered=True,
        ),
        LossCase("group", "Group Loss", lambda c, d: tl.GroupLoss(c), with_logits=True),
        *_tuple_cases(tl, pml),
        LossCase(
            "multi_similarity",
            "Multi-Similarity (+ mining)",
            lambda c, d: tl.MultiSimilarityLoss(mining_epsilon=0.1),
            "MultiSimilarityLoss() + MultiSimilarityMiner(0.1)",
            lambda c, d: _pml_with_miner(pml()[0].MultiSimilarityLoss(), pml()[1].MultiSimilarityMiner(0.1)),
        ),
        LossCase(
            "proxy_anchor",
            "Proxy-Anchor",
            lambda c, d: tl.ProxyAnchorLoss(c, d),
            "ProxyAnchorLoss(margin=0.1, alpha=32)",
            lambda c, d: pml()[0].ProxyAnchorLoss(c, d),
            peer_proxies="proxies",
        ),
    ]


def cases(names=None):
    """The loss cases, in table order; `names` (an iterable of case names) selects some."""
    table = _cases()
    assert tuple(case.name for case in table) == CASE_NAMES, "CASE_NAMES lists the cases in table order"
    if names is None:
        return table
    known = {case.name: case for case in table}
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown losses {unknown}; choose from {list(known)}")
    return [known[name] for name in names]


CASE_NAMES = (
    "ranked_list",
    "group",
    "triplet_all",
    "triplet_semi_hard",
    "margin",
    "contrastive",
    "multi_similarity",
    "proxy_anchor",
)


def class_balanced_labels(batch_size, rng, num_classes=None):
    """`batch_size / 4` classes of 4 samples each, shuffled; the classes drawn from `num_classes` when given."""
    per_batch = -(-batch_size // SAMPLES_PER_CLASS)
    classes = np.arange(per_batch) if num_classes is None else rng.choice(num_classes, per_batch, replace=False)
    labels = np.repeat(classes, SAMPLES_PER_CLASS)[:batch_size]
    rng.shuffle(labels)
    return labels.astype(np.int32)


def make_batch(batch_size, dim, seed=0, clustered=False):
    """Class-balanced labels and L2-normalised float32 embeddings, as `benchmarks/losses/bench_losses.py` makes them.

    `clustered`: class centres in a random 16-D subspace plus isotropic noise, so that every query has close
    negatives and far positives at different distances (Ranked List mines both sets, as in training; on uniform
    512-D vectors all points lie about sqrt(2) apart and it mines no negative at all)."""
    rng = np.random.default_rng(seed)
    labels = class_balanced_labels(batch_size, rng)
    if clustered:
        basis = np.linalg.qr(rng.normal(size=(dim, min(16, dim))))[0]
        centres = rng.normal(size=(labels.max() + 1, basis.shape[1])) @ basis.T
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
        embeddings = (centres[labels] + 0.75 * rng.normal(size=(batch_size, dim)) / np.sqrt(dim)).astype(np.float32)
    else:
        embeddings = rng.normal(size=(batch_size, dim)).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return labels, embeddings


def loss_inputs(case, batch_size, dim, seed=0):
    """`(labels, inputs, num_classes)` for one loss call: the embeddings, with random logits appended for Group Loss."""
    labels, embeddings = make_batch(batch_size, dim, seed=seed, clustered=case.clustered)
    num_classes = int(labels.max()) + 1
    if case.with_logits:
        logits = np.random.default_rng(seed + 1).normal(size=(batch_size, num_classes)).astype(np.float32)
        embeddings = np.concatenate([embeddings, logits], axis=1)
    return labels, embeddings, num_classes
