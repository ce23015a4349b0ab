"""Contrastive loss in pytorch-metric-learning's form (`losses.ContrastiveLoss` with its default Euclidean
distance): NON-squared hinges on the distance, a positive margin, and means over the active pairs.

This is not the formula of Hadsell, Chopra and LeCun 2006, which uses squared terms,
`1/2 d^2` for a positive pair and `1/2 [m - d]+^2` for a negative pair, summed over all pairs. The
non-squared form with `pos_margin` is the one of pytorch-metric-learning and of the benchmarks built on it
(Musgrave et al. 2020, "A Metric Learning Reality Check"). Over all ordered pairs
`(i, j)`, `i != j`, of the batch:

    pos_ij = [d_ij - pos_margin]+   for y_i == y_j
    neg_ij = [neg_margin - d_ij]+   for y_i != y_j
    L = mean of the non-zero pos_ij + mean of the non-zero neg_ij

Each mean runs over its non-zero ("active") terms only and is 0 when none is active (PML's
`AvgNonZeroReducer`), so easy pairs do not dilute the loss.
"""

import keras
import tensorflow as tf

from tfdml.losses.base import MetricLoss
from tfdml.ops import (
    TupleTerms,
    as_scalar,
    mean_of_positive,
    pair_indices_with_targets,
    pair_masks,
    pairwise_distance,
    reference_embeddings,
    validate_inputs,
)


def _contrastive_loss(labels, embeddings, pos_margin, neg_margin, references=None):
    dist = pairwise_distance(embeddings, reference_embeddings(references))
    dtype = dist.dtype
    zeros = tf.zeros_like(dist)
    positives, negatives = pair_masks(labels, references)
    pos_terms = tf.where(positives, tf.nn.relu(dist - as_scalar(pos_margin, dtype)), zeros)
    neg_terms = tf.where(negatives, tf.nn.relu(as_scalar(neg_margin, dtype) - dist), zeros)
    return mean_of_positive(pos_terms) + mean_of_positive(neg_terms)


def contrastive_terms(labels, embeddings, pos_margin=0.0, neg_margin=1.0):
    """The contrastive loss's terms: every unordered pair `(i, j)`, `i < j`, its hinge, grouped into positive
    (group 0) and negative (group 1) pairs, each group a mean over its non-zero terms (the mean over ordered
    pairs counts each pair twice, in the sum and in the count). `reduce_terms` of them is `contrastive_loss`."""
    pairs, is_positive = pair_indices_with_targets(labels)
    d = tf.gather_nd(pairwise_distance(embeddings), pairs)
    values = tf.where(
        is_positive, tf.nn.relu(d - as_scalar(pos_margin, d.dtype)), tf.nn.relu(as_scalar(neg_margin, d.dtype) - d)
    )
    groups = tf.where(is_positive, 0, 1)
    return TupleTerms(values, pairs, "pair", "mean_active", groups=groups, num_groups=2)


def contrastive_loss(labels, embeddings, pos_margin=0.0, neg_margin=1.0):
    """Contrastive loss of a batch: mean active `[d - pos_margin]+` + mean active `[neg_margin - d]+`.

    Args:
        labels: integer class ids `[B]`.
        embeddings: float `[B, D]`.
        pos_margin: positive pairs are pulled until their distance is at most this.
        neg_margin: negative pairs are pushed until their distance is at least this.

    Returns:
        Scalar loss; 0 when no pair is active.
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _contrastive_loss(labels, embeddings, pos_margin, neg_margin)


@keras.saving.register_keras_serializable(package="tfdml")
class ContrastiveLoss(MetricLoss):
    """Contrastive loss, `L = mean_{active} [d_ap - pos_margin]+ + mean_{active} [neg_margin - d_an]+`.

    Same semantics and defaults as `pytorch_metric_learning.losses.ContrastiveLoss` with its Euclidean
    distance (see `contrastive_loss`): non-squared hinges, unlike Hadsell et al. 2006's squared
    `1/2 d^2` / `1/2 [m - d]+^2` terms.

    Args:
        pos_margin: distance below which positive pairs cost nothing (default 0).
        neg_margin: distance above which negative pairs cost nothing (default 1).
        name: loss name.

    Example:
        >>> loss = ContrastiveLoss(pos_margin=0.0, neg_margin=1.0)
        >>> model.compile(optimizer="adam", loss=loss)
    """

    def __init__(self, pos_margin=0.0, neg_margin=1.0, name="contrastive_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        if pos_margin < 0 or neg_margin < 0:
            raise ValueError(f"pos_margin and neg_margin must be >= 0, got {pos_margin} and {neg_margin}.")
        self.pos_margin = float(pos_margin)
        self.neg_margin = float(neg_margin)

    # `terms` lists pairs (`tfdml.ops.TupleTerms.kind`).
    tuple_kind = "pair"
    supports_references = True

    def compute(self, labels, embeddings, references=None):
        return _contrastive_loss(labels, embeddings, self.pos_margin, self.neg_margin, references)

    def terms(self, labels, embeddings):
        """The unreduced pair terms (`contrastive_terms`); `tfdml.ops.reduce_terms` gives `compute`'s value."""
        return contrastive_terms(labels, embeddings, self.pos_margin, self.neg_margin)

    def get_config(self):
        config = super().get_config()
        config.update(pos_margin=self.pos_margin, neg_margin=self.neg_margin)
        return config
