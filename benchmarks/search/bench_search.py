"""Nearest-neighbour search at scale: the exported `search` signature, ScaNN (`tfdml.retrieval.ScannIndex`) and
faiss side by side, on two kinds of 512-d galleries of 100k and 1M items; results as JSON lines and a table.

Data (`--data`):

- `clustered`: synthetic unit vectors around `size // 50` random unit centres (clusters of ~50 items,
  cosine ~0.5 within a cluster, ~0 across): high intrinsic dimension, hard for partitioning;
- `embedding`: shaped like real embeddings: clustered 16-d latents (clusters of ~50, noise 0.35) through a
  fixed random network (16 -> 256 ReLU -> 512), L2-normalised: low intrinsic dimension.

Queries: 256 test queries and 500 validation queries, fresh draws from the same clusters (never gallery
items); `k = 10`. Each method runs in its own process (its memory is its own):

- `numpy_exact`: float32 matmul + argpartition (the reference every recall is measured against);
- `tf_float32`, `tf_bfloat16`, `tf_int8`: `tfdml.export.search.GallerySearch` (what the `search` signature
  runs after the embedding), saved as a SavedModel and loaded back as TF Serving would;
- `scann_brute_force`: ScaNN's exact brute force;
- `scann_default`: `ScannIndex(gallery)` as `tfdml export` builds it: automatic settings (a PCA projection
  where the data has a low-rank subspace: 96 of 512 dimensions for `embedding`, none for `clustered`), recall
  target 0.95 measured on gallery items left out of their own neighbours (build time includes that tuning);
- `scann`: one ScaNN tree + AH + re-ordering index tuned (`ScannIndex.tune`) on the validation queries
  to recall@10 0.90, 0.95 and 0.99 (rows `scann@0.9`, ...);
- `faiss_hnsw`: `IndexHNSWFlat(d, 32)`, inner product, `efConstruction` 40, `efSearch` swept;
- `faiss_ivf_flat`: `IndexIVFFlat` with `2 sqrt(N)` lists, `nprobe` swept;
- `faiss_ivfpq_refine`: `IndexIVFPQ` (64 sub-quantizers of 8 bits: 64 bytes a vector) inside
  `IndexRefineFlat` (exact re-scoring of `k_factor * k` candidates), `nprobe` x `k_factor` swept.

faiss indexes are tuned like ScaNN's: for each target recall (0.90, 0.95, 0.99) the setting with the
lowest time for the 500 validation queries among those whose validation recall@10 reaches the target. Each
row then reports, on the 256 test queries: recall@10 against `numpy_exact`, the median time of a single
query (sent alone: one call per query) and of a batch of 32, build seconds and resident memory (MiB above
the process's baseline after building, the gallery array itself freed), and the peak while searching.

    nice python -m benchmarks.search.bench_search --data embedding --sizes 100000 [--methods ...]
    python -m benchmarks.search.bench_search --table > benchmarks/search/table.md   # measures nothing

Results are kept in `benchmarks/search/results_<data>.json` (`--work` for elsewhere); a measured
size/method is not run again (delete its entry to measure again).
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# faiss's OpenMP threads spin while waiting by default; on cores shared with other work that makes a batch
# of 32 slower than 32 single queries. Passive waiting measures the search, not the contention.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = ("clustered", "embedding")
METHODS = (
    "numpy_exact",
    "tf_float32",
    "tf_bfloat16",
    "tf_int8",
    "scann_brute_force",
    "scann_default",
    "scann",
    "faiss_hnsw",
    "faiss_ivf_flat",
    "faiss_ivfpq_refine",
)
TARGETS = (0.9, 0.95, 0.99)
K = 10
BATCH = 32
TEST_QUERIES = 256
VALIDATION_QUERIES = 500
SINGLE_QUERIES = 100  # single queries timed, one call each
EF_SEARCH = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # HNSW candidate-list sizes searched
PROBES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)  # IVF lists searched


# ---- data -------------------------------------------------------------------------------------------------------


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _clustered(count, dim, centres, rng, chunk=100000):
    out = np.empty((count, dim), np.float32)
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        noise = rng.standard_normal((n, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
        out[start : start + n] = _unit(centres[rng.integers(0, len(centres), n)] + noise)
    return out


def _embedding(count, dim, centres, rng, chunk=100000, noise=0.35, hidden=256):
    net = np.random.default_rng(1000)  # the same network for every size
    w1 = net.standard_normal((centres.shape[1], hidden)).astype(np.float32) / np.float32(np.sqrt(centres.shape[1]))
    b1 = (0.5 * net.standard_normal(hidden)).astype(np.float32)
    w2 = net.standard_normal((hidden, dim)).astype(np.float32) / np.float32(np.sqrt(hidden))
    out = np.empty((count, dim), np.float32)
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        z = centres[rng.integers(0, len(centres), n)] + noise * rng.standard_normal((n, centres.shape[1]), np.float32)
        out[start : start + n] = _unit(np.maximum(z @ w1 + b1, 0) @ w2)
    return out


def _centres(data, size, dim):
    rng = np.random.default_rng(0)
    clusters = max(1, size // 50)
    if data == "clustered":
        return _unit(rng.standard_normal((clusters, dim), dtype=np.float32)), rng
    return rng.standard_normal((clusters, 16), dtype=np.float32), rng


def gallery(data, size, dim):
    """`[size, dim]` float32 unit vectors of the data kind (see the module docstring)."""
    centres, rng = _centres(data, size, dim)
    return (_clustered if data == "clustered" else _embedding)(size, dim, centres, rng)


def queries(data, size, dim, count, seed):
    """Fresh draws from the gallery's clusters (the same centres, other noise)."""
    centres, _ = _centres(data, size, dim)
    return (_clustered if data == "clustered" else _embedding)(count, dim, centres, np.random.default_rng(seed))


