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
    "mean"         d_i = 1              mean over the listed tuples (semi-hard, batch-hard, soft margins)
    "mean_active"  d_i = [v_i > 0]      mean of the non-zero terms (AvgNonZeroReducer: contrastive, all triplets)
    "divisor"      d_i given by the     the margin loss: #(pos_i > 0) + #(neg_i > 0) (PML's DivisorReducer)
                   loss (`divisors`)
- `extra`: a term that is not a tuple's and is never weighted (the margin loss's `nu * beta` regulariser).

A loss writes its terms once, densely with static shapes (`dense=True`): `values` is `[B, G]` for pairs (query
`i`, reference `j`) or `[B, B, G]` for triplets (anchor, positive, negative), with a bool `valid` mask of the same
shape; its value is `reduce_terms` of them (no variable-length list, so it runs on every backend and under XLA).
`listed()` turns them into the `[T]` list of the valid tuples (`values [T]`, `indices [T, k]`), which methods
that weight tuples one by one (DML-ALA) read; both reduce to the same value. The weights enter the divisor
too (`term_coefficients`).
"""

import dataclasses

from keras import ops

from tfdml.ops.reductions import safe_divide

REDUCTIONS = ("mean", "mean_active", "divisor")
TUPLE_KINDS = ("triplet", "pair")


@dataclasses.dataclass(frozen=True)
class TupleTerms:
    """The unreduced terms of a tuple loss on one batch (module docstring).

    Attributes:
        values: float, one loss term per tuple (differentiable in the embeddings and loss variables): `[T]`
            when listed; dense `[B, G]` (pairs) or `[B, B, G]` (triplets) with `valid`.
        indices: int32 `[T, 3]` `(anchor, positive, negative)` rows for `kind="triplet"`, `[T, 2]` `(i, j)`
            for `kind="pair"` (listed terms; None for dense ones).
        kind: "triplet" or "pair".
        reduction: "mean", "mean_active" or "divisor".
        divisors: float, shaped as `values` (constants), each term's share of the divisor for
            `reduction="divisor"`.
        groups: int32, shaped as `values`, in `[0, num_groups)`: terms reduced separately, then added (None:
            one group).
        num_groups: number of groups.
        extra: scalar added after the reduction, never weighted (None: 0).
        valid: bool, shaped as `values`, for dense terms: the entries that are tuples (None: listed terms).
            Entries outside it hold a finite value (0) and count in no sum.
    """

    values: object
    indices: object
    kind: str
    reduction: str
    divisors: object = None
    groups: object = None
    num_groups: int = 1
    extra: object = None
    valid: object = None

    def __post_init__(self):
        if self.kind not in TUPLE_KINDS:
            raise ValueError(f"TupleTerms kind must be one of {TUPLE_KINDS}, got {self.kind!r}.")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"TupleTerms reduction must be one of {REDUCTIONS}, got {self.reduction!r}.")
        if (self.reduction == "divisor") != (self.divisors is not None):
            raise ValueError('TupleTerms takes divisors with reduction="divisor", and only then.')
        if (self.groups is None) != (self.num_groups == 1):
            raise ValueError("TupleTerms takes groups exactly when num_groups > 1.")
        if (self.valid is None) == (self.indices is None):
            raise ValueError("TupleTerms takes indices (listed terms) or a valid mask (dense terms), not both.")

    def term_divisors(self):
        """`d_i` of each term (constants: gradients stopped)."""
        values = self.values
        if self.reduction == "mean":
            return ops.ones_like(values)
        if self.reduction == "mean_active":
            return ops.cast(ops.stop_gradient(values) > 0, values.dtype)
        return ops.stop_gradient(ops.cast(self.divisors, values.dtype))

    def map_tuples(self, fn, **fields):
        """A copy with `fn` applied to every per-tuple array (`values`, `indices`, `divisors`, `groups`,
        `valid`; None stays None) but those that `fields` sets instead."""
        mapped = {
            name: None if getattr(self, name) is None else fn(getattr(self, name))
            for name in ("values", "indices", "divisors", "groups", "valid")
            if name not in fields
        }
        return dataclasses.replace(self, **mapped, **fields)

    def flat(self):
        """Dense terms as one `[B*G]` (or `[B*B*G]`) axis, with `valid` as the weights' mask."""
        if self.valid is None:
            return self
        return self.map_tuples(lambda x: ops.reshape(x, (-1,)))

    def listed(self):
        """The valid tuples of dense terms as a list: `values [T]`, `indices [T, k]` in row-major order (a
        data-dependent length: eager code and TensorFlow graphs). Listed terms are returned as they are."""
        if self.valid is None:
            return self
        flat = self.flat()
        (positions,) = ops.nonzero(flat.valid)
        positions = ops.cast(positions, "int32")
        indices, rest = [], positions
        for size in reversed(tuple(ops.shape(self.valid))):
            indices.insert(0, rest % size)
            rest = rest // size

        return flat.map_tuples(lambda x: ops.take(x, positions), indices=ops.stack(indices, axis=1), valid=None)


