"""Forward + backward time per call of the tfdml losses against pytorch-metric-learning (PML).

For every loss, batch size B and embedding size D the script times one loss evaluation plus its gradient
with respect to the (L2-normalised) embeddings: tfdml inside `tf.function`, with and without
`jit_compile`, and the PML equivalent on the same inputs in the same process. Both frameworks use the same
number of threads (`--threads`, default 2). One JSON line per configuration:

    {"loss", "B", "D", "tfdml_ms", "tfdml_xla_ms", "peer", "peer_ms", "speedup", "*_median_ms",
     "speedup_median", "*_cpu_ms", "speedup_cpu", "tfdml_value", "peer_value", "threads", "load_avg_1min"}

With `--jax` the same losses are also timed on Keras' JAX backend (`jax.jit` of value and gradient, in one
subprocess: `jax_times.py`), adding `"jax_ms", "jax_median_ms", "jax_value", "speedup_jax"` (PML's time over
JAX's) to each line, or `"jax_skipped"` with the reason for a loss that does not run on JAX yet.

Times are the best of the timed calls (`*_median_ms`: the median), the least disturbed by other processes
on a shared machine (spinning thread pools make loaded 2-thread timings erratic, PML's most). `speedup` is
`peer_ms / min(tfdml_ms, tfdml_xla_ms)`. The two values show that both compute the same thing (PML's
RankedListLoss adds 1e-5 per weight to its denominators, and PML's batch-hard triplet averages over the
non-zero terms only, so those two differ slightly).

Usage:
    python benchmarks/losses/bench_losses.py [--quick] [--losses ranked_list,triplet_all] [--repeats 20] [--threads 2]
        [--batch-sizes 60,180,1024] [--dims 64,512]
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def _threads_from_argv(default=2):
    """`--threads N` is read before TensorFlow and torch start their thread pools."""
    import sys

    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
    return default


THREADS = _threads_from_argv()
tf.config.threading.set_intra_op_parallelism_threads(THREADS)
tf.config.threading.set_inter_op_parallelism_threads(THREADS)

import torch  # noqa: E402
from pytorch_metric_learning import losses as pml_losses  # noqa: E402
from pytorch_metric_learning import miners as pml_miners  # noqa: E402

import tfdml.losses as tfdml_losses  # noqa: E402

torch.set_num_threads(THREADS)

SAMPLES_PER_CLASS = 4


def _tfdml_margin_loss():
    if not hasattr(tfdml_losses, "MarginLoss"):
        return None
    return tfdml_losses.MarginLoss(alpha=0.2, beta=1.2, learn_beta=False, sampling="all")


def _pml_with_miner(loss, miner):
    def call(embeddings, labels):
        return loss(embeddings, labels, miner(embeddings, labels))

    return call


# name -> (tfdml loss factory, PML description, PML loss factory)
LOSSES = {
    # PML has no query weighting: compare like with like (uniform, eq. 14); "official" costs the same.
    "ranked_list": (
        lambda: tfdml_losses.RankedListLoss(margin=0.4, tn=10.0, query_weighting="uniform"),
        "RankedListLoss(margin=0.4, Tn=10)",
        lambda: pml_losses.RankedListLoss(margin=0.4, Tn=10),
    ),
    "ranked_list_official": (
        lambda: tfdml_losses.RankedListLoss(margin=0.4, tn=10.0),
        "RankedListLoss(margin=0.4, Tn=10) (tfdml: official query weighting)",
        lambda: pml_losses.RankedListLoss(margin=0.4, Tn=10),
    ),
    "triplet_all": (
        lambda: tfdml_losses.TripletLoss(margin=0.2, mining="all"),
        "TripletMarginLoss(margin=0.2), all triplets",
        lambda: pml_losses.TripletMarginLoss(margin=0.2),
    ),
    "triplet_hard": (
        lambda: tfdml_losses.TripletLoss(margin=0.2, mining="hard"),
        "TripletMarginLoss(margin=0.2) + BatchHardMiner()",
        lambda: _pml_with_miner(pml_losses.TripletMarginLoss(margin=0.2), pml_miners.BatchHardMiner()),
    ),
    "triplet_semi_hard": (
        lambda: tfdml_losses.TripletLoss(margin=0.2, mining="semi_hard"),
        "TripletMarginLoss(margin=0.2) + TripletMarginMiner(0.2, 'semihard')",
        lambda: _pml_with_miner(
            pml_losses.TripletMarginLoss(margin=0.2), pml_miners.TripletMarginMiner(0.2, type_of_triplets="semihard")
        ),
    ),
    "margin": (
        _tfdml_margin_loss,
        "MarginLoss(margin=0.2, beta=1.2), all triplets",
        lambda: pml_losses.MarginLoss(margin=0.2, beta=1.2),
    ),
    "contrastive": (
        lambda: tfdml_losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0),
        "ContrastiveLoss(pos_margin=0, neg_margin=1)",
        lambda: pml_losses.ContrastiveLoss(pos_margin=0.0, neg_margin=1.0),
    ),
}


# Losses timed on a mid-training-like batch instead of uniform random vectors: in 512-D uniform points all
# lie ~sqrt(2) apart, so RLL (alpha = 1.2) mines no negative at all and its query weights are all equal.
CLUSTERED = {"ranked_list", "ranked_list_official"}


def make_batch(batch_size, dim, seed=0, clustered=False):
    """Class-balanced labels (4 per class, shuffled) and L2-normalised float32 embeddings.

    `clustered`: class centres in a random 16-D subspace plus isotropic noise, so that every query has
    close negatives and far positives at different distances (RLL mines both sets, as in training)."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(batch_size // SAMPLES_PER_CLASS + 1), SAMPLES_PER_CLASS)[:batch_size]
    rng.shuffle(labels)
    if clustered:
        basis = np.linalg.qr(rng.normal(size=(dim, min(16, dim))))[0]
        centres = rng.normal(size=(labels.max() + 1, basis.shape[1])) @ basis.T
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
        embeddings = (centres[labels] + 0.75 * rng.normal(size=(batch_size, dim)) / np.sqrt(dim)).astype(np.float32)
    else:
        embeddings = rng.normal(size=(batch_size, dim)).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return labels.astype(np.int32), embeddings


