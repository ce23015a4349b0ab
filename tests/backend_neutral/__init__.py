"""Backend-neutral loss checks: NumPy and `keras.ops` only, no TensorFlow import of their own, so the same
cases run on Keras' TensorFlow, JAX and PyTorch backends (`tests/losses/test_backends.py` runs them in a subprocess
per backend, the backend being fixed per process). A loss joins by adding cases to `reference_cases.CASES`
(or a training run to `reference_cases.FIT_LOSSES`)."""
