"""Masked weighting and reductions that stay finite on empty sets, in `keras.ops` (every backend)."""

import numpy as np
from keras import backend, ops


def lowest(dtype):
    """The most negative finite value of a float dtype (the fill of entries outside a mask)."""
    return float(np.finfo(backend.standardize_dtype(dtype)).min)


def safe_divide(numerator, denominator):
    """`numerator / denominator`, and 0 (with zero gradient) where the denominator is 0."""
    numerator = ops.convert_to_tensor(numerator)
    denominator = ops.cast(denominator, numerator.dtype)
    nonzero = ops.not_equal(denominator, 0)
    return ops.where(
        nonzero, numerator / ops.where(nonzero, denominator, ops.ones_like(denominator)), ops.zeros_like(numerator)
    )


def masked_softmax(logits, mask, axis=-1):
    """Softmax of `logits` over the entries where `mask` is true, 0 elsewhere.

    The max of the masked entries is subtracted first, so large temperatures (`exp(50 * x)`) cannot
    overflow; a row with no true entry is all zeros, never NaN.
    """
    logits = ops.convert_to_tensor(logits)
    mask = ops.cast(mask, "bool")
    row_max = ops.stop_gradient(masked_max(logits, mask, axis=axis, keepdims=True))
    exp = ops.where(mask, ops.exp(ops.where(mask, logits - row_max, ops.zeros_like(logits))), ops.zeros_like(logits))
    return safe_divide(exp, ops.sum(exp, axis=axis, keepdims=True))


def masked_max(values, mask, axis=-1, keepdims=False):
    """Max over masked entries; rows with no entry give 0."""
    values = ops.convert_to_tensor(values)
    mask = ops.cast(mask, "bool")
    filled = ops.where(mask, values, ops.full_like(values, lowest(values.dtype)))
    result = ops.max(filled, axis=axis, keepdims=keepdims)
    any_entry = ops.any(mask, axis=axis, keepdims=keepdims)
    return ops.where(any_entry, result, ops.zeros_like(result))


def masked_min(values, mask, axis=-1, keepdims=False):
    """Min over masked entries; rows with no entry give 0."""
    return -masked_max(-ops.convert_to_tensor(values), mask, axis=axis, keepdims=keepdims)


def masked_sum(values, mask, axis=None, keepdims=False):
    """Sum over masked entries (entries outside the mask never reach the sum, even if not finite)."""
    values = ops.convert_to_tensor(values)
    return ops.sum(ops.where(ops.cast(mask, "bool"), values, ops.zeros_like(values)), axis=axis, keepdims=keepdims)


def masked_mean(values, mask, axis=None):
    """Mean over masked entries; 0 when there is none."""
    values = ops.convert_to_tensor(values)
    count = ops.sum(ops.cast(mask, values.dtype), axis=axis)
    return safe_divide(masked_sum(values, mask, axis=axis), count)


def mean_of_positive(values):
    """Mean of the strictly positive entries (the "active" terms of a hinge loss); 0 when none is."""
    values = ops.convert_to_tensor(values)
    return masked_mean(values, values > 0)


def masked_logsumexp(values, mask, axis=-1, add_one=False, keepdims=False):
    """`log(sum_{mask} exp(values))` along `axis` (with `add_one`: `log(1 + sum ...)`), 0 where `mask` has no
    true entry (pytorch-metric-learning's `logsumexp(x, keep_mask, add_one)`).

    The largest masked entry is subtracted before `exp`, so scales such as `exp(80 * x)` cannot overflow, and
    entries outside the mask never reach `exp` (no inf * 0 in the gradient).
    """
    values = ops.convert_to_tensor(values)
    mask = ops.cast(mask, "bool")
    any_entry = ops.any(mask, axis=axis, keepdims=True)
    shift = ops.stop_gradient(masked_max(values, mask, axis=axis, keepdims=True))
    if add_one:
        shift = ops.maximum(shift, ops.zeros_like(shift))
    exp = ops.where(mask, ops.exp(ops.where(mask, values - shift, ops.zeros_like(values))), ops.zeros_like(values))
    total = ops.sum(exp, axis=axis, keepdims=True)
    if add_one:
        total = total + ops.exp(-shift)
    result = ops.where(
        any_entry, shift + ops.log(ops.where(any_entry, total, ops.ones_like(total))), ops.zeros_like(total)
    )
    return result if keepdims else ops.squeeze(result, axis=axis)
