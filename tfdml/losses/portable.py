"""Small pieces that keep the losses' maths the same on every Keras backend.

- `mean`: `keras.ops.mean` on the JAX backend accumulates float64 input in float32 (a relative error of about
  1e-7); a sum divided by the count keeps the input's precision everywhere.
- `lowest`: the most negative finite value of a float dtype, for a masked-out entry of a max.
"""

import keras
import numpy as np
from keras import ops


def mean(values, axis=None):
    """The mean of `values` (over `axis`, default all), in their own dtype on every backend."""
    count = ops.shape(values)[0] if axis is None and len(values.shape) == 1 else None
    if count is None:
        count = ops.sum(ops.ones_like(values), axis=axis)
    return ops.sum(values, axis=axis) / ops.cast(count, values.dtype)


def lowest(dtype):
    """The most negative finite value of the float `dtype`, as a Python float."""
    return float(np.finfo(keras.backend.standardize_dtype(dtype)).min)
