"""Benchmark of `tfdml embed` on Beam's DirectRunner against the in-process export path, and the per-shard
figures the 100M plan is computed from (see README.md).

Parts (each measured in its own process, so that its peak memory is its own):

- `export`: the in-process export path on the images: `tfdml.export.read_image` + `ExportedEmbedder.embed`
  (batches of 64), what `tfdml evaluate --model` does;
- `beam_inprocess`: `tfdml embed` (`run_embed`, DirectRunner, in-memory mode: one process);
- `beam_multiprocess`: the same with `--direct_running_mode=multi_processing --direct_num_workers=2`;
- `shard_index`: building one shard's `ScannIndex` (auto mode: approximate, recall@10 0.95 measured) from
  synthetic 128-d embeddings of 50,000 and 100,000 rows, and the search time of a query shard against it;
- `backbone`: a ResNet-50 (random weights) at 224 x 224 on these cores, the model cost real photos pay;
- `evaluation_memory`: `query_shard_sums` (one query shard against every shard, indexes loaded one at a
  time) with shards of 20,000 x 256-d rows and 2, 4 or 8 shards: its peak memory against the catalogue's size.

Usage:
    nice -n 10 python -m benchmarks.beam.bench_beam --images 2000 8000 --out benchmarks/beam/results.json
    python -m benchmarks.beam.bench_beam --table benchmarks/beam/results.json > benchmarks/beam/table.md
"""

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_SIZE, SOURCE_SIZE, DIM = 64, 80, 128
# The evaluation-memory part: shards of 20,000 x 256 float32 (20 MB each), so that holding every shard would
# show against the interpreter's own ~500 MB (TensorFlow, ScaNN).
EVAL_DIM, EVAL_ROWS = 256, 20000


def _peak_mib(children=False):
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_maxrss / 1024  # kilobytes on Linux


def make_data(work, count, padding="valid"):
    """`count` 80x80 JPEG images in 20 class folders and a small CNN (64x64 input, 128-d, its convolutions'
    `padding`) exported."""
    import keras
    import numpy as np
    from PIL import Image

    from tfdml.export import export_saved_model

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = os.path.join(work, "images", f"class_{i % 20:02d}")
        os.makedirs(folder, exist_ok=True)
        pixels = rng.integers(0, 256, (SOURCE_SIZE, SOURCE_SIZE, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:06d}.jpg"), quality=90)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))
    h = inputs
    for filters in (32, 64, 128):
        h = keras.layers.Conv2D(filters, 3, strides=2, padding=padding, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, keras.layers.Dense(DIM)(h), name="bench_cnn")
    return export_saved_model(model, os.path.join(work, "exported"), preprocess="symmetric")


def part_export(work, version):
    from tfdml.export import ExportedEmbedder, read_image

    paths = sorted(
        os.path.join(folder, name) for folder, _, names in os.walk(os.path.join(work, "images")) for name in names
    )
    embedder = ExportedEmbedder(version)
    start = time.perf_counter()
    embeddings = embedder.embed([read_image(path) for path in paths], batch_size=64)
    seconds = time.perf_counter() - start
    return {"images": len(embeddings), "seconds": seconds, "peak_rss_mib": _peak_mib()}


def part_beam(work, version, multiprocess):
    from tfdml.beam import EmbedJob, run_embed

    output = os.path.join(work, "out-multi" if multiprocess else "out-single")
    options = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"] if multiprocess else []
    job = EmbedJob(model=version, output=output, image_dir=os.path.join(work, "images"), num_shards=4)
    start = time.perf_counter()
    manifest = run_embed(job, options, say=lambda text: None)
    seconds = time.perf_counter() - start
    return {
        "images": manifest["embedded"],
        "seconds": seconds,
        "peak_rss_mib": _peak_mib(),
        "peak_rss_worker_mib": _peak_mib(children=True) if multiprocess else None,
        "options": options,
    }


def part_backbone():
    """Images/s of a ResNet-50 (random weights, 224 x 224, batches of 32) in this process: the model cost a
    catalogue of real photos pays on these cores, beside the pipeline's own cost per image."""
    import keras
    import numpy as np

    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), include_top=False, pooling="avg")
    images = np.random.default_rng(0).uniform(0, 255, (32, 224, 224, 3)).astype(np.float32)
    model(images, training=False)  # traced and warmed up
    start = time.perf_counter()
    for _ in range(3):
        model(images, training=False)
    seconds = time.perf_counter() - start
    return {"model": "ResNet50 at 224x224, batch 32", "images": 96, "seconds": seconds, "peak_rss_mib": _peak_mib()}


