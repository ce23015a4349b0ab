"""One query at a time, the default `ScannIndex` against a faiss index, timed interleaved in one process.

`bench_search.py` measures each method in its own process, one after another; on a shared machine the load
moves between them by more than the difference being measured. This script builds, on the same gallery
(`bench_search.gallery`), the index `tfdml export` builds (`ScannIndex(gallery)`, recall target 0.95) and
one faiss index as `bench_search.py` builds it, at one setting (`--faiss KIND:SETTING`; default `hnsw:10`:
`IndexHNSWFlat(d, 32)`, efConstruction 40, efSearch 10, its least setting for k = 10 and the one
`bench_search.py` selects for recall 0.90 and 0.95 on the embedding-like data; `ivf_flat:NPROBE`,
`ivfpq_refine:NPROBE,K_FACTOR`), then times single queries in rounds that alternate the methods (and their
order), so that both see the same load:

- `scann_default`: `ScannIndex.search(query)` (a `[D]` query, the single-query path);
- `scann_raw`: ScaNN's own `search` call with the same settings (what the wrapper adds);
- `faiss_<kind>`: `index.search(query[None], 10)` with one OpenMP thread.

It prints one JSON object: per method the recall@10 against exact search on the 256 test queries, the median
wall time of a single query over all rounds, the median of each round, and the CPU time per query.

    nice python -m benchmarks.search.single_query --data embedding --size 1000000 > single_query_embedding.json
    python -m benchmarks.search.single_query --data clustered --faiss ivfpq_refine:512,16 > single_query_clustered.json
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

from benchmarks.search import bench_search as bench  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", choices=bench.DATA, default="embedding")
    parser.add_argument("--size", type=int, default=1000000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--faiss",
        default="hnsw:10",
        help="the faiss index and its setting: hnsw:EF_SEARCH, ivf_flat:NPROBE or ivfpq_refine:NPROBE,K_FACTOR",
    )
    args = parser.parse_args()
    kind, _, text = args.faiss.partition(":")
    parts = text.split(",")
    if kind not in ("hnsw", "ivf_flat", "ivfpq_refine") or len(parts) != 1 + (kind == "ivfpq_refine"):
        parser.error(f"--faiss: expected hnsw:N, ivf_flat:N or ivfpq_refine:N,M, got {args.faiss!r}")
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        parser.error(f"--faiss: the settings are positive integers, got {text!r}")
    setting = tuple(int(part) for part in parts) if kind == "ivfpq_refine" else int(parts[0])
    import faiss

    from tfdml.retrieval import ScannIndex

    g = bench.gallery(args.data, args.size, args.dim)
    q = bench.test_queries(args.data, args.size, args.dim)
    exact = bench.exact_neighbours(g, q)
    out = {"data": args.data, "size": args.size, "dim": args.dim, "load_average_before": os.getloadavg()}

    start = time.perf_counter()
    scann = ScannIndex(g, mode="approximate", num_neighbors=bench.K)
    out["scann_default_build_seconds"] = time.perf_counter() - start
    out["scann_default_settings"], out["scann_default_index_recall"] = scann.settings, scann.recall
    start = time.perf_counter()
    index, configure, _, _ = bench.build_faiss(kind, g)
    configure(setting)
    out[f"faiss_{kind}_build_seconds"] = time.perf_counter() - start
    del g
    faiss.omp_set_num_threads(1)

    settings = scann.settings
    pre_reorder = int(max(settings["reorder"], settings["reorder_factor"] * bench.K))
    methods = {
        "scann_default": lambda x: scann.search(x, k=bench.K)[0],
        "scann_raw": lambda x: scann._searcher.search(
            x,
            final_num_neighbors=bench.K,
            leaves_to_search=settings["leaves_to_search"],
            pre_reorder_num_neighbors=pre_reorder,
        )[0],
        f"faiss_{kind}": lambda x: index.search(x[None], bench.K)[1][0],
    }
    for search in methods.values():  # warm-up
        for x in q[:20]:
            search(x)
    wall = {name: [] for name in methods}
    cpu = {name: [] for name in methods}
    found = {}
    for round_ in range(args.rounds):
        order = list(methods) if round_ % 2 == 0 else list(methods)[::-1]
        for name in order:
            search, times, results = methods[name], [], []
            cpu_start = time.process_time()
            for x in q:
                start = time.perf_counter()
                results.append(np.asarray(search(x)))
                times.append(time.perf_counter() - start)
            cpu[name].append((time.process_time() - cpu_start) / len(q))
            wall[name].append(times)
            found[name] = np.stack(results)
    out["load_average_after"] = os.getloadavg()
    for name in methods:
        out[name] = {
            "recall@10": bench.recall(found[name], exact),
            "ms_per_query_median": 1e3 * float(np.median(np.concatenate(wall[name]))),
            "ms_per_query_round_medians": [round(1e3 * float(np.median(t)), 4) for t in wall[name]],
            "cpu_ms_per_query_rounds": [round(1e3 * c, 4) for c in cpu[name]],
        }
    out[f"faiss_{kind}"]["setting"] = setting
    print(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
