"""Runs every reference case and training run of `reference_cases` on the current Keras backend.

`python -m tests.backend_neutral.run` (with `KERAS_BACKEND` set; JAX needs `JAX_ENABLE_X64=1` for the float64
references) prints one line per failure and exits 1 if any case fails.
"""

import sys

import keras
import numpy as np

from tests.backend_neutral.autodiff import value_and_gradient
from tests.backend_neutral.reference_cases import CASES, FIT_LOSSES, TERMS_LOSSES
from tfdml.ops import l2_normalize, reduce_terms

# Keras' PyTorch backend computes float64 matmuls and mixed float64/Python-number ops in float32
# (`keras.backend.result_type` maps float64 to float32 off TensorFlow): float32 tolerances there.
FLOAT32_TOLERANCE = {"torch": (2e-6, 1e-6)}


def check_case(case):
    """None if `case` passes, else a line saying what differs."""
    rtol, grad_atol = FLOAT32_TOLERANCE.get(keras.backend.backend(), (case.rtol, 1e-9))
    loss = case.make()
    labels = keras.ops.convert_to_tensor(case.labels)

    def fn(x):
        return loss(labels, l2_normalize(x) if case.normalise else x)

    value, grad = value_and_gradient(fn, case.embeddings)
    if not np.isclose(value, case.value, rtol=max(rtol, case.rtol), atol=1e-12):
        return f"{case.name}: value {value!r}, expected {case.value!r}"
    if not np.all(np.isfinite(grad)):
        return f"{case.name}: gradient not finite"
    if case.gradient is not None and not np.allclose(grad, case.gradient, atol=grad_atol):
        return f"{case.name}: gradient differs by {np.abs(grad - case.gradient).max():.3g}"
    return None


def check_terms(name, make, seed=3):
    """None if the loss's `compute` equals `reduce_terms` of its dense terms (value and gradient)."""
    loss = make()
    rng = np.random.default_rng(seed)
    labels = keras.ops.convert_to_tensor(rng.integers(0, 3, size=10).astype("int32"))
    x = rng.normal(size=(10, 4)) * 0.5
    fast = value_and_gradient(lambda e: loss.compute(labels, e), x)
    listed = value_and_gradient(lambda e: reduce_terms(loss.dense_terms(labels, e)), x)
    if not (np.isclose(fast[0], listed[0], rtol=1e-5) and np.allclose(fast[1], listed[1], atol=1e-5)):
        return f"terms/{name}: fast path {fast[0]!r}, terms {listed[0]!r}"
    return None


def check_fit(name, make, epochs=6):
    """None if `model.fit` of a small embedder lowers the loss `make()`, else a line saying what happened."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 8).astype("int32")
    x = (rng.normal(size=(4, 8))[labels] + 0.8 * rng.normal(size=(32, 8))).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=make())
    history = model.fit(x, labels, batch_size=32, epochs=epochs, shuffle=False, verbose=0).history["loss"]
    if not (np.all(np.isfinite(history)) and history[-1] < 0.9 * history[0]):
        return f"fit/{name}: losses {history}"
    return None


def main(selected=None):
    failures = [check_case(case) for case in CASES if selected is None or case.name.startswith(selected)]
    failures += [check_terms(name, make) for name, make in TERMS_LOSSES.items()]
    failures += [check_fit(name, make) for name, make in FIT_LOSSES.items()]
    failures = [line for line in failures if line]
    print(f"{keras.backend.backend()}: {len(CASES)} cases, {len(FIT_LOSSES)} fits, {len(failures)} failures")
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