def _embeddings(rows, seed, dim=DIM):
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(rows // 50, dim)).astype(np.float32)
    x = centres[rng.integers(0, len(centres), rows)] + 0.5 * rng.normal(size=(rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def part_shard_index(rows):
    import numpy as np

    from tfdml.retrieval import ScannIndex

    x = _embeddings(rows, 1)
    start = time.perf_counter()
    index = ScannIndex(x, ids=np.arange(rows), mode="auto")
    build = time.perf_counter() - start
    queries = _embeddings(10000, 2)
    start = time.perf_counter()
    index.search(queries, 10)
    search = time.perf_counter() - start
    return {
        "rows": rows,
        "mode": index.mode,
        "build_seconds": build,
        "recall": index.recall,
        "search_seconds_per_10k_queries": search,
        "index_bytes_estimate": int(x.nbytes),
        "peak_rss_mib": _peak_mib(),
    }


def part_evaluation_memory(work, shards, rows):
    """Writes `shards` shards of `rows` rows (TFRecord + exact index), then measures `query_shard_sums` of
    one query shard in this process: peak memory of the evaluation step against the catalogue's size."""
    import numpy as np

    from tfdml.beam import files as F
    from tfdml.retrieval import ScannIndex

    output = os.path.join(work, f"eval-{shards}")
    os.makedirs(output, exist_ok=True)
    records = []
    for shard in range(shards):
        x = _embeddings(rows, 10 + shard, EVAL_DIM)
        ids = [f"s{shard}-{i:07d}" for i in range(rows)]
        # Classes of 40 items, each spread over a pair of shards: R_q (and so the k searched) stays the same
        # whatever the number of shards, so that only the catalogue's size changes.
        classes = [f"c{shard // 2}-{i % (rows // 20)}" for i in range(rows)]
        name = os.path.basename(F.shard_file(output, shard, shards, "tfrecord"))
        F.write_shard(os.path.join(output, name), ids, classes, x, "tfrecord")
        ScannIndex(x, ids=np.asarray(ids), labels=np.asarray(classes), mode="exact").save(
            F.shard_index_dir(output, shard)
        )
        counts = {}
        for c in classes:
            counts[c] = counts.get(c, 0) + 1
        index_dir = f"indexes/shard-{shard:05d}"
        records.append({"shard": shard, "file": name, "rows": rows, "classes": counts, "index": {"dir": index_dir}})
        del x
    # Measured in a fresh process: the writing above is not part of the evaluation step.
    code = (
        "import json, sys, time, resource; "
        "from tfdml.beam.evaluation import gallery_counts, query_shard_sums; "
        "records = json.loads(sys.argv[2]); counts = gallery_counts(records); start = time.perf_counter(); "
        "query_shard_sums(records[0], sys.argv[1], records, counts, (1, 2, 4, 8), "
        "('recall', 'map@r', 'r_precision')); "
        "print(json.dumps({'seconds': time.perf_counter() - start, "
        "'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, output, json.dumps(records)], capture_output=True, text=True, check=True
    )
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(output)
    return {"shards": shards, "rows_per_shard": rows, "catalogue_rows": shards * rows, **measured}


def run_part(name, *args):
    """Runs one part in a fresh interpreter and returns its JSON result."""
    done = subprocess.run(
        [sys.executable, __file__, "--part", name, *map(str, args)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
    )
    if done.returncode:
        raise RuntimeError(f"part {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument(
        "--parts", nargs="+", choices=["embed", "shards", "backbone"], default=["embed", "shards", "backbone"]
    )
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json"))
    parser.add_argument("--part", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--table", metavar="RESULTS", help="print the Markdown table of a results file")
    args = parser.parse_args()
    if args.table:
        from benchmarks.beam.table import table

        print(table(json.load(open(args.table))))
        return
    if args.part:
        name, *rest = args.part
        functions = {
            "data": lambda work, count: {"version": make_data(work, int(count))},
            "export": part_export,
            "beam_inprocess": lambda work, version: part_beam(work, version, False),
            "beam_multiprocess": lambda work, version: part_beam(work, version, True),
            "shard_index": lambda rows: part_shard_index(int(rows)),
            "backbone": part_backbone,
            "evaluation_memory": lambda work, shards, rows: part_evaluation_memory(work, int(shards), int(rows)),
        }
        print(json.dumps(functions[name](*rest)))
        return
    results = {}
    if os.path.exists(args.out):  # a part measured before is kept unless run again
        with open(args.out) as f:
            results = json.load(f)
    results.update(
        machine={
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        image_size=[SOURCE_SIZE, SOURCE_SIZE],
        model=f"3 conv layers (32/64/128, stride 2) + GAP + Dense({DIM}) at {IMAGE_SIZE}x{IMAGE_SIZE}",
    )
    loads = [os.getloadavg()]
    if "embed" in args.parts:
        results["embed"] = []
        for count in args.images:  # two sizes: the difference is the rate without the fixed start-up cost
            work = tempfile.mkdtemp(prefix="bench-beam-")
            try:
                version = run_part("data", work, count)["version"]
                row = {"images": count}
                for name in ("export", "beam_inprocess", "beam_multiprocess"):
                    row[name] = run_part(name, work, version)
                    print(count, name, row[name], file=sys.stderr)
                results["embed"].append(row)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    if "shards" in args.parts:
        work = tempfile.mkdtemp(prefix="bench-beam-")
        try:
            results["shard_index"] = [run_part("shard_index", rows) for rows in (50000, 100000)]
            print(results["shard_index"], file=sys.stderr)
            results["evaluation_memory"] = [
                run_part("evaluation_memory", work, shards, EVAL_ROWS) for shards in (2, 4, 8)
            ]
            print(results["evaluation_memory"], file=sys.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if "backbone" in args.parts:
        results["backbone"] = run_part("backbone")
        print(results["backbone"], file=sys.stderr)
    loads.append(os.getloadavg())
    results["load_average"] = {"start": loads[0], "end": loads[1]}
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
