"""A separate reference set for the pairs of a loss: queries from the batch, the other end from elsewhere.

A batch-level loss compares every sample of the batch with every other one. With a reference set (the
cross-batch memory of `tfdml.losses.CrossBatchMemory`, pytorch-metric-learning's `ref_emb`/`ref_labels`)
the `B` queries of the batch are compared with the `G` references instead: distances and masks are `[B, G]`.
A query may have a copy of itself among the references (the memory holds the current batch too); that
pair is not a positive pair, as `i == j` is not one within a batch. Rows of the reference set that hold
nothing yet (a memory that is not full) are in no pair at all.

Losses that accept references take `references=None` (the batch itself, the usual `[B, B]` case) or a
`References`, and build their pairs with `pair_masks` and `reference_embeddings`.
"""

from typing import NamedTuple

from keras import ops

from tfdml.ops.masks import negative_mask, positive_mask, same_label_mask


class References(NamedTuple):
    """The other end of every pair of a loss.

    Attributes:
        labels: int32 `[G]` class ids of the references.
        embeddings: float `[G, D]` reference embeddings (usually constants: no gradient flows to them).
        query_columns: int32 `[B]`, the column of each query's own copy among the references, -1 for none.
        valid: bool `[G]`, the rows that hold a reference.
    """

    labels: object
    embeddings: object
    query_columns: object
    valid: object


def reference_embeddings(references):
    """The gallery argument of `pairwise_distance` & co.: None (the batch itself) or the reference rows."""
    return None if references is None else references.embeddings


def pair_masks(labels, references=None, include_self=False):
    """`(positives, negatives)`: bool `[B, G]` masks of the same-class and other-class pairs.

    Without references these are `positive_mask(labels)` and `negative_mask(labels)` (`[B, B]`, no `i == i`
    pair). With references, pairs run from each query to every valid reference, and a query's own copy is
    no positive pair unless `include_self` (what pytorch-metric-learning's miners see before the
    self-comparisons are removed).
    """
    if references is None:
        return (same_label_mask(labels) if include_self else positive_mask(labels)), negative_mask(labels)
    valid = ops.cast(references.valid, "bool")[None, :]
    same = same_label_mask(labels, references.labels)
    positives = ops.logical_and(same, valid)
    if not include_self:
        columns = ops.arange(ops.shape(references.labels)[0], dtype="int32")
        own_copy = ops.equal(ops.cast(references.query_columns, "int32")[:, None], columns[None, :])
        positives = ops.logical_and(positives, ops.logical_not(own_copy))
    return positives, ops.logical_and(ops.logical_not(same), valid)