def test_queries(data, size, dim):
    return queries(data, size, dim, TEST_QUERIES, 12345)


def validation_queries(data, size, dim):
    return queries(data, size, dim, VALIDATION_QUERIES, 777)


# ---- measuring --------------------------------------------------------------------------------------------------


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
    while searching does not include building; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def timings(search, q):
    """Median seconds of one call with a single query (each of `SINGLE_QUERIES` queries alone) and of one
    call with a batch of 32, after warm-up calls."""
    for i in range(5):
        search(q[i : i + 1])
    single = []
    for i in range(SINGLE_QUERIES):
        start = time.perf_counter()
        search(q[i % len(q) : i % len(q) + 1])
        single.append(time.perf_counter() - start)
    search(q[:BATCH])
    batches = []
    for i in range(7):
        part = q[(i * BATCH) % len(q) :][:BATCH]
        start = time.perf_counter()
        search(part)
        batches.append(time.perf_counter() - start)
    return {"seconds_per_query1": float(np.median(single)), "seconds_per_batch32": float(np.median(batches))}


def neighbours_of(search, q):
    return np.concatenate([search(q[i : i + BATCH]) for i in range(0, len(q), BATCH)])


def exact_neighbours(g, q, k=K):
    out = np.empty((len(q), k), np.int64)
    for start in range(0, len(q), 64):
        scores = q[start : start + 64] @ g.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable")
        out[start : start + len(top)] = np.take_along_axis(top, order, 1)
    return out


def recall(found, exact):
    return float(np.mean([len(set(a) & set(b)) / exact.shape[1] for a, b in zip(found, exact)]))


# ---- methods (each in its own process) ---------------------------------------------------------------------------


def _numpy_exact(data, size, dim, work):
    base = memory_mib()[0]
    start = time.perf_counter()
    g = gallery(data, size, dim)
    info = {"build_seconds": time.perf_counter() - start, "resident_mib": memory_mib()[0] - base}
    info["stored_mib"] = g.nbytes / 2**20
    return {"numpy_exact": (lambda q: exact_neighbours(g, q), info)}, base


def _tf_build(data, size, dim, dtype, path):
    """Saves the search module of a gallery (run in its own process: it holds the gallery twice)."""
    import tensorflow as tf

    from tfdml.export.search import GallerySearch

    g = gallery(data, size, dim)
    start = time.perf_counter()
    ids = [f"item:{i}" for i in range(size)]
    labels = [f"class {i % 1000}" for i in range(size)]
    searcher = GallerySearch(g, ids, labels, k=K, gallery_dtype=dtype, threshold=0.5)
    spec = tf.TensorSpec([None, dim], tf.float32, name="embedding")
    searcher.search = tf.function(lambda embedding: searcher(embedding), input_signature=[spec])
    tf.saved_model.save(searcher, path, signatures={"search": searcher.search})
    return {"build_seconds": time.perf_counter() - start, "stored_mib": searcher.memory_bytes() / 2**20}


