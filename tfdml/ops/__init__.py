"""Shared building blocks of every tfdml loss: input validation, pairwise distances and similarities,
label masks, masked weighting and reductions. No loss re-derives any of these.

Written in `keras.ops` with static shapes, so they run on the TensorFlow, JAX and PyTorch backends. The exact
nearest-neighbour search (`exact_search`, `ranking_scores`: retrieval, TensorFlow by nature) loads TensorFlow
on first use only.
"""

import importlib

from tfdml.ops.distances import (
    DISTANCE_ALIASES,
    DISTANCES,
    distance_matrix,
    distance_name,
    l2_normalize,
    pairwise_angular_distance,
    pairwise_cosine_similarity,
    pairwise_distance,
    pairwise_pearson_similarity,
    pairwise_squared_distance,
    safe_sqrt,
)
from tfdml.ops.masks import (
    negative_mask,
    not_self_mask,
    pair_indices,
    positive_mask,
    same_label_mask,
    triplet_mask,
    upper_pair_mask,
)
from tfdml.ops.reductions import (
    masked_logsumexp,
    masked_max,
    masked_mean,
    masked_min,
    masked_softmax,
    masked_sum,
    mean_of_positive,
    safe_divide,
)
from tfdml.ops.references import References, pair_masks, reference_embeddings
from tfdml.ops.scalars import as_scalar
from tfdml.ops.terms import REDUCTIONS, TupleTerms, reduce_terms, term_coefficients
from tfdml.ops.tuples import (
    pair_indices_with_targets,
    pair_values,
    triplet_distances,
    triplet_indices,
)
from tfdml.ops.validation import (
    check_finite,
    compute_dtype_for,
    validate_embeddings,
    validate_inputs,
    validate_labels,
)

__all__ = [
    "as_scalar",
    "References",
    "pair_masks",
    "reference_embeddings",
    "DISTANCES",
    "DISTANCE_ALIASES",
    "distance_name",
    "distance_matrix",
    "pairwise_distance",
    "pairwise_angular_distance",
    "pairwise_squared_distance",
    "pairwise_pearson_similarity",
    "pairwise_cosine_similarity",
    "l2_normalize",
    "safe_sqrt",
    "same_label_mask",
    "positive_mask",
    "negative_mask",
    "pair_indices",
    "not_self_mask",
    "upper_pair_mask",
    "triplet_mask",
    "masked_softmax",
    "masked_max",
    "masked_min",
    "masked_mean",
    "masked_sum",
    "safe_divide",
    "mean_of_positive",
    "masked_logsumexp",
    "REDUCTIONS",
    "TupleTerms",
    "reduce_terms",
    "term_coefficients",
    "triplet_indices",
    "triplet_distances",
    "pair_values",
    "pair_indices_with_targets",
    "compute_dtype_for",
    "validate_labels",
    "validate_embeddings",
    "validate_inputs",
    "check_finite",
    "exact_search",
    "ranking_operands",
    "ranking_scores",
]

# TensorFlow by nature (the retrieval search): imported on first use.
_NEIGHBOURS = ("exact_search", "ranking_operands", "ranking_scores")


def __getattr__(name):
    if name in _NEIGHBOURS:
        return getattr(importlib.import_module("tfdml.ops.neighbours"), name)
    raise AttributeError(f"module 'tfdml.ops' has no attribute {name!r}")
