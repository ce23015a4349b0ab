"""Pair-weighting losses on cosine similarities or distances of all pairs of a batch, with
pytorch-metric-learning's (PML 2.9) default semantics: Multi-Similarity (Wang et al. 2019), Circle (Sun et al.
2020) and Lifted Structure (Oh Song et al. 2016).

With `S` the `[B, B]` cosine similarity matrix, `P_i` the positives of anchor `i` (same class, `j != i`) and
`N_i` its negatives:

    multi-similarity  l_i = 1/alpha log(1 + sum_{P_i} exp(-alpha (S_ij - base)))
                          + 1/beta  log(1 + sum_{N_i} exp( beta (S_ij - base))),      L = mean_i l_i
    circle            l_i = softplus(logsumexp_{P_i} -gamma a_ij (S_ij - 1 + m)
                                     + logsumexp_{N_i}  gamma a_ij (S_ij - m)),
                      a_ij = [1 + m - S_ij]+ (positives), [S_ij + m]+ (negatives), as constants;
                      L = mean of l_i over the anchors with both positives and negatives
    lifted structure  J_ij = log(sum_{N_i} exp(neg_margin - D_ik) + sum_{N_j} exp(neg_margin - D_jl))
                             + D_ij - pos_margin,   L = mean over positive pairs of [J_ij]+^2 / 2

(`D` the Euclidean distance of L2-normalised embeddings). Each is O(B^2) in memory: the lifted structure's
sum over the negatives of both ends is a per-row logsumexp combined pairwise.
"""

import keras
from keras import ops

from tfdml.losses.arguments import DECLARED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.losses.portable import lowest, mean
from tfdml.ops import (
    DISTANCES,
    as_scalar,
    distance_matrix,
    distance_name,
    l2_normalize,
    masked_logsumexp,
    masked_max,
    masked_min,
    mean_of_positive,
    negative_mask,
    pair_masks,
    pairwise_cosine_similarity,
    positive_mask,
    reference_embeddings,
    safe_divide,
    validate_inputs,
)


def multi_similarity_mining(similarity, positives, negatives, epsilon=0.1):
    """The Multi-Similarity paper's pair mining (PML's `MultiSimilarityMiner(epsilon)`), as two `[B, B]` masks.

    A positive pair `(i, j)` is kept when `S_ij - epsilon < max_{k in N_i} S_ik` (harder than the hardest
    negative plus epsilon), a negative pair `(i, k)` when `S_ik + epsilon > min_{j in P_i} S_ij`. An anchor
    without positives or without negatives keeps no pair. The masks carry no gradient.
    """
    similarity = ops.stop_gradient(similarity)
    epsilon = as_scalar(epsilon, similarity.dtype)
    has_pos = ops.any(positives, axis=1, keepdims=True)
    has_neg = ops.any(negatives, axis=1, keepdims=True)
    hardest_neg = masked_max(similarity, negatives, axis=1, keepdims=True)
    hardest_pos = masked_min(similarity, positives, axis=1, keepdims=True)
    mined_pos = positives & has_neg & (similarity - epsilon < hardest_neg)
    mined_neg = negatives & has_pos & (similarity + epsilon > hardest_pos)
    return mined_pos, mined_neg


def _multi_similarity_loss(labels, embeddings, alpha, beta, base, mining_epsilon, references=None):
    sim = pairwise_cosine_similarity(embeddings, reference_embeddings(references))
    dtype = sim.dtype
    positives, negatives = pair_masks(labels, references)
    if mining_epsilon is not None:
        if references is None:
            positives, negatives = multi_similarity_mining(sim, positives, negatives, mining_epsilon)
        else:
            # As pytorch-metric-learning's CrossBatchMemory: the miner sees each query's own stored copy as
            # a positive (similarity ~1); that pair is dropped after mining.
            with_self, _ = pair_masks(labels, references, include_self=True)
            mined_pos, negatives = multi_similarity_mining(sim, with_self, negatives, mining_epsilon)
            positives = mined_pos & positives
    alpha, beta, base = (as_scalar(v, dtype) for v in (alpha, beta, base))
    pos_term = masked_logsumexp(-alpha * (sim - base), positives, axis=1, add_one=True) / alpha
    neg_term = masked_logsumexp(beta * (sim - base), negatives, axis=1, add_one=True) / beta
    return mean(pos_term + neg_term)


