"""Benchmark of tfdml on a two-node Ray cluster started on this machine (see README.md), in one run:

- `embed`: the in-process export path (`tfdml.export.read_image` + `ExportedEmbedder.embed`, batches of 64)
  and `tfdml.ray.run_embed` with 1, 2 and 4 actors on the same images and export: wall time of the whole run
  (listing, actor start-up and model loading, decoding, serving, shuffling into shards, shard files, indexes,
  manifest), images per second, and each actor's peak resident memory (sampled every 50 ms);
- `train`: the `tfdml train` job on glyphs in this process (`model.fit`), and through `tfdml.ray.run_job` on 1
  and 2 Ray Train workers (`fit_distributed` under `MultiWorkerMirroredStrategy`): the chief's training time
  and steps per second.

Usage:
    nice -n 10 python -m benchmarks.ray.bench_ray --out benchmarks/ray/results.json
    python -m benchmarks.ray.bench_ray --table benchmarks/ray/results.json > benchmarks/ray/table.md
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: nodes on 127.0.0.1

# The catalogue and model of the Beam benchmark (its convolutions padded "same" here), embedded the same way.
from benchmarks.beam.bench_beam import IMAGE_SIZE, SOURCE_SIZE, make_data  # noqa: E402

ACTORS = (1, 2, 4)
WORKERS = (1, 2)


class ActorMemory:
    """Peak resident memory of each Ray Data actor process (`ray::MapWorker...`) under this process."""

    def __init__(self):
        import psutil

        self.psutil, self.peaks, self.stop = psutil, {}, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        me = self.psutil.Process()
        while not self.stop.is_set():
            for process in me.children(recursive=True):
                try:
                    if "MapWorker" in " ".join(process.cmdline()):
                        rss = process.memory_info().rss / 2**20
                        self.peaks[process.pid] = max(self.peaks.get(process.pid, 0.0), rss)
                except self.psutil.Error:
                    continue
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def bench_embed(work, version, count, address):
    from tfdml.embed_job import EmbedJob, RayCluster
    from tfdml.export import ExportedEmbedder, read_image
    from tfdml.ray import run_embed

    paths = sorted(
        os.path.join(folder, name) for folder, _, names in os.walk(os.path.join(work, "images")) for name in names
    )
    started = time.perf_counter()
    embedder = ExportedEmbedder(version)
    for start in range(0, len(paths), 64):
        embedder.embed([read_image(path) for path in paths[start : start + 64]])
    seconds = time.perf_counter() - started
    rows = [{"engine": "in-process export path", "actors": None, "seconds": seconds, "images_per_s": count / seconds}]
    for actors in ACTORS:
        job = EmbedJob(
            model=version, output=os.path.join(work, f"out-{actors}"), image_dir=os.path.join(work, "images")
        )
        with ActorMemory() as memory:
            started = time.perf_counter()
            manifest = run_embed(job, RayCluster(address=address, actors=actors, cpus=0.5), say=lambda text: None)
            seconds = time.perf_counter() - started
        assert manifest["embedded"] == count, manifest["embedded"]
        rows.append(
            {
                "engine": "ray",
                "actors": actors,
                "seconds": seconds,
                "images_per_s": count / seconds,
                "actor_peak_mib": sorted(round(peak) for peak in memory.peaks.values()),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def train_config(work, name, steps, epochs):
    from tfdml.config import load_config

    overrides = [
        ("training.epochs", epochs),
        ("training.steps_per_epoch", steps),
        ("export.enabled", False),
        ("report.dir", os.path.join(work, name)),
        ("report.worst_queries", 2),
    ]
    return load_config(None, overrides)


def bench_train(work, address, steps, epochs):
    from tfdml import pipeline
    from tfdml.ray import RayTraining, run_job

    rows = []
    summary = pipeline.run(train_config(work, "one-process", steps, epochs), verbose=0)
    rows.append({"workers": None, "train_seconds": summary["train_seconds"]})
    for workers in WORKERS:
        config = train_config(work, f"ray-{workers}", steps, epochs)
        # 2 CPUs a worker on nodes of 2: one worker per node.
        summary = run_job(config, RayTraining(address=address, workers=workers, cpus=2), verbose=0)
        rows.append({"workers": workers, "train_seconds": summary["train_seconds"]})
        print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        row["steps"] = steps * epochs
        row["steps_per_s"] = steps * epochs / row["train_seconds"]
    return rows


def run(args):
    from ray_cluster import two_node_cluster

    with tempfile.TemporaryDirectory(prefix="tfdml-bench-ray-") as work:
        version = make_data(work, args.images, padding="same")
        with two_node_cluster(cpus=2, object_store_mb=200) as cluster:
            embed = bench_embed(work, version, args.images, cluster.address)
            train = bench_train(work, cluster.address, args.steps, args.epochs)
    import ray

    return {
        "images": args.images,
        "image_size": SOURCE_SIZE,
        "served_size": IMAGE_SIZE,
        "train_job": {"steps_per_epoch": args.steps, "epochs": args.epochs, "data": "glyphs (the default job)"},
        "embed": embed,
        "train": train,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "load_average_after": os.getloadavg(),
        },
    }


def table(results):
    lines = [
        f"Embedding {results['images']} JPEG images ({results['image_size']} px, served at "
        f"{results['served_size']} px), two Ray nodes on one 2-core machine:",
        "",
        "| engine | actors | seconds | images/s | peak memory per actor (MiB) |",
        "|---|---:|---:|---:|---|",
    ]
    for row in results["embed"]:
        memory = ", ".join(str(m) for m in row.get("actor_peak_mib", [])) or "-"
        actors = row["actors"] if row["actors"] is not None else "-"
        lines.append(f"| {row['engine']} | {actors} | {row['seconds']:.1f} | {row['images_per_s']:.0f} | {memory} |")
    job = results["train_job"]
    lines += [
        "",
        f"Training the default glyph job, {job['epochs']} epochs of {job['steps_per_epoch']} steps (the chief's "
        "training time, first-step tracing included):",
        "",
        "| run | workers | training seconds | steps/s |",
        "|---|---:|---:|---:|",
    ]
    for row in results["train"]:
        name = "one process (model.fit)" if row["workers"] is None else "Ray Train (fit_distributed, MWMS)"
        workers = row["workers"] if row["workers"] is not None else "-"
        lines.append(f"| {name} | {workers} | {row['train_seconds']:.1f} | {row['steps_per_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out")
    parser.add_argument("--table", metavar="RESULTS")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)), end="")
        return
    results = run(args)
    text = json.dumps(results, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
