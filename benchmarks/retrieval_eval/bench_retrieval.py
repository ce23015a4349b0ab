"""Retrieval benchmarks; prints one JSON object per task.

Task `eval` (default): full evaluation (Recall@{1,10,100}, MAP@R) of SOP-sized clustered synthetic
embeddings (60,000 x 512, ~11.3k classes of 2-12 items, classes grouped in 12 super-categories like SOP's),
all-vs-all top-101 with the query itself excluded:

- `numpy_exact`: independent NumPy reference (float32 matmul + argpartition + stable sort, metrics written
  from the formulas here);
- `faiss_flat`: faiss `IndexFlatL2` (what pytorch-metric-learning's AccuracyCalculator uses), metrics with the
  same NumPy reference code;
- `matmul_only`: the float32 `[chunk, 60000]` matmuls alone (the floor for exact search);
- `tfdml_exact`: `tfdml.retrieval.evaluate(..., exact=True)`;
- `tfdml_approximate`: `tfdml.retrieval.evaluate(..., exact=False)` (ScaNN tree + AH + reorder, auto settings).

Task `qps`: queries/s at Recall@10 >= 0.95 (against exact neighbours) on 1,000,000 x 128 clustered vectors,
ScaNN (`tfdml.retrieval.ScannIndex`, auto settings, sweeping leaves searched) against faiss `IndexIVFFlat`
(sweeping nprobe; `--hnsw` adds `IndexHNSWFlat`, whose build takes long on 2 cores).

Task `scale`: evaluation at scale, time and peak memory: `tfdml.retrieval.evaluate` (exact, and
`exact=False`: ScaNN, the index meeting its recall target) beside pytorch-metric-learning's
`AccuracyCalculator` (`pml_faiss`: its defaults, faiss `IndexFlatL2`, `k="max_bin_count"`;
`pml_faiss_hnsw`: its options for a large gallery, an HNSW index and a label comparison function that
counts matches class by class) on the same SOP-like embeddings, the same metrics (R@1, MAP@R,
R-precision), each in its own process; peak memory is the process's peak resident memory above what it
held after generating the data (`VmHWM`).

    python -m benchmarks.retrieval_eval.bench_retrieval --task eval [--n 60000 --dim 512] [--skip faiss_flat]
    python -m benchmarks.retrieval_eval.bench_retrieval --task qps [--n 1000000 --dim 128 --queries 5000] [--hnsw]
    python -m benchmarks.retrieval_eval.bench_retrieval --task scale --n 100000 [--runs tfdml_exact pml_faiss ...]
    python -m benchmarks.retrieval_eval.bench_retrieval --task scale --table scale_100000.json > scale_table.md
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

# Figures measured on the reference 2-core machine for all-vs-all top-101 of 60,000 x 512 (the issue).
PEER_SECONDS = {"faiss_flat": 81.0, "scann_brute_force": 73.0, "tf_matmul_top_k": 69.0, "matmul_only": 55.0}


def sop_like(n, dim, seed=0, super_classes=12, spread=0.6, class_spread=0.27):
    """Unit-norm clustered embeddings with SOP-like class sizes (2-12) inside super-categories."""
    rng = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < n:
        sizes.append(int(rng.integers(2, 13)))
    sizes[-1] -= sum(sizes) - n
    if sizes[-1] < 2:
        sizes[-2] += sizes.pop()
    classes = len(sizes)
    supers = rng.normal(size=(super_classes, dim))
    supers /= np.linalg.norm(supers, axis=1, keepdims=True)
    centres = supers[rng.integers(0, super_classes, classes)] + class_spread * rng.normal(
        size=(classes, dim)
    ) / np.sqrt(dim)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = np.repeat(np.arange(classes), sizes)
    x = centres[labels] + spread * rng.normal(size=(n, dim)) / np.sqrt(dim)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    order = rng.permutation(n)
    return x[order].astype(np.float32), labels[order]


def reference_metrics(neighbours, labels, ks, query_labels=None):
    """Recall@K, MAP@R and R-precision written from the formulas (same-set mode, the query already removed):
    every item a query, or the queries of `query_labels` (items of the set whose neighbours are `neighbours`)."""
    query_labels = labels if query_labels is None else query_labels
    hits = labels[neighbours] == query_labels[:, None]
    counts = np.bincount(labels)
    r = counts[query_labels] - 1
    valid = r > 0
    hits, r = hits[valid], r[valid]
    out = {f"recall@{k}": float(np.mean(hits[:, :k].any(axis=1))) for k in ks}
    ranks = np.arange(1, hits.shape[1] + 1)
    relevant = hits & (ranks[None, :] <= r[:, None])
    precision = np.cumsum(relevant, axis=1) / ranks[None, :]
    out["map@r"] = float(np.mean((precision * relevant).sum(axis=1) / r))
    out["r_precision"] = float(np.mean(relevant.sum(axis=1) / r))
    return out


def drop_self(found, k):
    """`[Q, k+1]` -> `[Q, k]` without each query's own row (or the last one if absent)."""
    own = found == np.arange(len(found))[:, None]
    drop = np.where(own.any(axis=1), own.argmax(axis=1), k)
    return found[np.arange(k + 1)[None, :] != drop[:, None]].reshape(len(found), k)


