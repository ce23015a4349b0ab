"""Benchmark of the exported `search` signature's gallery search against ScaNN and exact NumPy; prints JSON.

For galleries of 10k, 100k and 1M x 512 synthetic clustered unit vectors (clusters of ~50 items), each
method answers the same 256 held-out queries (k = 10), each in its own process (so that its memory is its
own):

- `tf_float32`, `tf_bfloat16`, `tf_int8`: `tfdml.export.search.GallerySearch` (what the `search` signature runs
  after the embedding: blocked matmul + `tf.math.top_k`, gallery in variables, ids and labels gathered, the
  match threshold applied) saved as a SavedModel and loaded back as TF Serving would load it;
- `numpy_exact`: float32 matmul + argpartition over the whole gallery (the reference for recall);
- `scann_brute_force`: ScaNN's exact brute force; `scann_tree_ah`: ScaNN tree + anisotropic hashing +
  exact re-ordering, `tfdml.retrieval.ScannIndex` auto settings (neither runs in stock TF Serving);
  `scann_tree_ah_10pct`: the same index searching 10 % of its leaves (the auto settings search 1 % above
  200k points; up to 200k they are the same search).

Per method and size: build seconds, median seconds per batch of 32 queries and per single query, resident
memory after building / loading and the peak while searching (MiB above the process baseline, from
/proc/self/status), the stored gallery bytes, neighbour recall@10 against `numpy_exact` and top-1
agreement with it. Ratios against `numpy_exact` and ScaNN are measured in the same run. The image
embedding itself (the model) is not part of these figures: it costs the same whichever search follows.

    nice python scripts/bench_search.py [--sizes 10000 100000 1000000] [--work /tmp/bench_search]

Results are kept in `<work>/results.json` (a finished method/size is not run again: delete the entry or the
file to measure again).
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's tfdml

import numpy as np  # noqa: E402

METHODS = (
    "numpy_exact",
    "tf_float32",
    "tf_bfloat16",
    "tf_int8",
    "scann_brute_force",
    "scann_tree_ah",
    "scann_tree_ah_10pct",
)
K = 10
BATCH = 32


def synthetic(size, dim, seed=0, chunk=100000):
    """`[size, dim]` float32 unit vectors around `size // 50` random unit centres (cosine ~0.5 within a
    cluster, ~0 across), generated in chunks so 1M x 512 needs no float64 copy."""
    rng = np.random.default_rng(seed)
    clusters = max(1, size // 50)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = np.empty((size, dim), np.float32)
    for start in range(0, size, chunk):
        n = min(chunk, size - start)
        noise = rng.standard_normal((n, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
        part = centres[rng.integers(0, clusters, n)] + noise
        out[start : start + n] = part / np.linalg.norm(part, axis=1, keepdims=True)
    return out


def queries_for(size, dim, count=256):
    """Held-out queries from the same clusters as the gallery of `size` (same centres, other noise)."""
    rng = np.random.default_rng(0)
    clusters = max(1, size // 50)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    noise = np.random.default_rng(12345).standard_normal((count, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
    picked = np.random.default_rng(54321).integers(0, clusters, count)
    q = centres[picked] + noise
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def memory_mib():
    """(resident, peak resident) MiB of this process."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line.split(":")[0]] = int(line.split()[1]) / 1024
    return values["VmRSS"], values["VmHWM"]