def time_call(fn, repeats, min_seconds=0.5):
    """`(best, median, median CPU)` time in ms of `fn()` after two warm-up calls; at least `repeats` calls
    (or `min_seconds`). The best call is the least disturbed by other processes on a shared machine; the CPU
    time (this process, all threads) is what the call costs regardless of waiting for a core, but counts
    spinning thread pools as work (compare CPU times with `--threads 1`)."""
    fn()
    fn()
    times, cpu_times = [], []
    start = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < min_seconds and len(times) < 10 * repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        if times[-1] > 5.0 and len(times) >= 3:  # very slow configurations: three calls are enough
            break
    return 1000.0 * float(np.min(times)), 1000.0 * float(np.median(times)), 1000.0 * float(np.median(cpu_times))


def tfdml_runner(loss, labels, embeddings, jit_compile):
    labels = tf.constant(labels)
    embeddings = tf.constant(embeddings)

    @tf.function(jit_compile=jit_compile)
    def step(labels, embeddings):
        with tf.GradientTape() as tape:
            tape.watch(embeddings)
            value = loss(labels, embeddings)
        return value, tape.gradient(value, embeddings)

    def run():
        value, grad = step(labels, embeddings)
        return float(value.numpy()), grad.numpy()

    return run


def pml_runner(loss, labels, embeddings):
    labels = torch.from_numpy(labels.astype(np.int64))
    base = torch.from_numpy(embeddings)

    def run():
        emb = base.clone().requires_grad_(True)
        value = loss(emb, labels)
        value.backward()
        return float(value.detach()), emb.grad.numpy()

    return run


def bench(name, batch_size, dim, repeats):
    make_tfdml, peer_name, make_peer = LOSSES[name]
    loss = make_tfdml()
    if loss is None:
        return {"loss": name, "B": batch_size, "D": dim, "skipped": "tfdml has no such loss yet"}
    labels, embeddings = make_batch(batch_size, dim, clustered=name in CLUSTERED)
    eager = tfdml_runner(loss, labels, embeddings, jit_compile=False)
    xla = tfdml_runner(make_tfdml(), labels, embeddings, jit_compile=True)
    peer = pml_runner(make_peer(), labels, embeddings)
    return timed_comparison(name, batch_size, dim, repeats, eager, xla, peer, peer_name)


