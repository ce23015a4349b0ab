"""Load on the serving path: many clients at once on an export's `search` signature and on `tfdml search`.

The export: the default job's model architecture (small CNN, 64-d) exported with random weights and the glyph
test half (151 classes x 20 images, 3,020 items) as its exact `search` gallery (`k = 10`); the weights do not
change the cost of a request. The queries: 64 glyph images drawn from the gallery's classes with a fixed seed.

- `signature`: the `search` signature loaded once (`tf.saved_model.load(...).signatures["search"]`, the
  function TF Serving calls), shared by 1, 2, 4, 8 and 16 client threads; each client sends `--requests`
  requests of one query image (query `i` of the list for request `i`, offset by the client number). Every
  answer (ids, scores, labels, match) is compared with the single-client answer to the same query, computed
  first; latency is per request, throughput is requests over the wall time of the whole round.
- `cli`: `python -m tfdml search --exact --json` (a one-shot command, so concurrent clients are concurrent
  processes) with 1, 2, 4 and 8 processes at once, each searching one query; its answer is compared with the
  signature's. Latency is the whole process (start-up, TensorFlow import, loading, checksum check, search).

No server and no network: the signature is called in the process, as TF Serving calls it.

    nice -n 10 python -m benchmarks.serving_load.load            # writes benchmarks/serving_load/results.json
    python -m benchmarks.serving_load.load --table > benchmarks/serving_load/table.md
"""

import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join("benchmarks", "serving_load", "results.json")


def make_export(folder):
    import keras

    from tfdml import data, models
    from tfdml.export import export_saved_model

    keras.utils.set_random_seed(0)
    embedder = models.Embedder("small_cnn", embedding_dim=64, input_shape=(32, 32, 1), widths=(16, 32, 64, 128))
    gallery = data.glyphs("test")
    path = export_saved_model(embedder, folder, name="glyphs", gallery=gallery, index_mode="exact", top_k=10)
    rng = np.random.default_rng(0)
    queries = gallery.images[rng.choice(len(gallery.images), 64, replace=False)]
    return path, np.asarray(queries, np.uint8)


def answer(found):
    """One request's answer as plain values, for equality."""
    return {key: np.asarray(value).tolist() for key, value in found.items()}


def call(signature, image):
    import tensorflow as tf

    return {key: value.numpy() for key, value in signature(images=tf.constant(image[None])).items()}


def signature_round(signature, queries, expected, clients, requests):
    """`clients` threads, `requests` each; returns latencies (s), wall seconds, wrong answers and errors."""
    latencies, wrong, errors = [], [0], [0]
    lock = threading.Lock()

    def client(number):
        for request in range(requests):
            q = (request + number) % len(queries)
            began = time.perf_counter()
            try:
                got = answer(call(signature, queries[q]))
            except Exception:  # counted: the table says how many requests failed
                with lock:
                    errors[0] += 1
                continue
            took = time.perf_counter() - began
            with lock:
                latencies.append(took)
                wrong[0] += got != expected[q]

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return latencies, time.perf_counter() - started, wrong[0], errors[0]


def cli_round(path, query_files, expected, clients, work):
    """`clients` concurrent `tfdml search` processes, one query each."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs, started = [], time.perf_counter()
    for number in range(clients):
        out = os.path.join(work, f"answer-{clients}-{number}.json")
        command = [sys.executable, "-m", "tfdml", "search", "--exact", "--model", path, query_files[number], "-k", "10"]
        procs.append((time.perf_counter(), number, out, subprocess.Popen([*command, "--json", out], env=env)))
    latencies, wrong, errors = [], 0, 0
    for began, number, out, proc in procs:
        status = proc.wait()
        latencies.append(time.perf_counter() - began)
        if status != 0:
            errors += 1
            continue
        with open(out) as f:
            ids = [neighbour["id"] for neighbour in json.load(f)[0]["neighbours"]]
        wrong += ids != [item.decode() for item in expected[number]["ids"][0]]
    return latencies, time.perf_counter() - started, wrong, errors


def row(kind, clients, latencies, wall, wrong, errors):
    return {
        "kind": kind,
        "clients": clients,
        "requests": len(latencies) + errors,
        "wrong": int(wrong),
        "errors": int(errors),
        "p50_ms": round(1000 * float(np.percentile(latencies, 50)), 2) if latencies else None,
        "p99_ms": round(1000 * float(np.percentile(latencies, 99)), 2) if latencies else None,
        "per_second": round(len(latencies) / wall, 2),
    }


def run(args):
    import tensorflow as tf

    rows = []
    with tempfile.TemporaryDirectory(prefix="tfdml-serving-") as work:
        path, queries = make_export(work)
        signature = tf.saved_model.load(path).signatures["search"]
        expected = [answer(call(signature, image)) for image in queries]  # one client, one request at a time
        for clients in args.clients:
            latencies, wall, wrong, errors = signature_round(signature, queries, expected, clients, args.requests)
            rows.append(row("signature", clients, latencies, wall, wrong, errors))
            print(rows[-1], flush=True)
        query_files = []
        for number in range(max(args.cli_clients)):
            query_files.append(os.path.join(work, f"q{number}.png"))
            tf.io.write_file(query_files[-1], tf.io.encode_png(queries[number]))
        for clients in args.cli_clients:
            latencies, wall, wrong, errors = cli_round(path, query_files, expected, clients, work)
            rows.append(row("cli", clients, latencies, wall, wrong, errors))
            print(rows[-1], flush=True)
    record = {
        "rows": rows,
        "requests_per_client": args.requests,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}",
        "load_average": list(os.getloadavg()),
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)


def table(path):
    with open(path) as f:
        record = json.load(f)
    lines = [
        "| path | clients | requests | wrong | failed | p50 (ms) | p99 (ms) | requests/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {"signature": "`search` signature, threads", "cli": "`tfdml search --exact`, processes"}
    for r in record["rows"]:
        lines.append(
            f"| {names[r['kind']]} | {r['clients']} | {r['requests']} | {r['wrong']} | {r['errors']} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['per_second']:.2f} |"
        )
    lines += [
        "",
        f"{record['requests_per_client']} requests per client thread, one per process; {record['machine']}, load "
        f"average {', '.join(f'{v:.1f}' for v in record['load_average'])} at the end.",
    ]
    print("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--cli-clients", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--requests", type=int, default=64, help="requests per client thread")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument(
        "--table", nargs="?", const=RESULTS, metavar="RESULTS", help="print the table of a results file and exit"
    )
    args = parser.parse_args(argv)
    if args.table:
        return table(args.table)
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