@defaults_from("MultiSimilarityLoss")
def multi_similarity_loss(labels, embeddings, alpha=DECLARED, beta=DECLARED, base=DECLARED, mining_epsilon=DECLARED):
    """Multi-Similarity loss (Wang et al. 2019) on cosine similarities; see the module docstring.

    The defaults are those of `MultiSimilarityLoss`'s declaration (`MultiSimilarityLoss.ARGUMENTS`).

    Args:
        labels: integer class ids `[B]`.
        embeddings: float `[B, D]` (L2-normalised inside, as PML's `CosineSimilarity`).
        alpha, beta: scales of the positive and negative terms.
        base: similarity margin `lambda`.
        mining_epsilon: the paper's pair mining with this epsilon (PML's `MultiSimilarityMiner`);
            `None` uses every pair (PML's `MultiSimilarityLoss` without a miner).

    Returns:
        Scalar loss: the mean over all anchors (PML's `MeanReducer`).
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _multi_similarity_loss(labels, embeddings, alpha, beta, base, mining_epsilon)


def _circle_loss(labels, embeddings, m, gamma, references=None):
    sim = pairwise_cosine_similarity(embeddings, reference_embeddings(references))
    dtype = sim.dtype
    positives, negatives = pair_masks(labels, references)
    m, gamma = as_scalar(m, dtype), as_scalar(gamma, dtype)
    const = ops.stop_gradient(sim)
    # Self-paced weights a_ij are constants (the paper and PML detach them).
    pos_logits = -gamma * ops.relu(1.0 + m - const) * (sim - (1.0 - m))
    neg_logits = gamma * ops.relu(const + m) * (sim - m)
    per_anchor = ops.softplus(
        masked_logsumexp(pos_logits, positives, axis=1) + masked_logsumexp(neg_logits, negatives, axis=1)
    )
    complete = ops.any(positives, axis=1) & ops.any(negatives, axis=1)
    # PML's AvgNonZeroReducer: the mean over the anchors whose loss is > 0.
    return mean_of_positive(ops.where(complete, per_anchor, 0.0))


@defaults_from("CircleLoss")
def circle_loss(labels, embeddings, m=DECLARED, gamma=DECLARED):
    """Circle loss (Sun et al. 2020) with pair labels on cosine similarities; see the module docstring.

    The defaults are those of `CircleLoss`'s declaration (`CircleLoss.ARGUMENTS`).

    Args:
        m: relaxation margin (by default the paper's fine-grained retrieval setting, PML's default).
        gamma: scale.

    Returns:
        Scalar loss: the mean over the anchors with a positive and a negative and a non-zero loss.
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _circle_loss(labels, embeddings, m, gamma)


def _pairwise_logaddexp_of_row_sums(values, mask):
    """`[B, B]` `log(sum_{mask_i} exp(values_i.) + sum_{mask_j} exp(values_j.))`, 0 where both rows are empty."""
    has_any = ops.any(mask, axis=1)
    row_lse = masked_logsumexp(values, mask, axis=1)  # 0 for an empty row, masked out below
    very_negative = lowest(row_lse.dtype)
    row_lse = ops.where(has_any, row_lse, very_negative)
    a, b = row_lse[:, None], row_lse[None, :]
    high = ops.maximum(a, b)
    low = ops.minimum(a, b)
    either = has_any[:, None] | has_any[None, :]
    # log(e^a + e^b) = high + log(1 + e^(low - high)); an empty row's very negative value adds e^-huge = 0.
    combined = high + ops.softplus(ops.where(either, low - high, 0.0))
    return ops.where(either, combined, 0.0)


def _lifted_structure_loss(labels, embeddings, neg_margin, pos_margin, distance="euclidean"):
    dist = distance_matrix(distance, l2_normalize(embeddings))
    dtype = dist.dtype
    positives, negatives = positive_mask(labels), negative_mask(labels)
    neg_part = _pairwise_logaddexp_of_row_sums(as_scalar(neg_margin, dtype) - dist, negatives)
    per_pair = ops.square(ops.relu(neg_part + dist - as_scalar(pos_margin, dtype))) / 2.0
    positives_f = ops.cast(positives, dtype)
    num_pairs = ops.sum(positives_f)
    # PML computes nothing (loss 0) for a batch without a positive or without a negative pair.
    has_negative = ops.cast(ops.any(negatives), dtype)
    return has_negative * safe_divide(ops.sum(per_pair * positives_f), num_pairs)