# ------------------------------------------- losses ported from pytorch-metric-learning (MS, Circle, proxies ...)
# name -> (tfdml factory(num_classes, dim), PML description, PML factory(num_classes, dim), PML weight attribute
# holding the proxies or None, whether PML stores them transposed ([D, C])). Proxy losses compare the gradient
# with respect to the embeddings *and* the proxies (PML's backward computes both).
PORTED = {
    "multi_similarity": (
        lambda c, d: tfdml_losses.MultiSimilarityLoss(mining_epsilon=0.1),
        "MultiSimilarityLoss() + MultiSimilarityMiner(0.1)",
        lambda c, d: _pml_with_miner(pml_losses.MultiSimilarityLoss(), pml_miners.MultiSimilarityMiner(0.1)),
        None,
        False,
    ),
    "circle": (
        lambda c, d: tfdml_losses.CircleLoss(),
        "CircleLoss(m=0.4, gamma=80)",
        lambda c, d: pml_losses.CircleLoss(),
        None,
        False,
    ),
    "lifted_structure": (
        lambda c, d: tfdml_losses.LiftedStructureLoss(),
        "LiftedStructureLoss(1, 0)",
        lambda c, d: pml_losses.LiftedStructureLoss(),
        None,
        False,
    ),
    "n_pairs": (
        lambda c, d: tfdml_losses.NPairsLoss(),
        "NPairsLoss()",
        lambda c, d: pml_losses.NPairsLoss(),
        None,
        False,
    ),
    "supcon": (
        lambda c, d: tfdml_losses.SupConLoss(),
        "SupConLoss(0.1)",
        lambda c, d: pml_losses.SupConLoss(),
        None,
        False,
    ),
    "ntxent": (
        lambda c, d: tfdml_losses.NTXentLoss(),
        "NTXentLoss(0.07)",
        lambda c, d: pml_losses.NTXentLoss(),
        None,
        False,
    ),
    "proxy_anchor": (
        lambda c, d: tfdml_losses.ProxyAnchorLoss(c, d),
        "ProxyAnchorLoss(margin=0.1, alpha=32)",
        lambda c, d: pml_losses.ProxyAnchorLoss(c, d),
        "proxies",
        False,
    ),
    "proxy_nca": (
        lambda c, d: tfdml_losses.ProxyNCALoss(c, d),
        "ProxyNCALoss(softmax_scale=1)",
        lambda c, d: pml_losses.ProxyNCALoss(c, d),
        "proxies",
        False,
    ),
    "normalized_softmax": (
        lambda c, d: tfdml_losses.NormalizedSoftmaxLoss(c, d),
        "NormalizedSoftmaxLoss(0.05)",
        lambda c, d: pml_losses.NormalizedSoftmaxLoss(c, d),
        "W",
        True,
    ),
    "arcface": (
        lambda c, d: tfdml_losses.ArcFaceLoss(c, d),
        "ArcFaceLoss(28.6, 64)",
        lambda c, d: pml_losses.ArcFaceLoss(c, d),
        "W",
        True,
    ),
    "cosface": (
        lambda c, d: tfdml_losses.CosFaceLoss(c, d),
        "CosFaceLoss(0.35, 64)",
        lambda c, d: pml_losses.CosFaceLoss(c, d),
        "W",
        True,
    ),
}


def _pml_pair_matrix_elements(labels):
    """PML's LiftedStructureLoss and NTXentLoss build [positive pairs, negative pairs] matrices (several, float
    and bool): 3.2e9 elements at B = 1024 with 4 samples per class, beyond this machine's memory."""
    same = labels[:, None] == labels[None, :]
    return int(same.sum() - len(labels)) * int((~same).sum())


# PML runs skipped above this many elements in one matrix (2e8 float32 = 0.8 GB, and PML holds several).
PEER_ELEMENT_LIMIT = 2 * 10**8


def ported_tfdml_runner(loss, labels, embeddings, jit_compile):
    """Like `tfdml_runner`, with the gradient of the proxies as well for losses that own them."""
    labels = tf.constant(labels)
    embeddings = tf.constant(embeddings)
    variables = list(loss.trainable_variables)

    @tf.function(jit_compile=jit_compile)
    def step(labels, embeddings):
        with tf.GradientTape() as tape:
            tape.watch(embeddings)
            value = loss(labels, embeddings)
        return value, tape.gradient(value, [embeddings] + variables)

    def run():
        value, grads = step(labels, embeddings)
        return float(value.numpy()), grads[0].numpy()

    return run


def bench_ported(name, batch_size, dim, repeats):
    make_tfdml, peer_name, make_peer, weight_name, transposed = PORTED[name]
    labels, embeddings = make_batch(batch_size, dim)
    num_classes = int(labels.max()) + 1
    loss, xla_loss, peer_loss = make_tfdml(num_classes, dim), make_tfdml(num_classes, dim), make_peer(num_classes, dim)
    if weight_name is not None:  # the same proxies everywhere, so the values agree
        proxies = loss.proxies.numpy()
        xla_loss.proxies.assign(proxies)
        with torch.no_grad():
            getattr(peer_loss, weight_name).copy_(torch.from_numpy(proxies.T if transposed else proxies))
    eager = ported_tfdml_runner(loss, labels, embeddings, jit_compile=False)
    xla = ported_tfdml_runner(xla_loss, labels, embeddings, jit_compile=True)
    if name in ("lifted_structure", "ntxent") and _pml_pair_matrix_elements(labels) > PEER_ELEMENT_LIMIT:
        elements = _pml_pair_matrix_elements(labels)
        tfdml_ms = time_call(eager, repeats)[0]
        tfdml_xla_ms = time_call(xla, repeats)[0]
        return {
            "loss": name,
            "B": batch_size,
            "D": dim,
            "tfdml_ms": round(tfdml_ms, 3),
            "tfdml_xla_ms": round(tfdml_xla_ms, 3),
            "peer_ms": None,
            "skipped_peer": f"PML would build a {elements:.2e}-element [positive pairs, negative pairs] matrix",
        }
    peer = pml_runner(peer_loss, labels, embeddings)
    return timed_comparison(name, batch_size, dim, repeats, eager, xla, peer, peer_name, num_classes=num_classes)


