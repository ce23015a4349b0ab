"""Values and gradients of scalar functions of one array each, on whichever Keras backend runs."""

import functools

import keras
import numpy as np

PROGRAM_SIZE = 20


def values_and_gradients(fns, xs):
    """`[(value, d value / d x)]` as NumPy for each `fn` (keras tensors in, scalar out) at its float64 array `x`.

    On JAX they are compiled, as `model.fit` runs on JAX, `PROGRAM_SIZE` functions to one `jax.jit` program:
    XLA's cost is partly per compilation and partly grows faster than a program's size, so programs of a score
    of functions compile fastest (eager JAX, which compiles each op apart, is slower still).
    """
    if keras.backend.backend() == "jax":
        import jax

        def evaluate(chunk, arrays):
            return [jax.value_and_grad(fn)(x) for fn, x in zip(chunk, arrays)]

        results = []
        for start in range(0, len(fns), PROGRAM_SIZE):
            arrays = [keras.ops.convert_to_tensor(x) for x in xs[start : start + PROGRAM_SIZE]]
            results += jax.jit(functools.partial(evaluate, fns[start : start + PROGRAM_SIZE]))(arrays)
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
