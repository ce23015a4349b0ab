"""Contrastive loss in pytorch-metric-learning's form (`losses.ContrastiveLoss` with its default Euclidean
distance): NON-squared hinges on the distance, a positive margin, and means over the active pairs.

This is not the formula of Hadsell, Chopra and LeCun 2006, which uses squared terms,
`1/2 d^2` for a positive pair and `1/2 [m - d]+^2` for a negative pair, summed over all pairs. The
non-squared form with `pos_margin` is the one of pytorch-metric-learning and of the comparisons built on it
(Musgrave et al. 2020, "A Metric Learning Reality Check"). Over all ordered pairs
`(i, j)`, `i != j`, of the batch:

    pos_ij = [d_ij - pos_margin]+   for y_i == y_j
    neg_ij = [neg_margin - d_ij]+   for y_i != y_j
    L = mean of the non-zero pos_ij + mean of the non-zero neg_ij

Each mean runs over its non-zero ("active") terms only and is 0 when none is active (PML's
`AvgNonZeroReducer`), so easy pairs do not dilute the loss.
"""

import keras
from keras import ops

from tfdml.loss_names import TUPLE_KINDS
from tfdml.losses.arguments import DECLARED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.ops import (
    DISTANCES,
    TupleTerms,
    as_scalar,
    distance_matrix,
    mean_of_positive,
    pair_masks,
    reference_embeddings,
    upper_pair_mask,
    validate_inputs,
)


def contrastive_terms(labels, embeddings, pos_margin, neg_margin, references=None, distance="euclidean"):
    """The contrastive loss's terms, written once: dense `[B, G]` pair terms, `[d - pos_margin]+` for a
    positive pair (group 0) and `[neg_margin - d]+` for a negative pair (group 1), each group a mean over its
    non-zero terms. Within a batch the unordered pairs `i < j` (the mean over ordered pairs counts each pair
    twice, in the sum and in the count); with references every query-reference pair. `reduce_terms` of them
    is `contrastive_loss` (`contrastive_fast_path` computes it without them)."""
    dist = distance_matrix(distance, embeddings, reference_embeddings(references))
    positives, negatives = pair_masks(labels, references)
    if references is None:
        upper = upper_pair_mask(ops.shape(labels)[0])
        positives, negatives = ops.logical_and(positives, upper), ops.logical_and(negatives, upper)
    pos_terms = ops.relu(dist - as_scalar(pos_margin, dist.dtype))
    neg_terms = ops.relu(as_scalar(neg_margin, dist.dtype) - dist)
    values = ops.where(positives, pos_terms, ops.where(negatives, neg_terms, ops.zeros_like(dist)))
    groups = ops.where(positives, 0, 1)
    valid = ops.logical_or(positives, negatives)
    return TupleTerms(values, None, "pair", "mean_active", groups=groups, num_groups=2, valid=valid)


def contrastive_fast_path(labels, embeddings, pos_margin, neg_margin, references=None, distance="euclidean"):
    """`reduce_terms(contrastive_terms(...))` without the terms' bookkeeping (groups, divisors, weights): the
    two means of the active hinges over the ordered pairs, each unordered pair counted twice in the sum and
    in the count (the same means)."""
    dist = distance_matrix(distance, embeddings, reference_embeddings(references))
    positives, negatives = pair_masks(labels, references)
    zeros = ops.zeros_like(dist)
    pos_terms = ops.where(positives, ops.relu(dist - as_scalar(pos_margin, dist.dtype)), zeros)
    neg_terms = ops.where(negatives, ops.relu(as_scalar(neg_margin, dist.dtype) - dist), zeros)
    return mean_of_positive(pos_terms) + mean_of_positive(neg_terms)


@defaults_from("ContrastiveLoss")
def contrastive_loss(labels, embeddings, pos_margin=DECLARED, neg_margin=DECLARED, distance=DECLARED):
    """Contrastive loss of a batch: mean active `[d - pos_margin]+` + mean active `[neg_margin - d]+`.

    The defaults are those of `ContrastiveLoss`'s declaration (`ContrastiveLoss.ARGUMENTS`).

    Args:
        labels: integer class ids `[B]`.
        embeddings: float `[B, D]`.
        pos_margin: positive pairs are pulled until their distance is at most this.
        neg_margin: negative pairs are pushed until their distance is at least this.
        distance: `"euclidean"` (the declared default), `"squared_euclidean"`, `"cosine"` or a callable
            `(embeddings, gallery) -> [B, G]` distances (`tfdml.ops.distance_matrix`).

    Returns:
        Scalar loss; 0 when no pair is active.
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return contrastive_fast_path(labels, embeddings, pos_margin, neg_margin, distance=distance)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class ContrastiveLoss(MetricLoss):
    """Contrastive loss, `L = mean_{active} [d_ap - pos_margin]+ + mean_{active} [neg_margin - d_an]+`.

    Same semantics and defaults as `pytorch_metric_learning.losses.ContrastiveLoss` with its Euclidean
    distance (see `contrastive_loss`): non-squared hinges, unlike Hadsell et al. 2006's squared
    `1/2 d^2` / `1/2 [m - d]+^2` terms.

    Backends: TensorFlow, JAX and PyTorch (written in `keras.ops`).

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        pos_margin: distance below which positive pairs cost nothing.
        neg_margin: distance above which negative pairs cost nothing.
        distance: `"euclidean"`, `"squared_euclidean"` or `"cosine"` (`tfdml.ops.DISTANCES`).
        name: loss name.

    Example:
        >>> loss = ContrastiveLoss(pos_margin=0.0, neg_margin=1.0)
        >>> model.compile(optimizer="adam", loss=loss)
    """

    DEFAULT_NAME = "contrastive_loss"
    ARGUMENTS = (
        # distances between unit vectors are at most 2
        Argument("pos_margin", 0.0, "pull positive pairs to at most this distance", minimum=0.0, maximum=4.0),
        Argument("neg_margin", 1.0, "push negative pairs to at least this distance", minimum=0.0, maximum=4.0),
        Argument("distance", "euclidean", "the pairs' distance (tfdml.ops.DISTANCES)", choices=tuple(DISTANCES)),
    )

    # `terms` lists pairs (`tfdml.ops.TupleTerms.kind`).
    tuple_kind = TUPLE_KINDS["contrastive"]
    supports_references = True

    def compute(self, labels, embeddings, references=None):
        return contrastive_fast_path(
            labels, embeddings, self.pos_margin, self.neg_margin, references, distance=self.distance
        )

    def dense_terms(self, labels, embeddings, references=None):
        """The dense pair terms (`contrastive_terms`)."""
        return contrastive_terms(
            labels, embeddings, self.pos_margin, self.neg_margin, references, distance=self.distance
        )

    def terms(self, labels, embeddings):
        """The unreduced pair terms, listed; `tfdml.ops.reduce_terms` gives `compute`'s value."""
        return self.dense_terms(labels, embeddings).listed()
