"""Runs every reference case, equivalence and training run of `reference_cases` on the current Keras backend.

`python -m tests.backend_neutral.run` (with `KERAS_BACKEND` set; JAX needs `JAX_ENABLE_X64=1` for the float64
references) prints one line per failure and exits 1 if any check fails.
"""

import random
import sys

import keras
import numpy as np

from tests.backend_neutral.autodiff import values_and_gradients
from tests.backend_neutral.reference_cases import CASES, FIT_LOSSES, NESTED_LOSSES, TERMS_LOSSES
from tfdml.losses import NestedLoss
from tfdml.ops import l2_normalize, reduce_terms

# Keras' PyTorch backend computes float64 matmuls and mixed float64/Python-number ops in float32
# (`keras.backend.result_type` maps float64 to float32 off TensorFlow): float32 tolerances there.
FLOAT32_TOLERANCE = {"torch": (2e-6, 1e-6)}


def case_function(case):
    """The differentiated function of `case`: its loss of the (normalised, if the case says so) embeddings."""
    loss = case.make()
    labels = keras.ops.convert_to_tensor(case.labels)
    return lambda x: loss(labels, l2_normalize(x) if case.normalise else x)


def compare_case(case, value, grad):
    """None if `value` and `grad` are those `case` expects, else a line saying what differs."""
    rtol, grad_atol = FLOAT32_TOLERANCE.get(keras.backend.backend(), (case.rtol, 1e-9))
    if case.gradient is not None:  # float32 round-off scales with the gradient
        grad_atol = max(grad_atol * max(1.0, np.abs(case.gradient).max()), case.gradient_atol)
    if case.value is not None and not np.isclose(value, case.value, rtol=max(rtol, case.rtol), atol=1e-12):
        return f"{case.name}: value {value!r}, expected {case.value!r}"
    if not np.all(np.isfinite(grad)):
        return f"{case.name}: gradient not finite"
    if case.gradient is not None and not np.allclose(grad, case.gradient, atol=grad_atol):
        return f"{case.name}: gradient differs by {np.abs(grad - case.gradient).max():.3g}"
    return None


def check_case(case):
    """None if `case` passes, else a line saying what differs."""
    return compare_case(case, *values_and_gradients([case_function(case)], [case.embeddings])[0])


def terms_pair(make, seed=3):
    """The loss's `compute` (its fast path) and `reduce_terms` of its dense terms, and the point to compare at."""
    loss = make()
    rng = np.random.default_rng(seed)
    labels = keras.ops.convert_to_tensor(rng.integers(0, 3, size=10).astype("int32"))
    x = rng.normal(size=(10, 4)) * 0.5
    return lambda e: loss.compute(labels, e), lambda e: reduce_terms(loss.dense_terms(labels, e)), x


def nested_pair(make, dims, weights):
    """`NestedLoss(make(), dims, weights)` and the weighted sum of `make()` on the normalised prefixes."""
    labels = keras.ops.convert_to_tensor(np.repeat(np.arange(3), 4).astype("int32"))
    x = np.random.default_rng(0).normal(size=(12, dims[-1]))
    nested, inner = NestedLoss(make(), dims, weights), make()
    prefixes = lambda e: sum(w * inner(labels, l2_normalize(e[:, :d])) for d, w in zip(dims, weights))  # noqa: E731
    return lambda e: nested(labels, e), prefixes, x


def equivalence_pairs():
    """`name -> (fn, same_fn, x)`: two ways to one value, which must agree in value and gradient at `x`."""
    pairs = {f"terms/{name}": terms_pair(make) for name, make in TERMS_LOSSES.items()}
    pairs.update({name: nested_pair(*spec) for name, spec in NESTED_LOSSES.items()})
    return pairs


def compare_pair(name, first, second):
    if np.isclose(first[0], second[0], rtol=1e-5) and np.allclose(first[1], second[1], atol=1e-5):
        return None
    return f"{name}: {first[0]!r} one way, {second[0]!r} the other"


def check_cases_and_equivalences(cases, pairs):
    """Failure lines of `cases` and of the equivalence `pairs`, every function evaluated in one call."""
    fns = [case_function(case) for case in cases]
    xs = [case.embeddings for case in cases]
    for first, second, x in pairs.values():
        fns += [first, second]
        xs += [x, x]
    results = values_and_gradients(fns, xs)
    failures = [compare_case(case, *result) for case, result in zip(cases, results)]
    pair_results = results[len(cases) :]
    failures += [compare_pair(name, *pair_results[2 * i : 2 * i + 2]) for i, name in enumerate(pairs)]
    return [line for line in failures if line]


def seed_without_tensorflow(seed):
    """`keras.utils.set_random_seed(seed)` for these fits, less its `tf.random.set_seed`: importing TensorFlow
    would cost a JAX or PyTorch run seconds, and no TensorFlow op draws here (Keras' initializers take their
    default seeds from Python's `random`)."""
    random.seed(seed)
    np.random.seed(seed)
    if keras.backend.backend() == "torch":
        import torch

        torch.manual_seed(seed)


def check_fit(name, make, epochs=6):
    """None if `model.fit` of a small embedder lowers the loss `make()`, else a line saying what happened."""
    seed_without_tensorflow(0)
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 8).astype("int32")
    x = (rng.normal(size=(4, 8))[labels] + 0.8 * rng.normal(size=(32, 8))).astype("float32")
    loss = make()
    width = loss.dims[-1] if isinstance(loss, NestedLoss) else 4
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(width)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss)
    history = model.fit(x, labels, batch_size=32, epochs=epochs, shuffle=False, verbose=0).history["loss"]
    if not (np.all(np.isfinite(history)) and history[-1] < 0.9 * history[0]):
        return f"fit/{name}: losses {history}"
    return None


def summary(backend, failures):
    pairs = len(TERMS_LOSSES) + len(NESTED_LOSSES)
    return f"{backend}: {len(CASES)} cases, {pairs} equivalences, {len(FIT_LOSSES)} fits, {failures} failures"


def main(selected=None):
    cases = [case for case in CASES if selected is None or case.name.startswith(selected)]
    failures = check_cases_and_equivalences(cases, equivalence_pairs())
    failures += [line for line in (check_fit(name, make) for name, make in FIT_LOSSES.items()) if line]
    print(summary(keras.backend.backend(), len(failures)))
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