def numpy_exact(x, k, chunk=1024, queries=None):
    """Each query's `k` nearest items of `x` by L2, itself left out: every item a query, or those `queries`
    indexes."""
    queries = np.arange(len(x)) if queries is None else queries
    sq = np.einsum("ij,ij->i", x, x)
    out = np.empty((len(queries), k), np.int64)
    for s in range(0, len(queries), chunk):
        rows = queries[s : s + chunk]
        d = sq[None, :] - 2.0 * (x[rows] @ x.T)
        d[np.arange(len(d)), rows] = np.inf
        part = np.argpartition(d, k, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(d, part, axis=1), axis=1, kind="stable")
        out[s : s + chunk] = np.take_along_axis(part, order, axis=1)
    return out


def timed(fn, repeats=1):
    """`(value, seconds)`: the best of `repeats` runs (short searches are noisy on a shared machine)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return value, best


def bench_eval(args):
    import tensorflow as tf

    from tfdml.ops.neighbours import DEFAULT_MEMORY_BUDGET, search_chunk_rows
    from tfdml.retrieval import evaluate

    ks = (1, 10, 100)
    k = max(ks) + 1  # one extra so the query itself can be dropped
    x, labels = sop_like(args.n, args.dim, seed=args.seed)
    skip = set(filter(None, args.skip.split(",")))
    result = {
        "task": "eval",
        "n": args.n,
        "dim": args.dim,
        "classes": int(labels.max() + 1),
        "cpu_count": os.cpu_count(),
        "peer_seconds_2_cores_60k": PEER_SECONDS,
        "runs": {},
    }
    runs = result["runs"]

    def record(name, metrics, seconds):
        runs[name] = {"seconds": round(seconds, 2), **{m: round(v, 5) for m, v in metrics.items()}}
        print(f"# {name}: {runs[name]}", file=sys.stderr, flush=True)

    if "matmul_only" not in skip:
        chunk = search_chunk_rows(args.n, max(ks), DEFAULT_MEMORY_BUDGET)
        gallery = tf.constant(x)

        @tf.function
        def block(q):
            return tf.reduce_max(tf.matmul(q, gallery, transpose_b=True))

        def matmuls():
            for s in range(0, args.n, chunk):
                block(tf.constant(x[s : s + chunk])).numpy()

        block(tf.constant(x[:chunk]))
        _, seconds = timed(matmuls)
        runs["matmul_only"] = {"seconds": round(seconds, 2)}
        print(f"# matmul_only: {seconds:.1f}s", file=sys.stderr, flush=True)
    ref = None
    if "numpy_exact" not in skip:
        found, seconds = timed(lambda: numpy_exact(x, k)[:, : max(ks)])
        ref = reference_metrics(found, labels, ks)
        record("numpy_exact", ref, seconds)
    if "faiss_flat" not in skip:
        import faiss

        def faiss_search():
            index = faiss.IndexFlatL2(args.dim)
            index.add(x)
            return index.search(x, k)[1]

        found, seconds = timed(faiss_search)
        record("faiss_flat", reference_metrics(drop_self(found, max(ks)), labels, ks), seconds)
    metrics = ("recall", "map@r")
    if "tfdml_exact" not in skip:
        res, seconds = timed(lambda: evaluate(x, labels, ks=ks, metrics=metrics, exact=True))
        record("tfdml_exact", res, seconds)
    if "tfdml_approximate" not in skip:
        from tfdml.retrieval import auto_settings

        res, seconds = timed(lambda: evaluate(x, labels, ks=ks, metrics=metrics, exact=False))
        record("tfdml_approximate", res, seconds)
        result["approximate_settings"] = auto_settings(args.n, args.dim, "squared_l2")
    base = runs.get("numpy_exact") or runs.get("faiss_flat")
    summary = {}
    if "tfdml_exact" in runs and "matmul_only" in runs:
        summary["exact_over_matmul_only"] = round(runs["tfdml_exact"]["seconds"] / runs["matmul_only"]["seconds"], 3)
    if "faiss_flat" in runs:
        for name in ("tfdml_exact", "tfdml_approximate"):
            if name in runs:
                summary[f"faiss_flat_over_{name}"] = round(runs["faiss_flat"]["seconds"] / runs[name]["seconds"], 3)
    if base:
        for name in ("tfdml_exact", "tfdml_approximate", "faiss_flat"):
            if name in runs and runs[name] is not base:
                summary[f"{name}_minus_reference_points"] = {
                    m: round(100 * (runs[name][m] - base[m]), 3)
                    for m in ("recall@1", "recall@10", "recall@100", "map@r")
                }
    result["summary"] = summary
    print(json.dumps(result, indent=2))


def neighbour_recall(found, truth):
    return float(np.mean([len(set(a) & set(b)) / truth.shape[1] for a, b in zip(found, truth)]))


def bench_qps(args):
    from tfdml.ops import exact_search
    from tfdml.retrieval import ScannIndex

    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((1000, args.dim), dtype=np.float32)
    assign = rng.integers(0, 1000, args.n + args.queries)
    data = centres[assign]
    data += 0.8 * rng.standard_normal(data.shape, dtype=np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    base, queries = data[: args.n], data[args.n :]
    truth, truth_s = timed(lambda: exact_search(queries, base, k=10)[0])
    result = {
        "task": "qps",
        "n": args.n,
        "dim": args.dim,
        "queries": args.queries,
        "target_recall@10": 0.95,
        "exact_ground_truth_seconds": round(truth_s, 1),
        "scann": [],
        "faiss_ivf": [],
        "faiss_hnsw": [],
    }
    print(f"# ground truth {truth_s:.1f}s", file=sys.stderr, flush=True)

    index, build_s = timed(lambda: ScannIndex(base, distance="dot_product", mode="approximate", num_neighbors=10))
    result["scann_build_seconds"] = round(build_s, 1)
    result["scann_settings"] = index.settings
    for leaves in (3, 5, 10, 20, 40):
        for reorder in (50, 100):
            (found, _), seconds = timed(
                lambda leaves=leaves, reorder=reorder: index.search(
                    queries, k=10, leaves_to_search=leaves, reorder=reorder
                ),
                repeats=3,
            )
            entry = {
                "leaves_to_search": leaves,
                "reorder": reorder,
                "recall@10": round(neighbour_recall(found, truth), 4),
                "qps": round(args.queries / seconds),
            }
            result["scann"].append(entry)
            print(f"# scann {entry}", file=sys.stderr, flush=True)
    import faiss

    def build_ivf():
        quantizer = faiss.IndexFlatIP(args.dim)
        ivf = faiss.IndexIVFFlat(quantizer, args.dim, 1000, faiss.METRIC_INNER_PRODUCT)
        ivf.train(base[rng.choice(args.n, min(args.n, 100000), replace=False)])
        ivf.add(base)
        return ivf

    ivf, ivf_s = timed(build_ivf)
    result["faiss_ivf_build_seconds"] = round(ivf_s, 1)
    for nprobe in (1, 2, 3, 5, 10, 20):
        ivf.nprobe = nprobe
        (_, found), seconds = timed(lambda: ivf.search(queries, 10), repeats=3)
        entry = {
            "nprobe": nprobe,
            "recall@10": round(neighbour_recall(found, truth), 4),
            "qps": round(args.queries / seconds),
        }
        result["faiss_ivf"].append(entry)
        print(f"# faiss ivf {entry}", file=sys.stderr, flush=True)
    if args.hnsw:
        hnsw = faiss.IndexHNSWFlat(args.dim, 32, faiss.METRIC_INNER_PRODUCT)
        _, hnsw_s = timed(lambda: hnsw.add(base))
        result["faiss_hnsw_build_seconds"] = round(hnsw_s, 1)
        for ef in (16, 32, 64, 128):
            hnsw.hnsw.efSearch = ef
            (_, found), seconds = timed(lambda: hnsw.search(queries, 10), repeats=3)
            result["faiss_hnsw"].append(
                {
                    "efSearch": ef,
                    "recall@10": round(neighbour_recall(found, truth), 4),
                    "qps": round(args.queries / seconds),
                }
            )

    def best(entries):
        ok = [e for e in entries if e["recall@10"] >= 0.95]
        return max(ok, key=lambda e: e["qps"]) if ok else None

    result["best_at_recall_0.95"] = {
        "scann": best(result["scann"]),
        "faiss_ivf": best(result["faiss_ivf"]),
        "faiss_hnsw": best(result["faiss_hnsw"]),
    }
    s, f = result["best_at_recall_0.95"]["scann"], result["best_at_recall_0.95"]["faiss_ivf"]
    if s and f:
        result["scann_over_faiss_ivf_qps"] = round(s["qps"] / f["qps"], 2)
    print(json.dumps(result, indent=2))


SCALE_RUNS = ("tfdml_exact", "tfdml_approximate", "pml_faiss", "pml_faiss_hnsw", "numpy_exact_sample")
# numpy_exact_sample: the exact metrics of this many random queries (each against all N items), the reference
# where exact all-pairs search is out of reach (10^12 scores at 1,000,000 items).
EXACT_SAMPLE = 20000
# pml_faiss_hnsw's index: faiss IndexHNSWFlat(d, M), efConstruction 40, efSearch as below (k is 13 here).
PML_HNSW_M, PML_HNSW_EF_SEARCH = 32, 64


def _peak_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def scale_child(run, n, dim, seed):
    """One evaluation of the `scale` task in this process: `{seconds, peak_mib, metrics}`."""
    x, labels = sop_like(n, dim, seed=seed)
    if run == "numpy_exact_sample":

        def compute():
            queries = np.sort(np.random.default_rng(seed).choice(n, min(n, EXACT_SAMPLE), replace=False))
            neighbours = numpy_exact(x, int(np.bincount(labels).max()) - 1, chunk=128, queries=queries)
            found = reference_metrics(neighbours, labels, (1,), query_labels=labels[queries])
            return {"R@1": found["recall@1"], "MAP@R": found["map@r"], "R-precision": found["r_precision"]}

    elif run.startswith("tfdml"):
        from tfdml.retrieval import evaluate

        def compute():
            found = evaluate(x, labels, ks=(1,), metrics=("recall", "map@r", "r_precision"), exact=run == "tfdml_exact")
            return {"R@1": found["recall@1"], "MAP@R": found["map@r"], "R-precision": found["r_precision"]}

    else:
        import torch
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        options = {}
        if run == "pml_faiss_hnsw":
            # What PML offers for a large gallery, its own options: an approximate faiss index for the k-NN
            # (`FaissKNN(index_init_fn=...)`), and a label comparison function other than its built-in
            # `torch.eq`, which makes it count each class's matches in a loop over the classes instead of one
            # `[classes, N]` boolean tensor (143 GB at 1,000,000 SOP-like items).
            import faiss
            from pytorch_metric_learning.utils.inference import FaissKNN

            def hnsw(dim):
                index = faiss.IndexHNSWFlat(dim, PML_HNSW_M)
                index.hnsw.efConstruction, index.hnsw.efSearch = 40, PML_HNSW_EF_SEARCH
                return index

            options = {"knn_func": FaissKNN(index_init_fn=hnsw), "label_comparison_fn": lambda a, b: torch.eq(a, b)}
        calculator = AccuracyCalculator(
            include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
            k="max_bin_count",
            device=torch.device("cpu"),
            **options,
        )

        def compute():
            found = calculator.get_accuracy(torch.from_numpy(x), torch.from_numpy(labels))
            return {
                "R@1": found["precision_at_1"],
                "MAP@R": found["mean_average_precision_at_r"],
                "R-precision": found["r_precision"],
            }

    _reset_peak()
    base = _peak_mib()
    metrics, seconds = timed(compute)
    import resource

    return {
        "seconds": seconds,
        "peak_mib": _peak_mib() - base,
        # The process's whole peak (getrusage: data, libraries and the evaluation), for comparison.
        "process_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "data_mib": x.nbytes / 2**20,
        **metrics,
    }


def bench_scale(args):
    import subprocess

    result = {"task": "scale", "n": args.n, "dim": args.dim, "cpu_count": os.cpu_count(), "runs": {}}
    for run in args.runs:
        command = [sys.executable, __file__, "--task", "scale", "--child", run, "--n", str(args.n)]
        child = subprocess.Popen(
            command + ["--dim", str(args.dim)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        # The child's peak resident memory, read while it runs: what a run stopped at --timeout had reached.
        start, peak = time.perf_counter(), 0.0
        while child.poll() is None and time.perf_counter() - start < args.timeout:
            try:
                with open(f"/proc/{child.pid}/status") as f:
                    peak = max([peak] + [int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")])
            except OSError:
                pass
            time.sleep(2)
        if child.poll() is None:
            child.kill()
            child.communicate()
            row = {"error": f"stopped after {args.timeout:.0f} s", "process_peak_mib_so_far": peak}
        else:
            out, err = child.communicate()
            lines = out.strip().splitlines()
            row = json.loads(lines[-1]) if child.returncode == 0 and lines else {"error": err[-500:]}
        result["runs"][run] = row
        print(f"# {run}: {row}", file=sys.stderr, flush=True)
    result["n_squared_float32_mib"] = args.n * args.n * 4 / 2**20
    print(json.dumps(result, indent=2))


def scale_table(paths):
    """The `scale` results (JSON files written by the task) as one Markdown table."""
    lines = [
        "| items x dim | run | seconds | peak MiB | process peak MiB | N x N float32 MiB | R@1 | MAP@R | R-precision |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        for run, row in result["runs"].items():
            size = f"{result['n']:,} x {result['dim']}"
            if "error" in row:
                so_far = row.get("process_peak_mib_so_far")
                peak = f" (process peak {so_far:.0f} MiB so far)" if so_far else ""
                lines.append(f"| {size} | {run} | not finished: {row['error']}{peak} |||||||")
                continue
            process_peak = f"{row['process_peak_mib']:.0f}" if "process_peak_mib" in row else ""
            lines.append(
                f"| {size} | {run} | {row['seconds']:.1f} | {row['peak_mib']:.0f} | {process_peak} "
                f"| {result['n_squared_float32_mib']:,.0f} | {row['R@1']:.4f} | {row['MAP@R']:.4f} "
                f"| {row['R-precision']:.4f} |"
            )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["eval", "qps", "scale"], default="eval")
    parser.add_argument("--runs", nargs="+", choices=SCALE_RUNS, default=list(SCALE_RUNS), help="scale task: runs")
    parser.add_argument("--child", choices=SCALE_RUNS, help=argparse.SUPPRESS)
    parser.add_argument("--table", nargs="+", metavar="JSON", help="scale task: print these results as Markdown")
    parser.add_argument("--n", type=int, help="database size (default 60000 for eval, 1000000 for qps)")
    parser.add_argument("--dim", type=int, help="embedding size (default 512 for eval, 128 for qps)")
    parser.add_argument("--queries", type=int, default=5000, help="qps task: number of held-out queries")
    parser.add_argument("--skip", default="", help="eval task: comma-separated runs to skip")
    parser.add_argument("--hnsw", action="store_true", help="qps task: also build faiss HNSW (slow)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=float("inf"), help="scale task: seconds a run may take")
    args = parser.parse_args()
    if args.task == "scale":
        args.n, args.dim = args.n or 100000, args.dim or 512
        if args.table:
            print(scale_table(args.table))
        elif args.child:
            print(json.dumps(scale_child(args.child, args.n, args.dim, args.seed)))
        else:
            bench_scale(args)
    elif args.task == "eval":
        args.n, args.dim = args.n or 60000, args.dim or 512
        bench_eval(args)
    else:
        args.n, args.dim = args.n or 1000000, args.dim or 128
        bench_qps(args)


if __name__ == "__main__":
    main()