def _group_sum(values, terms):
    if terms.groups is None:
        return ops.sum(values, axis=0, keepdims=True)
    # One masked sum per group (a handful): elementwise passes, cheaper than a one-hot or a segment sum over
    # a dense [B * G] term axis, and every backend keeps the values' dtype.
    groups = ops.cast(terms.groups, "int32")
    return ops.stack([ops.sum(ops.where(groups == g, values, 0.0)) for g in range(terms.num_groups)])


def _per_term(divisor, terms):
    """Each term's group divisor."""
    if terms.groups is None:
        return divisor[0]
    groups = ops.cast(terms.groups, "int32")
    per_term = ops.zeros_like(terms.values)
    for g in range(terms.num_groups):
        per_term = ops.where(groups == g, divisor[g], per_term)
    return per_term


def _check_weights(terms, weights):
    mask = None if terms.valid is None else ops.cast(terms.valid, terms.values.dtype)
    if weights is None:
        return ops.ones_like(terms.values) if mask is None else mask
    weights = ops.cast(weights, terms.values.dtype)
    if len(weights.shape) != len(terms.values.shape):
        raise ValueError(
            f"weights must be one value per term, {tuple(terms.values.shape)}, got shape {tuple(weights.shape)}."
        )
    return weights if mask is None else weights * mask


def term_coefficients(terms, weights=None):
    """`u_i(w) = w_i / sum_{j in g(i)} w_j d_j`: the reduction's coefficient of each term, `L(w) = sum u_i v_i
    + extra` (0 in a group whose weighted divisor is 0). Differentiable in `weights`; constant in the values.
    Shaped as `terms.values` (dense terms: 0 outside `valid`).

    The weights enter the divisor: a weight 0 removes a tuple from the sum and from the count (the mean of the
    others, as if it had not been mined), and scaling all the weights of a group by a constant changes nothing.
    The divisors are piecewise constant in the embeddings, so `L(w) = sum_i u_i(w) v_i + extra` and
    `grad L(w) = sum_i u_i(w) grad v_i`: what DML-ALA differentiates.
    """
    weights = _check_weights(terms, weights)
    shape = ops.shape(weights)
    terms, weights = terms.flat(), ops.reshape(weights, (-1,))
    divisor = _group_sum(weights * terms.term_divisors(), terms)
    return ops.reshape(safe_divide(weights, _per_term(divisor, terms) * ops.ones_like(weights)), shape)


def reduce_terms(terms, weights=None):
    """The loss value of `terms` with per-term `weights` (shaped as `terms.values`, default all 1: exactly the
    loss's value).

    Example:
        >>> loss = tfdml.losses.ContrastiveLoss()
        >>> terms = loss.terms(labels, embeddings)
        >>> reduce_terms(terms)                     # == loss.compute(labels, embeddings)
        >>> reduce_terms(terms, weights)            # the same loss, tuples re-weighted
    """
    value = ops.sum(term_coefficients(terms, weights) * terms.values)
    if terms.extra is not None:
        value = value + ops.cast(terms.extra, value.dtype)
    return value
