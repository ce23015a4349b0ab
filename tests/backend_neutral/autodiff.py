"""Values and gradients of scalar functions of one array each, on whichever Keras backend runs."""

import keras
import numpy as np


def values_and_gradients(fns, xs):
    """`[(value, d value / d x)]` as NumPy for each `fn` (keras tensors in, scalar out) at its float64 array `x`.

    On JAX all of them are traced into one `jax.jit` and compiled as one program, as `model.fit` runs on JAX:
    XLA's cost is mostly per compilation, so one program for every function compiles several times faster than
    one each (and eager JAX, which compiles each op apart, is slower still).
    """
    if keras.backend.backend() == "jax":
        import jax

        def evaluate(arrays):
            return [jax.value_and_grad(fn)(x) for fn, x in zip(fns, arrays)]

        results = jax.jit(evaluate)([keras.ops.convert_to_tensor(x) for x in xs])
    else:
        results = [_value_and_gradient(fn, x) for fn, x in zip(fns, xs)]
    return [(float(keras.ops.convert_to_numpy(v)), np.asarray(keras.ops.convert_to_numpy(g))) for v, g in results]


def value_and_gradient(fn, x):
    """`(value, d value / d x)` as NumPy for `fn` (keras tensors in, scalar out) at the float64 array `x`."""
    return values_and_gradients([fn], [x])[0]


def _value_and_gradient(fn, x):
    if keras.backend.backend() == "torch":
        import torch

        tensor = torch.tensor(x, requires_grad=True)
        value = fn(tensor)
        (grad,) = torch.autograd.grad(value, tensor)
        return value, grad
    import tensorflow as tf  # the TensorFlow backend only

    tensor = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(tensor)
        value = fn(tensor)
    return value, tape.gradient(value, tensor)
