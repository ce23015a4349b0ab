"""Masked weighting and reductions that stay finite on empty sets."""

import tensorflow as tf


def safe_divide(numerator, denominator):
    """`numerator / denominator`, and 0 (with zero gradient) where the denominator is 0."""
    numerator = tf.convert_to_tensor(numerator)
    denominator = tf.cast(denominator, numerator.dtype)
    nonzero = tf.not_equal(denominator, 0)
    return tf.where(
        nonzero, numerator / tf.where(nonzero, denominator, tf.ones_like(denominator)), tf.zeros_like(numerator)
    )


def masked_softmax(logits, mask, axis=-1):
    """Softmax of `logits` over the entries where `mask` is true, 0 elsewhere.

    The max of the masked entries is subtracted first, so large temperatures (`exp(50 * x)`) cannot
    overflow; a row with no true entry is all zeros, never NaN.
    """
    logits = tf.convert_to_tensor(logits)
    mask = tf.cast(mask, tf.bool)
    very_negative = tf.fill(tf.shape(logits), tf.constant(logits.dtype.min, logits.dtype))
    masked_logits = tf.where(mask, logits, very_negative)
    row_max = tf.stop_gradient(tf.reduce_max(masked_logits, axis=axis, keepdims=True))
    row_max = tf.where(tf.reduce_any(mask, axis=axis, keepdims=True), row_max, tf.zeros_like(row_max))
    exp = tf.where(mask, tf.exp(tf.where(mask, logits - row_max, tf.zeros_like(logits))), tf.zeros_like(logits))
    return safe_divide(exp, tf.reduce_sum(exp, axis=axis, keepdims=True))


def masked_max(values, mask, axis=-1, keepdims=False):
    """Max over masked entries; rows with no entry give 0."""
    values = tf.convert_to_tensor(values)
    mask = tf.cast(mask, tf.bool)
    filled = tf.where(mask, values, tf.fill(tf.shape(values), tf.constant(values.dtype.min, values.dtype)))
    result = tf.reduce_max(filled, axis=axis, keepdims=keepdims)
    any_entry = tf.reduce_any(mask, axis=axis, keepdims=keepdims)
    return tf.where(any_entry, result, tf.zeros_like(result))


def masked_min(values, mask, axis=-1, keepdims=False):
    """Min over masked entries; rows with no entry give 0."""
    return -masked_max(-tf.convert_to_tensor(values), mask, axis=axis, keepdims=keepdims)


def masked_mean(values, mask, axis=None):
    """Mean over masked entries; 0 when there is none."""
    values = tf.convert_to_tensor(values)
    mask = tf.cast(mask, values.dtype)
    return safe_divide(tf.reduce_sum(values * mask, axis=axis), tf.reduce_sum(mask, axis=axis))


def mean_of_positive(values):
    """Mean of the strictly positive entries (the "active" terms of a hinge loss); 0 when none is."""
    values = tf.convert_to_tensor(values)
    return masked_mean(values, values > 0)


def masked_logsumexp(values, mask, axis=-1, add_one=False, keepdims=False):
    """`log(sum_{mask} exp(values))` along `axis` (with `add_one`: `log(1 + sum ...)`), 0 where `mask` has no
    true entry (pytorch-metric-learning's `logsumexp(x, keep_mask, add_one)`).

    The largest masked entry is subtracted before `exp`, so scales such as `exp(80 * x)` cannot overflow, and
    entries outside the mask never reach `exp` (no inf * 0 in the gradient).
    """
    values = tf.convert_to_tensor(values)
    mask = tf.cast(mask, tf.bool)
    any_entry = tf.reduce_any(mask, axis=axis, keepdims=True)
    shift = tf.stop_gradient(masked_max(values, mask, axis=axis, keepdims=True))
    if add_one:
        shift = tf.maximum(shift, tf.zeros_like(shift))
    exp = tf.where(mask, tf.exp(tf.where(mask, values - shift, tf.zeros_like(values))), tf.zeros_like(values))
    total = tf.reduce_sum(exp, axis=axis, keepdims=True)
    if add_one:
        total = total + tf.exp(-shift)
    result = tf.where(
        any_entry, shift + tf.math.log(tf.where(any_entry, total, tf.ones_like(total))), tf.zeros_like(total)
    )
    return result if keepdims else tf.squeeze(result, axis=axis)