def timed_comparison(name, batch_size, dim, repeats, eager, xla, peer, peer_name, **extra):
    """Times the three runners and returns the JSON record described in the module docstring."""
    tfdml_ms, tfdml_median, tfdml_cpu = time_call(eager, repeats)
    tfdml_xla_ms, tfdml_xla_median, tfdml_xla_cpu = time_call(xla, repeats)
    peer_ms, peer_median, peer_cpu = time_call(peer, max(5, repeats // 2))
    return {
        "loss": name,
        "B": batch_size,
        "D": dim,
        **extra,
        "tfdml_ms": round(tfdml_ms, 3),
        "tfdml_xla_ms": round(tfdml_xla_ms, 3),
        "peer": "pytorch-metric-learning " + peer_name,
        "peer_ms": round(peer_ms, 3),
        "speedup": round(peer_ms / min(tfdml_ms, tfdml_xla_ms), 2),
        "tfdml_median_ms": round(tfdml_median, 3),
        "tfdml_xla_median_ms": round(tfdml_xla_median, 3),
        "peer_median_ms": round(peer_median, 3),
        "speedup_median": round(peer_median / min(tfdml_median, tfdml_xla_median), 2),
        "tfdml_cpu_ms": round(tfdml_cpu, 3),
        "tfdml_xla_cpu_ms": round(tfdml_xla_cpu, 3),
        "peer_cpu_ms": round(peer_cpu, 3),
        "speedup_cpu": round(peer_cpu / min(tfdml_cpu, tfdml_xla_cpu), 2),
        "tfdml_value": eager()[0],
        "peer_value": peer()[0],
        "threads": THREADS,
        "load_avg_1min": round(os.getloadavg()[0], 2),  # other processes on the machine skew all timings
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B in {60, 180}, D = 64, few repeats")
    choices = list(LOSSES) + list(PORTED)
    parser.add_argument("--losses", default=",".join(choices), help=f"comma-separated subset of {choices}")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per configuration (tfdml)")
    parser.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes (default 60,180,1024)")
    parser.add_argument("--dims", default=None, help="comma-separated embedding sizes (default 64,512)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both TensorFlow and torch (2)")
    parser.add_argument("--jax", action="store_true", help="also time tfdml on Keras' JAX backend (jax_ms)")
    args = parser.parse_args()
    names = [n.strip() for n in args.losses.split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown:
        parser.error(f"unknown losses {unknown}; choose from {choices}")
    batch_sizes = [60, 180] if args.quick else [60, 180, 1024]
    dims = [64] if args.quick else [64, 512]
    if args.batch_sizes:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.dims:
        dims = [int(d) for d in args.dims.split(",")]
    repeats = min(args.repeats, 5) if args.quick else args.repeats
    configs = [(name, b, d) for name in names for b in batch_sizes for d in dims]
    on_jax = jax_times(configs, repeats) if args.jax else {}
    for name, batch_size, dim in configs:
        run = bench_ported if name in PORTED else bench
        row = run(name, batch_size, dim, repeats)
        jax_row = on_jax.get((name, batch_size, dim), {})
        row.update({k: v for k, v in jax_row.items() if k.startswith("jax")})
        if "jax_ms" in row and "peer_ms" in row:
            row["speedup_jax"] = round(row["peer_ms"] / row["jax_ms"], 2)
        print(json.dumps(row), flush=True)


def jax_times(configs, repeats):
    """`{(loss, B, D): row}` of `jax_times.py`, run in one subprocess on Keras' JAX backend (the backend is
    fixed per process); {} with a note on stderr when JAX is not installed."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("jax") is None:
        print("jax is not installed: no JAX figures", file=sys.stderr)
        return {}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={THREADS}"
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.losses.jax_times", json.dumps(configs), str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        cwd=root,
    )
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode:
        print(out.stderr[-2000:], file=sys.stderr)
    return {(r["loss"], r["B"], r["D"]): r for r in rows}


if __name__ == "__main__":
    main()
