"""Forward + backward of one loss call, timed: tfdml on JAX (one `jax.jit` program) and PML on PyTorch.

Each runner returns only once the device has finished (`jax.block_until_ready`, `torch.cuda.synchronize`), so a
wall-clock time around it is the call's time. The first call (tracing and compilation) and a second warm-up call
are outside the timed calls. Both sides compute the gradient with respect to the embeddings and, for losses that
own proxies, the proxies (PML's backward computes both).
"""

import math
import sys
import time
import traceback

import loss_table
import numpy as np


def time_calls(run, min_calls=5, min_seconds=0.3, max_calls=500, max_seconds=3.0):
    """`{"best_ms", "median_ms", "calls", "first_call_s", "value"}` for `run()`, which returns the loss value
    once the device is done. The first call (compilation) is timed apart; then one more warm-up call; then at
    least `min_calls` calls over at least `min_seconds`, stopping at `max_calls` or, past three calls,
    `max_seconds`."""
    start = time.perf_counter()
    value = float(run())
    first_call_s = time.perf_counter() - start
    run()
    times = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        enough = len(times) >= min_calls and elapsed >= min_seconds
        if enough or len(times) >= max_calls or (len(times) >= 3 and elapsed >= max_seconds):
            break
    return {
        "best_ms": 1000.0 * float(np.min(times)),
        "median_ms": 1000.0 * float(np.median(times)),
        "calls": len(times),
        "first_call_s": first_call_s,
        "value": value,
    }


def jax_runner(loss, labels, inputs, device):
    """tfdml's forward + backward as one jitted program on `device` (a `jax.Device`). The loss's own variables
    (Proxy-Anchor's proxies) are arguments, mapped onto the Keras variables by a `keras.StatelessScope`, so that
    the program differentiates them and holds no device constant of another device."""
    import jax
    import keras

    variables = list(loss.trainable_variables)

    def value(x, variable_values, y):
        with keras.StatelessScope(state_mapping=list(zip(variables, variable_values))):
            return loss(y, x)

    step = jax.jit(jax.value_and_grad(value, argnums=(0, 1)))
    args = jax.device_put((inputs, [np.asarray(v.value) for v in variables], labels), device)

    def run():
        out = jax.block_until_ready(step(*args))
        return out[0]

    return run


def torch_runner(loss, labels, inputs, device):
    """PML's forward + backward on `device` (a `torch.device`); the proxies' gradients are reset at each call."""
    import torch

    if isinstance(loss, torch.nn.Module):
        loss = loss.to(device)
    parameters = list(loss.parameters()) if isinstance(loss, torch.nn.Module) else []
    y = torch.as_tensor(labels.astype(np.int64), device=device)
    base = torch.as_tensor(inputs, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run():
        for parameter in parameters:
            parameter.grad = None
        x = base.detach().clone().requires_grad_(True)
        value = loss(x, y)
        value.backward()
        sync()
        return value.detach()

    return run


def _copy_proxies(case, tfdml_loss, peer_loss):
    """PML's proxies set to tfdml's, so that both losses compute the same value."""
    import torch

    proxies = np.asarray(tfdml_loss.trainable_variables[0].value)
    with torch.no_grad():
        getattr(peer_loss, case.peer_proxies).copy_(torch.tensor(proxies.T if case.peer_transposed else proxies))


def error_text(exc):
    """The exception's type and first line for the JSON; the whole traceback goes to stderr."""
    traceback.print_exception(exc, file=sys.stderr)
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:400]}" if lines else type(exc).__name__


def _finite_or_none(value):
    return value if math.isfinite(value) else None


def compare(case, batch_size, dim, jax_device, torch_device, timing):
    """One JSON row: tfdml on `jax_device` against PML on `torch_device` (None: tfdml alone) for one loss and B.
    A side that fails records its error instead of a time; `speedup` is PML's best time over tfdml's."""
    labels, inputs, num_classes = loss_table.loss_inputs(case, batch_size, dim)
    row = {"loss": case.name, "B": batch_size, "D": dim, "jax_device": str(jax_device)}
    tfdml_loss = None
    try:
        tfdml_loss = case.make_tfdml(num_classes, dim)
        row.update(_side("tfdml", time_calls(jax_runner(tfdml_loss, labels, inputs, jax_device), **timing)))
    except Exception as exc:  # a loss that fails on this backend is recorded, and the others go on
        row["tfdml_error"] = error_text(exc)
    if torch_device is None:
        return row
    if case.peer is None:
        row["peer_skipped"] = "pytorch-metric-learning has no such loss"
        return row
    row.update(peer="pytorch-metric-learning " + case.peer, torch_device=str(torch_device))
    try:
        peer_loss = case.make_peer(num_classes, dim)
        if case.peer_proxies is not None:
            if tfdml_loss is None:
                raise RuntimeError("tfdml's proxies are needed to set PML's, and the tfdml loss was not built")
            _copy_proxies(case, tfdml_loss, peer_loss)
        row.update(_side("peer", time_calls(torch_runner(peer_loss, labels, inputs, torch_device), **timing)))
    except Exception as exc:
        row["peer_error"] = error_text(exc)
    if "tfdml_ms" in row and "peer_ms" in row:
        row["speedup"] = row["peer_ms"] / row["tfdml_ms"]
        row["speedup_median"] = row["peer_median_ms"] / row["tfdml_median_ms"]
    return row


def _side(prefix, timed):
    side = {
        f"{prefix}_ms": timed["best_ms"],
        f"{prefix}_median_ms": timed["median_ms"],
        f"{prefix}_calls": timed["calls"],
        f"{prefix}_first_call_s": timed["first_call_s"],
        f"{prefix}_value": _finite_or_none(timed["value"]),
    }
    if side[f"{prefix}_value"] is None:
        side[f"{prefix}_nonfinite_value"] = repr(timed["value"])
    return side
