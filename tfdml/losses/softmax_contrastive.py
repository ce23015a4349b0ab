"""Softmax (cross-entropy) losses over the pairs of a batch, with pytorch-metric-learning's (PML 2.9) default
semantics: N-pair (Sohn 2016), supervised contrastive SupCon (Khosla et al. 2020) and NT-Xent / InfoNCE
(Chen et al. 2020, SimCLR) with class labels.

With `S` the `[B, B]` cosine similarity matrix, `P_i` the positives of anchor `i` (same class, `j != i`) and
`N_i` its negatives:

    n-pairs  one anchor per class (its first sample) and one positive (the class' second sample);
             l_a = -log softmax_p(S_ap)[p(a)] over the chosen positives of all classes;  L = mean_a l_a
    supcon   l_i = -1/|P_i| sum_{P_i} log(exp(S_ij / t) / sum_{k != i} exp(S_ik / t));
             L = mean of l_i over the anchors with a non-zero loss (0 without a positive or negative pair)
    nt-xent  l_ij = -log(exp(S_ij / t) / (exp(S_ij / t) + sum_{N_i} exp(S_ik / t)));  L = mean over (i, j) in P

All are O(B^2): the per-pair softmax denominators of NT-Xent are one logsumexp per row.
"""

import keras
from keras import ops

from tfdml.losses.arguments import DECLARED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.ops import (
    as_scalar,
    l2_normalize,
    masked_logsumexp,
    mean_of_positive,
    pair_masks,
    pairwise_cosine_similarity,
    reference_embeddings,
    safe_divide,
    same_label_mask,
    validate_inputs,
)


def n_pairs_indices(labels):
    """PML's N-pair tuples as static `[B]` arrays: `(is_anchor bool, positive_index int32)`.

    Each class with at least two samples contributes its first sample (lowest index) as anchor and its second
    as that anchor's positive, in the order of the anchors' positions. `positive_index[i]` is the second
    sample of `i`'s class (`i`'s own index where the class has one sample, then `i` is no anchor). O(B^2)
    booleans, O(B) otherwise.
    """
    positions = ops.cumsum(ops.ones_like(labels, dtype="int32")) - 1
    same = same_label_mask(labels)
    earlier = positions[None, :] < positions[:, None]  # [i, j]: j before i
    rank = ops.sum(ops.cast(same & earlier, "int32"), axis=1)  # rank of i within its class
    is_second = rank == 1
    # The second sample of each sample's class (argmax returns the first maximum, so any index if none).
    second = ops.cast(ops.argmax(ops.cast(same & is_second[None, :], "int32"), axis=1), "int32")
    has_second = ops.any(same & is_second[None, :], axis=1)
    is_anchor = (rank == 0) & has_second
    return is_anchor, ops.where(has_second, second, positions)


def _n_pairs_loss(labels, embeddings, normalize):
    # Every sample's row against every sample's class positive ([B, B]); only the anchors' rows and columns
    # enter the loss. The positives are gathered by a one-hot matmul, whose gradient is dense.
    is_anchor, positive_index = n_pairs_indices(labels)
    dtype = embeddings.dtype
    positive_rows = ops.matmul(ops.one_hot(positive_index, ops.shape(labels)[0], dtype=dtype), embeddings)
    anchor_rows = embeddings
    if normalize:
        anchor_rows, positive_rows = l2_normalize(anchor_rows), l2_normalize(positive_rows)
    logits = ops.matmul(anchor_rows, ops.transpose(positive_rows))
    both = is_anchor[:, None] & is_anchor[None, :]
    # Cross-entropy with the diagonal as targets, over the anchors' columns (a masked logsumexp).
    target = ops.diagonal(logits)
    per_anchor = masked_logsumexp(logits, both, axis=1) - target
    anchors = ops.cast(is_anchor, dtype)
    return safe_divide(ops.sum(per_anchor * anchors), ops.sum(anchors))


