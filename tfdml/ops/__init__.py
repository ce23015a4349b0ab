"""Shared building blocks of every tfdml loss: input validation, pairwise distances and similarities,
label masks, masked weighting and reductions. No loss re-derives any of these."""

from tfdml.ops.distances import (
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
    pair_indices,
    positive_mask,
    same_label_mask,
)
from tfdml.ops.neighbours import (
    exact_search,
    ranking_operands,
    ranking_scores,
)
from tfdml.ops.reductions import (
    masked_logsumexp,
    masked_max,
    masked_mean,
    masked_min,
    masked_softmax,
    mean_of_positive,
    safe_divide,
)
from tfdml.ops.references import References, pair_masks, reference_embeddings
from tfdml.ops.scalars import as_scalar
from tfdml.ops.terms import REDUCTIONS, TupleTerms, reduce_terms, term_coefficients
from tfdml.ops.tuples import (
    pair_indices_with_targets,
    triplet_distances,
    triplet_indices,
)
from tfdml.ops.validation import (
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
    "masked_softmax",
    "masked_max",
    "masked_min",
    "masked_mean",
    "safe_divide",
    "mean_of_positive",
    "masked_logsumexp",
    "REDUCTIONS",
    "TupleTerms",
    "reduce_terms",
    "term_coefficients",
    "triplet_indices",
    "triplet_distances",
    "pair_indices_with_targets",
    "compute_dtype_for",
    "validate_labels",
    "validate_embeddings",
    "validate_inputs",
    "exact_search",
    "ranking_operands",
    "ranking_scores",
]