def _tf(data, size, dim, work, dtype):
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # start the runtime before the baseline
    path = os.path.join(work, f"tf_{data}_{dtype}_{size}")
    if not os.path.exists(path + ".json"):
        subprocess.run(
            [sys.executable, __file__, "--build", dtype, "--data", data, "--size", str(size), "--dim", str(dim)]
            + ["--work", work],
            check=True,
        )
    with open(path + ".json") as f:
        info = json.load(f)
    base = memory_mib()[0]
    start = time.perf_counter()
    signature = tf.saved_model.load(path).signatures["search"]
    info["load_seconds"] = time.perf_counter() - start
    info["resident_mib"] = memory_mib()[0] - base

    def search(q):
        found = signature(embedding=tf.constant(q))
        return np.array([[int(i.split(b":")[1]) for i in row] for row in found["ids"].numpy()])

    return {f"tf_{dtype}": (search, info)}, base


def _scann_brute_force(data, size, dim, work):
    from tfdml.retrieval import ScannIndex

    base = memory_mib()[0]
    g = gallery(data, size, dim)
    start = time.perf_counter()
    index = ScannIndex(g, mode="exact", num_neighbors=K)
    info = {"build_seconds": time.perf_counter() - start}
    del g
    gc.collect()
    info["resident_mib"] = memory_mib()[0] - base
    return {"scann_brute_force": (lambda q: np.asarray(index.search(q, k=K)[0]), info)}, base


def _scann_default(data, size, dim, work):
    from tfdml.retrieval import ScannIndex

    base = memory_mib()[0]
    g = gallery(data, size, dim)
    start = time.perf_counter()
    index = ScannIndex(g, mode="approximate", num_neighbors=K)  # target_recall 0.95 on gallery items
    info = {"build_seconds": time.perf_counter() - start, "mode": index.mode, "settings": index.settings}
    info["index_recall"] = index.recall
    del g
    gc.collect()
    info["resident_mib"] = memory_mib()[0] - base
    return {"scann_default": (lambda q: np.asarray(index.search(q, k=K)[0]), info)}, base


def _scann_tuned(data, size, dim, work):
    from tfdml.retrieval import ScannIndex

    base = memory_mib()[0]
    g = gallery(data, size, dim)
    v = validation_queries(data, size, dim)
    start = time.perf_counter()
    index = ScannIndex(g, mode="approximate", num_neighbors=K, target_recall=None)
    build = time.perf_counter() - start
    tuned = {}
    for target in TARGETS:
        start = time.perf_counter()
        # fallback=False: a target that ScaNN does not meet is reported as such rather than as brute force.
        record = index.tune(g, target, queries=v, fallback=False)
        tuned[target] = {**record, "tune_seconds": time.perf_counter() - start}
    del g
    gc.collect()
    resident = memory_mib()[0] - base
    rows = {}
    for target, record in tuned.items():

        def search(q, record=record):
            index.settings.update(leaves_to_search=record["leaves_to_search"], reorder=record["reorder"])
            index.recall = record
            return np.asarray(index.search(q, k=K)[0])

        info = {"build_seconds": build, "resident_mib": resident, "target": target, "tuning": record}
        info["settings"] = {**index.settings, "leaves_to_search": record["leaves_to_search"]}
        info["settings"]["reorder"] = record["reorder"]
        rows[f"scann@{target}"] = (search, info)
    return rows, base


def _faiss_rows(name, index, configure, configs, g, v, build, base, extra=None):
    """Rows `name@target`: per target, the config with the least validation time among those reaching it."""
    import faiss

    exact_v = exact_neighbours(g, v)
    measured = []
    for config in configs:
        configure(config)
        start = time.perf_counter()
        found = index.search(v, K)[1]
        seconds = time.perf_counter() - start
        measured.append((config, recall(found, exact_v), seconds))
    resident = memory_mib()[0] - base
    rows = {}
    for target in TARGETS:
        reaching = [m for m in measured if m[1] >= target]
        if not reaching:
            best = max(measured, key=lambda m: m[1])
            error = f"not reached: best validation recall {best[1]:.4f} ({best[0]}; settings tried up to {configs[-1]})"
            rows[f"{name}@{target}"] = (None, {"error": [error]})
            continue
        config, valid_recall, seconds = min(reaching, key=lambda m: m[2])

        def search(q, config=config):
            configure(config)
            # One thread for a single query (as ScaNN's single-query call), every core for a batch.
            faiss.omp_set_num_threads(1 if len(q) == 1 else os.cpu_count())
            return index.search(q, K)[1]

        info = {
            "build_seconds": build,
            "resident_mib": resident,
            "target": target,
            "setting": config,
            "validation_recall": valid_recall,
            **(extra or {}),
        }
        rows[f"{name}@{target}"] = (search, info)
    return rows