@defaults_from("LiftedStructureLoss")
def lifted_structure_loss(labels, embeddings, neg_margin=DECLARED, pos_margin=DECLARED, distance=DECLARED):
    """Lifted Structure loss (Oh Song et al. 2016) on distances of L2-normalised embeddings, Euclidean by
    default (PML's default `LpDistance`, which normalises); see the module docstring.

    The defaults are those of `LiftedStructureLoss`'s declaration (`LiftedStructureLoss.ARGUMENTS`).

    Args:
        neg_margin: `alpha` of the paper, the margin of the negative terms.
        pos_margin: subtracted from the positive distance.
        distance: `"euclidean"`, `"squared_euclidean"` or `"cosine"` (`tfdml.ops.DISTANCES`), of the
            L2-normalised embeddings.

    Returns:
        Scalar loss: the mean of `[J_ij]+^2 / 2` over the (ordered) positive pairs, which equals the paper's
        `1 / (2|P|) sum_{(i,j) in P} [J_ij]+^2` over unordered pairs.
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _lifted_structure_loss(labels, embeddings, neg_margin, pos_margin, distance_name(distance))


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class MultiSimilarityLoss(MetricLoss):
    """Multi-Similarity loss (Wang et al. 2019) with the paper's pair mining, as PML's
    `MultiSimilarityLoss(alpha, beta, base)` fed by `MultiSimilarityMiner(epsilon=mining_epsilon)`.

    `l_i = 1/alpha log(1 + sum_{P_i} exp(-alpha (S_ij - base))) + 1/beta log(1 + sum_{N_i} exp(beta (S_ij - base)))`
    over the mined pairs, `L = mean_i l_i` (cosine similarities `S`).

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        alpha: positive scale.
        beta: negative scale.
        base: similarity margin.
        mining_epsilon: epsilon of the pair mining; `None` for every pair (no miner).
        name: loss name.

    Example:
        >>> model.compile(optimizer="adam", loss=MultiSimilarityLoss())
    """

    DEFAULT_NAME = "multi_similarity_loss"
    ARGUMENTS = (
        Argument("alpha", 2.0, "scale of the positive term", above=0.0, maximum=1e4),
        Argument("beta", 50.0, "scale of the negative term", above=0.0, maximum=1e4),
        Argument("base", 0.5, "similarity margin lambda (a cosine similarity)", minimum=-1.0, maximum=1.0),
        Argument("mining_epsilon", 0.1, "epsilon of the pair mining (None: every pair)", minimum=0.0, maximum=2.0),
    )

    supports_references = True

    def compute(self, labels, embeddings, references=None):
        return _multi_similarity_loss(
            labels, embeddings, self.alpha, self.beta, self.base, self.mining_epsilon, references
        )


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class CircleLoss(MetricLoss):
    """Circle loss (Sun et al. 2020) with pair labels, as PML's `CircleLoss(m, gamma)`.

    `l_i = softplus(logsumexp_{P_i} -gamma a_ij (S_ij - 1 + m) + logsumexp_{N_i} gamma a_ij (S_ij - m))` with
    constant weights `a_ij = [1 + m - S_ij]+` (positives), `[S_ij + m]+` (negatives); `L` = mean over the
    anchors that have positives and negatives (cosine similarities `S`).

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        m: relaxation margin.
        gamma: scale.
        name: loss name.
    """

    DEFAULT_NAME = "circle_loss"
    ARGUMENTS = (
        Argument("m", 0.4, "relaxation margin", minimum=0.0, maximum=1.0),
        Argument("gamma", 80.0, "scale", above=0.0, maximum=1e4),
    )

    supports_references = True

    def compute(self, labels, embeddings, references=None):
        return _circle_loss(labels, embeddings, self.m, self.gamma, references)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class LiftedStructureLoss(MetricLoss):
    """Lifted Structure loss (Oh Song et al. 2016), as PML's `LiftedStructureLoss(neg_margin, pos_margin)`.

    `J_ij = log(sum_{N_i} exp(neg_margin - D_ik) + sum_{N_j} exp(neg_margin - D_jl)) + D_ij - pos_margin`,
    `L = mean over positive pairs of [J_ij]+^2 / 2` (Euclidean distances `D` of L2-normalised embeddings).

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        neg_margin: negative margin.
        pos_margin: positive margin.
        distance: `"euclidean"` (default), `"squared_euclidean"` or `"cosine"` of the normalised embeddings.
        name: loss name.
    """

    DEFAULT_NAME = "lifted_structure_loss"
    ARGUMENTS = (
        # distances between unit vectors are at most 2
        Argument("neg_margin", 1.0, "margin of the negative terms (the paper's alpha)", minimum=0.0, maximum=4.0),
        Argument("pos_margin", 0.0, "subtracted from the positive distance", minimum=0.0, maximum=4.0),
        Argument("distance", "euclidean", "the pairs' distance (tfdml.ops.DISTANCES)", choices=tuple(DISTANCES)),
    )

    def compute(self, labels, embeddings):
        return _lifted_structure_loss(labels, embeddings, self.neg_margin, self.pos_margin, self.distance)
