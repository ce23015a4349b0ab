"""Hyper-parameters as scalars of a computation's dtype."""

import tensorflow as tf


def as_scalar(value, dtype):
    """`value` (Python number or tensor) as a scalar tensor of `dtype`.

    Python numbers are converted directly to `dtype`: `tf.cast(0.2, tf.float64)` would first round 0.2 to
    float32 and lose precision in float64 computations.
    """
    if tf.is_tensor(value) or isinstance(value, tf.Variable):
        return tf.cast(value, dtype)
    return tf.constant(value, dtype)
