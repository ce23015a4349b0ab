"""Value and gradient of a scalar function of one array, on whichever Keras backend runs."""

import keras
import numpy as np


def value_and_gradient(fn, x):
    """`(value, d value / d x)` as NumPy for `fn` (keras tensors in, scalar out) at the float64 array `x`."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        # Compiled whole, as `model.fit` runs on JAX (eager JAX compiles each op apart: several times slower).
        value, grad = jax.jit(jax.value_and_grad(fn))(keras.ops.convert_to_tensor(x))
    elif backend == "torch":
        import torch

        tensor = torch.tensor(x, requires_grad=True)
        value = fn(tensor)
        (grad,) = torch.autograd.grad(value, tensor)
    else:
        import tensorflow as tf  # the TensorFlow backend only

        tensor = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(tensor)
            value = fn(tensor)
        grad = tape.gradient(value, tensor)
    return float(keras.ops.convert_to_numpy(value)), np.asarray(keras.ops.convert_to_numpy(grad))
