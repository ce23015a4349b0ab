"""The tfdml losses' forward + backward time per call on Keras' JAX backend (CPU), for `bench_losses.py`.

Keras fixes its backend per process, so `bench_losses.py` runs this script once, in a subprocess with
`KERAS_BACKEND=jax`, for all its configurations:
`python -m benchmarks.losses.jax_times '<json list of [loss, B, D]>' repeats`.
It times `jax.jit(jax.value_and_grad(loss))` on the same batches (`make_batch`) and prints one JSON line per
configuration: `{"loss", "B", "D", "jax_ms", "jax_median_ms", "jax_value"}` (or `"jax_skipped"` with the
reason for a loss that does not run on JAX yet).
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.losses.bench_losses import CLUSTERED, LOSSES, make_batch, time_call  # noqa: E402


def jax_runner(loss, labels, embeddings):
    labels, embeddings = jax.numpy.asarray(labels), jax.numpy.asarray(embeddings)
    step = jax.jit(jax.value_and_grad(lambda x: loss(labels, x)))

    def run():
        value, grad = step(embeddings)
        return float(value), np.asarray(grad)

    return run


def time_on_jax(name, batch_size, dim, repeats):
    row = {"loss": name, "B": batch_size, "D": dim}
    if name not in LOSSES:
        return {**row, "jax_skipped": "not in this benchmark's table"}
    labels, embeddings = make_batch(batch_size, dim, clustered=name in CLUSTERED)
    try:
        run = jax_runner(LOSSES[name][0](), labels, embeddings)
        value = run()[0]
    except Exception as error:  # a loss still written in TensorFlow: say so in the results
        return {**row, "jax_skipped": f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"}
    best, median, _ = time_call(run, repeats)
    return {**row, "jax_ms": round(best, 3), "jax_median_ms": round(median, 3), "jax_value": value}


if __name__ == "__main__":
    for name, batch_size, dim in json.loads(sys.argv[1]):
        print(json.dumps(time_on_jax(name, batch_size, dim, int(sys.argv[2]))), flush=True)