def reset_peak():
    """Starts a new peak (VmHWM) from the current resident memory (Linux: `clear_refs` 5), so that the peak
    while searching does not include building the gallery; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def timed(fn, queries):
    """Median seconds of `fn(batch)` for batches of 32 and of 1 query (after one warm-up call each)."""
    out = {}
    for name, size in (("seconds_per_batch32", BATCH), ("seconds_per_query1", 1)):
        batch = queries[:size]
        fn(batch)
        start = time.perf_counter()
        fn(batch)
        first = time.perf_counter() - start
        repeats = int(min(20, max(3, 4.0 / max(first, 1e-6))))
        times = [first]
        for _ in range(repeats - 1):
            start = time.perf_counter()
            fn(batch)
            times.append(time.perf_counter() - start)
        out[name] = float(np.median(times))
    return out


def all_neighbours(fn, queries):
    return np.concatenate([fn(queries[i : i + BATCH]) for i in range(0, len(queries), BATCH)])


# ---- one method in its own process ---------------------------------------------------------------------------


def _numpy_exact(size, dim, work):
    base = memory_mib()[0]
    start = time.perf_counter()
    gallery = synthetic(size, dim)
    build = time.perf_counter() - start
    resident = memory_mib()[0] - base

    def search(q):
        scores = q @ gallery.T
        top = np.argpartition(-scores, K - 1, axis=1)[:, :K]
        order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable")
        return np.take_along_axis(top, order, 1)

    return search, {"build_seconds": build, "resident_mib": resident, "stored_mib": gallery.nbytes / 2**20}, base


def _tf_build(size, dim, dtype, path):
    """Saves the search module of a synthetic gallery (run in its own process: it holds the gallery twice)."""
    import tensorflow as tf

    from tfdml.export.search import GallerySearch

    gallery = synthetic(size, dim)
    start = time.perf_counter()
    ids = [f"synthetic:{i}" for i in range(size)]
    labels = [f"class {i % 1000}" for i in range(size)]
    searcher = GallerySearch(gallery, ids, labels, k=K, gallery_dtype=dtype, threshold=0.5)
    spec = tf.TensorSpec([None, dim], tf.float32, name="embedding")
    searcher.search = tf.function(lambda embedding: searcher(embedding), input_signature=[spec])
    tf.saved_model.save(searcher, path, signatures={"search": searcher.search})
    return {"build_seconds": time.perf_counter() - start, "stored_mib": searcher.memory_bytes() / 2**20}


def _tf(size, dim, work, dtype):
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # start the runtime before the baseline
    path = os.path.join(work, f"tf_{dtype}_{size}")
    info_path = path + ".json"
    if not os.path.exists(info_path):
        subprocess.run(
            [sys.executable, __file__, "--build", dtype, "--size", str(size), "--dim", str(dim), "--work", work],
            check=True,
        )
    with open(info_path) as f:
        info = json.load(f)
    base = memory_mib()[0]
    start = time.perf_counter()
    signature = tf.saved_model.load(path).signatures["search"]
    info["load_seconds"] = time.perf_counter() - start
    info["resident_mib"] = memory_mib()[0] - base

    def search(q):
        found = signature(embedding=tf.constant(q))
        return np.array([[int(i.split(b":")[1]) for i in row] for row in found["ids"].numpy()])

    return search, info, base


def _scann(size, dim, work, mode, leaves_fraction=None):
    from tfdml.retrieval import ScannIndex

    base = memory_mib()[0]
    gallery = synthetic(size, dim)
    start = time.perf_counter()
    index = ScannIndex(gallery, mode=mode, num_neighbors=K)
    build = time.perf_counter() - start
    del gallery
    gc.collect()
    info = {"build_seconds": build, "resident_mib": memory_mib()[0] - base, "settings": index.settings or "brute force"}

    leaves = None
    if leaves_fraction is not None:
        leaves = max(1, round(leaves_fraction * index.settings["num_leaves"]))
        info["leaves_searched"] = leaves

    def search(q):
        return np.asarray(index.search(q, k=K, leaves_to_search=leaves)[0])

    return search, info, base


def run_child(method, size, dim, work):
    if method == "numpy_exact":
        search, info, base = _numpy_exact(size, dim, work)
    elif method.startswith("tf_"):
        search, info, base = _tf(size, dim, work, method[3:])
    elif method == "scann_brute_force":
        search, info, base = _scann(size, dim, work, "exact")
    else:
        search, info, base = _scann(size, dim, work, "approximate", 0.1 if method.endswith("10pct") else None)
    queries = queries_for(size, dim)
    info["peak_is_search_only"] = reset_peak()
    info.update(timed(search, queries))
    neighbours = all_neighbours(search, queries)
    np.save(os.path.join(work, f"neighbours_{method}_{size}.npy"), neighbours)
    info["peak_mib"] = memory_mib()[1] - base
    return info


# ---- the driver ------------------------------------------------------------------------------------------------


def recall_against(neighbours, exact):
    found = np.mean([len(set(a) & set(b)) / K for a, b in zip(neighbours, exact)])
    return float(found), float(np.mean(neighbours[:, 0] == exact[:, 0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000, 1000000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--work", default="/tmp/bench_search")
    parser.add_argument(
        "--table", action="store_true", help="print what was measured as the README's Markdown table; measures nothing"
    )
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.build:
        path = os.path.join(args.work, f"tf_{args.build}_{args.size}")
        info = _tf_build(args.size, args.dim, args.build, path)
        with open(path + ".json", "w") as f:
            json.dump(info, f)
        return
    if args.child:
        print(json.dumps(run_child(args.child, args.size, args.dim, args.work)))
        return

    results_path = os.path.join(args.work, "results.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    for size in args.sizes:
        for method in args.methods:
            key = f"{size}/{method}"
            if key in results or args.table:  # --table only reports what was measured
                continue
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    method,
                    "--size",
                    str(size),
                    "--dim",
                    str(args.dim),
                    "--work",
                    args.work,
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode:
                results[key] = {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
            else:
                results[key] = json.loads(done.stdout.strip().splitlines()[-1])
            print(key, json.dumps(results[key]), file=sys.stderr, flush=True)
            with open(results_path, "w") as f:
                json.dump(results, f, indent=1)

    report = {"dim": args.dim, "k": K, "queries": 256, "batch": BATCH, "cpu_count": os.cpu_count(), "sizes": {}}
    for size in args.sizes:
        rows = {m: dict(results.get(f"{size}/{m}", {})) for m in args.methods}
        exact_file = os.path.join(args.work, f"neighbours_numpy_exact_{size}.npy")
        exact = np.load(exact_file) if os.path.exists(exact_file) else None
        for method, row in rows.items():
            found = os.path.join(args.work, f"neighbours_{method}_{size}.npy")
            if exact is not None and "error" not in row and os.path.exists(found):
                row["recall@10_vs_exact"], row["top1_agreement"] = recall_against(np.load(found), exact)
        ratios = {}
        tf_row = rows.get("tf_float32", {})
        for other in METHODS:
            if other == "tf_float32":
                continue
            row = rows.get(other, {})
            if "seconds_per_batch32" in tf_row and "seconds_per_batch32" in row:
                ratios[f"tf_float32_over_{other}"] = {
                    "batch32": tf_row["seconds_per_batch32"] / row["seconds_per_batch32"],
                    "query1": tf_row["seconds_per_query1"] / row["seconds_per_query1"],
                }
        report["sizes"][str(size)] = {"methods": rows, "time_ratios": ratios}
    print(markdown_table(report) if args.table else json.dumps(report, indent=1))


def markdown_table(report):
    """The report as the README's table: one row per size and method (milliseconds, MiB)."""
    lines = [
        "| gallery | method | ms / batch of 32 | ms / 1 query | gallery MiB | resident MiB | peak MiB searching "
        "| recall@10 vs exact | build s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, entry in report["sizes"].items():
        for method, row in entry["methods"].items():
            if not row:
                continue
            if "error" in row:
                lines.append(f"| {int(size):,} | {method} | failed: {' '.join(row['error'])} |||||||")
                continue

            def number(key, scale=1.0, digits=1, row=row):
                return f"{row[key] * scale:.{digits}f}" if key in row else ""

            lines.append(
                f"| {int(size):,} | {method} | {number('seconds_per_batch32', 1e3, 2)} "
                f"| {number('seconds_per_query1', 1e3, 3)} | {number('stored_mib')} | {number('resident_mib')} "
                f"| {number('peak_mib')} | {number('recall@10_vs_exact', digits=4)} | {number('build_seconds')} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