def build_faiss(kind, g):
    """The faiss index of `kind` (`hnsw`, `ivf_flat`, `ivfpq_refine`) over the gallery `g`, as the rows
    measure it: `(index, configure, configs, extra)`, where `configure(setting)` sets the search-time knob
    (`efSearch`, `nprobe`, `(nprobe, k_factor)`) to one of `configs`, the settings swept."""
    import faiss

    size, dim = g.shape
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 40
        index.add(g)

        def configure(ef):
            index.hnsw.efSearch = ef

        return index, configure, list(EF_SEARCH), {"M": 32, "efConstruction": 40}
    nlist = int(2 * np.sqrt(size))
    quantizer = faiss.IndexFlatIP(dim)
    sample = g[np.random.default_rng(0).choice(size, min(size, 40 * nlist), replace=False)]
    extra = {"nlist": nlist, "train_sample": len(sample)}
    if kind == "ivf_flat":
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(sample)
        index.add(g)

        def configure(nprobe):
            index.nprobe = nprobe

        # Up to half the lists: the clustered data at 1M needs 256 of 2,000 for 0.9 and more than 384
        # (a fifth) for 0.95.
        return index, configure, [c for c in PROBES if c <= nlist // 2], extra
    ivf = faiss.IndexIVFPQ(quantizer, dim, nlist, 64, 8, faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexRefineFlat(ivf)
    index.train(sample)
    index.add(g)

    def configure(config):
        ivf.nprobe, index.k_factor = config

    # k_factor up to 64, so that the re-scoring depth does not cap the recall (the 1M runs chose 16, and 64 for
    # 0.99 on the embedding-like data).
    return index, configure, [(p, f) for f in (4, 16, 64) for p in PROBES if 2 <= p <= nlist // 2], extra


def _faiss(data, size, dim, work, kind):
    base = memory_mib()[0]
    g = gallery(data, size, dim)
    v = validation_queries(data, size, dim)
    start = time.perf_counter()
    index, configure, configs, extra = build_faiss(kind, g)
    build = time.perf_counter() - start
    rows = _faiss_rows(f"faiss_{kind}", index, configure, configs, g, v, build, base, extra)
    del g
    gc.collect()
    for _, info in rows.values():
        if "resident_mib" in info:
            info["resident_mib"] = memory_mib()[0] - base
    return rows, base


def run_child(method, data, size, dim, work):
    if method == "numpy_exact":
        rows, base = _numpy_exact(data, size, dim, work)
    elif method.startswith("tf_"):
        rows, base = _tf(data, size, dim, work, method[3:])
    elif method == "scann_brute_force":
        rows, base = _scann_brute_force(data, size, dim, work)
    elif method == "scann_default":
        rows, base = _scann_default(data, size, dim, work)
    elif method == "scann":
        rows, base = _scann_tuned(data, size, dim, work)
    else:
        rows, base = _faiss(data, size, dim, work, method[len("faiss_") :])
    q = test_queries(data, size, dim)
    out = {}
    for name, (search, info) in rows.items():
        if search is not None:
            info["peak_is_search_only"] = reset_peak()
            info.update(timings(search, q))
            np.save(os.path.join(work, f"neighbours_{data}_{name}_{size}.npy"), neighbours_of(search, q))
            info["peak_mib"] = memory_mib()[1] - base
        out[name] = info
    return out


# ---- the driver ------------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", choices=DATA, default="clustered")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100000, 1000000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--work", default=HERE, help="results and neighbour lists (default: this folder)")
    parser.add_argument("--table", action="store_true", help="print the results as Markdown tables; measures nothing")
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.table:
        print(markdown_tables(args.work))
        return
    if args.build:
        path = os.path.join(args.work, f"tf_{args.data}_{args.build}_{args.size}")
        info = _tf_build(args.data, args.size, args.dim, args.build, path)
        with open(path + ".json", "w") as f:
            json.dump(info, f)
        return
    if args.child:
        print(json.dumps(run_child(args.child, args.data, args.size, args.dim, args.work)))
        return

    results_path = os.path.join(args.work, f"results_{args.data}.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    meta = results.setdefault("_machine", {})
    meta.update(cpu_count=os.cpu_count(), dim=args.dim, k=K, test_queries=TEST_QUERIES)
    for size in args.sizes:
        exact_file = os.path.join(args.work, f"neighbours_{args.data}_numpy_exact_{size}.npy")
        methods = list(args.methods)
        done_methods = results.setdefault("_done", [])
        if not os.path.exists(exact_file):  # the recall reference (its neighbour lists are not committed)
            methods = ["numpy_exact"] + [m for m in methods if m != "numpy_exact"]
            done_methods[:] = [m for m in done_methods if m != f"{size}/numpy_exact"]
        for method in methods:
            if f"{size}/{method}" in done_methods:
                continue
            command = [sys.executable, __file__, "--child", method, "--data", args.data, "--size", str(size)]
            done = subprocess.run(
                command + ["--dim", str(args.dim), "--work", args.work], capture_output=True, text=True
            )
            if done.returncode:
                rows = {method: {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}}
            else:
                rows = json.loads(done.stdout.strip().splitlines()[-1])
            exact = np.load(exact_file) if os.path.exists(exact_file) else None
            for name, row in rows.items():
                found = os.path.join(args.work, f"neighbours_{args.data}_{name}_{size}.npy")
                if exact is not None and os.path.exists(found) and "error" not in row:
                    row["recall@10"] = recall(np.load(found), exact)
                results[f"{size}/{name}"] = row
                print(f"{args.data} {size}/{name}", json.dumps(row), file=sys.stderr, flush=True)
            done_methods.append(f"{size}/{method}")
            with open(results_path, "w") as f:
                json.dump(results, f, indent=1)


def _rows(work, data):
    path = os.path.join(work, f"results_{data}.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        results = json.load(f)
    return [(key.split("/", 1), row) for key, row in results.items() if not key.startswith("_")]


def _setting(name, row):
    if name.startswith(("scann@", "scann_default")):
        record = row.get("tuning") or row.get("index_recall") or {}
        if record.get("fallback") and record.get("fell_back", True):
            return "brute force (fallback)"
        if record:
            text = f"{record['leaves_to_search']}/{record['num_leaves']} leaves, reorder {record['reorder']}"
            projection = (row.get("settings") or {}).get("projection_dims")
            if projection:  # the tree and the hashed codes in a PCA projection (see tfdml.retrieval.index)
                text += f", PCA {projection} dims"
            if name.startswith("scann_default") and record.get("lower_bound") is not None:
                # What the index recorded in its metadata: mean recall on its sample and the 95% lower bound.
                text += (
                    f"; recorded recall {record['measured']:.4f} (95% bound {record['lower_bound']:.4f}, "
                    f"{record['queries']} queries)"
                )
            return text
    if "setting" in row:
        setting = row["setting"]
        if name.startswith("faiss_hnsw"):
            return f"efSearch {setting}"
        if name.startswith("faiss_ivf_flat"):
            return f"nprobe {setting} of {row['nlist']}"
        return f"nprobe {setting[0]} of {row['nlist']}, k_factor {setting[1]}"
    return ""


def markdown_tables(work):
    """One table per data kind: a row per size and method (milliseconds, MiB), recall@10 against exact."""
    out = []
    for data in DATA:
        rows = _rows(work, data)
        if not rows:
            continue
        out += [
            f"**{data}** data (512-d, k = 10, 256 test queries)",
            "",
            "| gallery | method | setting | recall@10 | ms / 1 query | ms / batch of 32 | build s | resident MiB "
            "| peak MiB searching |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for (size, name), row in sorted(rows, key=lambda r: int(r[0][0])):
            if "error" in row:
                out.append(f"| {int(size):,} | {name} | not measured: {' '.join(row['error'])} |||||||")
                continue

            def number(key, scale=1.0, digits=1, row=row):
                return f"{row[key] * scale:.{digits}f}" if key in row else ""

            out.append(
                f"| {int(size):,} | {name} | {_setting(name, row)} | {number('recall@10', digits=4)} "
                f"| {number('seconds_per_query1', 1e3, 3)} | {number('seconds_per_batch32', 1e3, 2)} "
                f"| {number('build_seconds')} | {number('resident_mib')} | {number('peak_mib')} |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    main()
