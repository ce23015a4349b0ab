"""Per-tuple loss terms and the one reduction that every tuple loss shares.

pytorch-metric-learning's split of a loss into "losses -> reducer": a tuple loss (`TripletLoss`, `MarginLoss`,
`ContrastiveLoss`) lists its unreduced terms with `loss.terms(labels, embeddings)`, a `TupleTerms` holding one
value per tuple, the tuple's rows in the batch and how the loss reduces them; `reduce_terms(terms)` is the
loss's value. Methods that weight tuples (DML-ALA's assessor, the small-loss heuristic, PRISM) pass one weight
per term to the same reduction, so that with every weight 1 they train exactly the loss a user compiles:

    L(w) = sum_g ( sum_{i in g} w_i v_i / sum_{i in g} w_i d_i )  +  extra

- `g`: the groups reduced separately and then added (contrastive: its positive pairs and its negative pairs;
  the other losses: one group). A group whose weighted divisor is 0 adds 0.
- `d_i`: the term's share of the divisor, fixed by the reduction kind:
    "mean"         d_i = 1              mean over the listed tuples (semi-hard and batch-hard triplets, soft
                                        margins)
    "mean_active"  d_i = [v_i > 0]      mean over the non-zero terms (PML's AvgNonZeroReducer: contrastive,
                                        all triplets)
    "divisor"      d_i given by the     the margin loss: #(pos_i > 0) + #(neg_i > 0) (PML's DivisorReducer)
                   loss (`divisors`)
- `extra`: a term that is not a tuple's and is never weighted (the margin loss's `nu * beta` regulariser).

The weights enter the divisor too: a weight 0 removes a tuple from the sum and from the count (the mean of
the others, as if it had not been mined), and scaling all the weights of a group by a constant changes
nothing. The divisors are piecewise constant in the embeddings, so `L(w) = sum_i u_i(w) v_i + extra` with
`u = term_coefficients(terms, w)`, and `grad L(w) = sum_i u_i(w) grad v_i`: what DML-ALA differentiates.
"""

import dataclasses

import tensorflow as tf

from tfdml.ops.reductions import safe_divide

REDUCTIONS = ("mean", "mean_active", "divisor")
TUPLE_KINDS = ("triplet", "pair")


@dataclasses.dataclass(frozen=True)
class TupleTerms:
    """The unreduced terms of a tuple loss on one batch (module docstring).

    Attributes:
        values: float `[T]`, one loss term per tuple (differentiable in the embeddings and loss variables).
        indices: int32 `[T, 3]` `(anchor, positive, negative)` rows for `kind="triplet"`, `[T, 2]` `(i, j)`
            for `kind="pair"`.
        kind: "triplet" or "pair".
        reduction: "mean", "mean_active" or "divisor".
        divisors: float `[T]` (constants), each term's share of the divisor for `reduction="divisor"`.
        groups: int32 `[T]` in `[0, num_groups)`: terms reduced separately, then added (None: one group).
        num_groups: number of groups.
        extra: scalar added after the reduction, never weighted (None: 0).
    """

    values: tf.Tensor
    indices: tf.Tensor
    kind: str
    reduction: str
    divisors: tf.Tensor = None
    groups: tf.Tensor = None
    num_groups: int = 1
    extra: tf.Tensor = None

    def __post_init__(self):
        if self.kind not in TUPLE_KINDS:
            raise ValueError(f"TupleTerms kind must be one of {TUPLE_KINDS}, got {self.kind!r}.")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"TupleTerms reduction must be one of {REDUCTIONS}, got {self.reduction!r}.")
        if (self.reduction == "divisor") != (self.divisors is not None):
            raise ValueError('TupleTerms takes divisors with reduction="divisor", and only then.')
        if (self.groups is None) != (self.num_groups == 1):
            raise ValueError("TupleTerms takes groups exactly when num_groups > 1.")

    def term_divisors(self):
        """`d_i` of each term (constants: gradients stopped)."""
        values = self.values
        if self.reduction == "mean":
            return tf.ones_like(values)
        if self.reduction == "mean_active":
            return tf.cast(tf.stop_gradient(values) > 0, values.dtype)
        return tf.stop_gradient(tf.cast(self.divisors, values.dtype))


def _group_sum(values, terms):
    if terms.groups is None:
        return tf.reduce_sum(values, keepdims=True)
    return tf.math.unsorted_segment_sum(values, terms.groups, terms.num_groups)


def _check_weights(terms, weights):
    if weights is None:
        return tf.ones_like(terms.values)
    weights = tf.cast(tf.convert_to_tensor(weights), terms.values.dtype)
    if weights.shape.rank is not None and weights.shape.rank != 1:
        raise ValueError(f"weights must be one value per term, [T], got shape {weights.shape}.")
    return weights


def term_coefficients(terms, weights=None):
    """`u_i(w) = w_i / sum_{j in g(i)} w_j d_j`: the reduction's coefficient of each term, `L(w) = sum u_i v_i
    + extra` (0 in a group whose weighted divisor is 0). Differentiable in `weights`; constant in the values.
    """
    weights = _check_weights(terms, weights)
    divisor = _group_sum(weights * terms.term_divisors(), terms)
    per_term = divisor[0] if terms.groups is None else tf.gather(divisor, terms.groups)
    return safe_divide(weights, per_term * tf.ones_like(weights))


def reduce_terms(terms, weights=None):
    """The loss value of `terms` with per-term `weights` (`[T]`, default all 1: exactly the loss's value).

    Example:
        >>> loss = tfdml.losses.ContrastiveLoss()
        >>> terms = loss.terms(labels, embeddings)
        >>> reduce_terms(terms)                     # == loss.compute(labels, embeddings)
        >>> reduce_terms(terms, weights)            # the same loss, tuples re-weighted
    """
    value = tf.reduce_sum(term_coefficients(terms, weights) * terms.values)
    if terms.extra is not None:
        value = value + tf.cast(terms.extra, value.dtype)
    return value