@defaults_from("NPairsLoss")
def n_pairs_loss(labels, embeddings, normalize=DECLARED):
    """N-pair loss (Sohn 2016) with PML's tuple choice; see the module docstring.

    The default is that of `NPairsLoss`'s declaration (`NPairsLoss.ARGUMENTS`).

    Args:
        normalize: True (PML's default `DotProductSimilarity`, which L2-normalises: cosine similarities);
            False for the paper's plain inner products of unnormalised embeddings (the paper adds an L2
            penalty on the embeddings, not included here).

    Returns:
        Scalar loss: mean cross-entropy over the anchors (0 when no class has two samples).
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _n_pairs_loss(labels, embeddings, normalize)


def _scaled_cosines(labels, embeddings, temperature, references=None):
    """`(logits, positives, negatives)`: the cosine similarities of the anchors with the batch (or the
    references) divided by `temperature`, and the positive and negative pair masks."""
    logits = pairwise_cosine_similarity(embeddings, reference_embeddings(references)) / as_scalar(
        temperature, embeddings.dtype
    )
    return (logits, *pair_masks(labels, references))


def _supcon_loss(labels, embeddings, temperature, references=None):
    logits, positives, negatives = _scaled_cosines(labels, embeddings, temperature, references)
    log_prob = logits - masked_logsumexp(logits, positives | negatives, axis=1, keepdims=True)
    positives_f = ops.cast(positives, logits.dtype)
    per_anchor = -safe_divide(ops.sum(log_prob * positives_f, axis=1), ops.sum(positives_f, axis=1))
    # PML: 0 for a batch without a positive or without a negative pair, else AvgNonZeroReducer.
    complete = ops.cast(ops.any(positives) & ops.any(negatives), logits.dtype)
    return complete * mean_of_positive(per_anchor)


@defaults_from("SupConLoss")
def supcon_loss(labels, embeddings, temperature=DECLARED):
    """Supervised contrastive loss (Khosla et al. 2020, "L_out") on cosine similarities; see the module docstring.

    Returns:
        Scalar loss: mean over the anchors with a non-zero loss (PML's `AvgNonZeroReducer`).
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _supcon_loss(labels, embeddings, temperature)


def _ntxent_loss(labels, embeddings, temperature, references=None):
    logits, positives, negatives = _scaled_cosines(labels, embeddings, temperature, references)
    has_negative = ops.any(negatives, axis=1, keepdims=True)
    negative_lse = masked_logsumexp(logits, negatives, axis=1, keepdims=True)
    # -log(e^s / (e^s + e^r)) = softplus(r - s), with r the logsumexp of the anchor's negatives.
    per_pair = ops.where(positives & has_negative, ops.softplus(negative_lse - logits), 0.0)
    return safe_divide(ops.sum(per_pair), ops.sum(ops.cast(positives, logits.dtype)))


@defaults_from("NTXentLoss")
def ntxent_loss(labels, embeddings, temperature=DECLARED):
    """NT-Xent / InfoNCE loss with class labels (every same-class pair is a positive pair) on cosine
    similarities; see the module docstring.

    Returns:
        Scalar loss: mean over the ordered positive pairs (PML's `MeanReducer`).
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _ntxent_loss(labels, embeddings, temperature)


def _temperature(default):
    """The one argument of SupCon and NT-Xent, with its range (that of the configuration's `loss.params`)."""
    return Argument("temperature", default, "softmax temperature", above=0.0, maximum=1e4)


class _TemperatureLoss(MetricLoss):
    """A declared loss (`tfdml.losses.arguments`) whose one argument is a softmax temperature; subclasses set
    `ARGUMENTS = (_temperature(default),)`, `DEFAULT_NAME` and `loss_fn`."""

    supports_references = True

    def compute(self, labels, embeddings, references=None):
        return type(self).loss_fn(labels, embeddings, self.temperature, references)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class NPairsLoss(MetricLoss):
    """N-pair loss (Sohn 2016), as PML's `NPairsLoss()`: one (anchor, positive) pair per class, cross-entropy of
    each anchor against the positives of all classes. See `n_pairs_loss`.

    Args (default in `ARGUMENTS`, also the configuration's `loss.params`):
        normalize: cosine similarities (True, PML's default) or plain inner products (False, the paper).
        name: loss name.
    """

    DEFAULT_NAME = "n_pairs_loss"
    ARGUMENTS = (Argument("normalize", True, "cosine similarities (else plain inner products)"),)

    def compute(self, labels, embeddings):
        return _n_pairs_loss(labels, embeddings, self.normalize)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class SupConLoss(_TemperatureLoss):
    """Supervised contrastive loss (Khosla et al. 2020), as PML's `SupConLoss(temperature)`.

    `l_i = -1/|P_i| sum_{j in P_i} log(exp(S_ij / t) / sum_{k != i} exp(S_ik / t))`, `L` = mean of the non-zero
    `l_i` (cosine similarities `S`).

    Args (default and range in `ARGUMENTS`, also the configuration's `loss.params`):
        temperature: softmax temperature (0.1).
        name: loss name.
    """

    DEFAULT_NAME = "supcon_loss"
    ARGUMENTS = (_temperature(0.1),)
    loss_fn = staticmethod(_supcon_loss)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class NTXentLoss(_TemperatureLoss):
    """NT-Xent / InfoNCE (SimCLR) with class labels, as PML's `NTXentLoss(temperature)`.

    `l_ij = -log(exp(S_ij / t) / (exp(S_ij / t) + sum_{k in N_i} exp(S_ik / t)))` for every positive pair,
    `L` = their mean (cosine similarities `S`). For SimCLR, label the two views of an image with the same id.

    Args (default and range in `ARGUMENTS`, also the configuration's `loss.params`):
        temperature: softmax temperature (0.07).
        name: loss name.
    """

    DEFAULT_NAME = "ntxent_loss"
    ARGUMENTS = (_temperature(0.07),)
    loss_fn = staticmethod(_ntxent_loss)
