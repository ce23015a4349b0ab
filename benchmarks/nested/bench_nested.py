"""Nested (Matryoshka) embeddings: each prefix of one nested 64-d model against models trained at that size, and
searching a large catalogue on a 16-d prefix re-ranked with the full vector against the full-vector index.

    python -m benchmarks.nested.bench_nested --seeds 0 1 2                  # training part, both data sets
    python -m benchmarks.nested.bench_nested --catalogue 1000000            # search part (needs a fashion seed-0 run)
    python -m benchmarks.nested.bench_nested --summary-only                 # table.md from results.jsonl

Training part (per data set and seed, the same class-balanced batches for every model):

- `nested64`: the small CNN 16-32-64-128 with a 64-d embedding, `NestedLoss(MultiSimilarityLoss(), (8, 16, 32,
  64))`, evaluated on each prefix (L2-normalised);
- `plain64`: the same model with the multi-similarity loss on the full vector only, evaluated on the same
  prefixes (what truncating an ordinary embedding gives);
- `separate8`, `separate16`, `separate32`: the same model with an 8-, 16- or 32-d embedding and the plain loss.

Data: glyphs (`benchmarks/glyph_methods` protocol: 32 px, 20 images per character, 150 training characters, R@1
and MAP@R on the 151 unseen ones; 22 classes x 3 images per batch) and Fashion-MNIST (the system's IDX files,
`/usr/share/datasets/fashion-mnist`, read by `tfdml.data.idx`; trained on the training images of classes 0-4,
evaluated on the 5,000 test images of the unseen classes 5-9; 5 classes x 13 images per batch). 300 Adam steps
(2e-3) each.

Search part: the Fashion-MNIST seed-0 nested model embeds all 70,000 images; 1,000 test images of the unseen classes
are the queries and the other 69,000 the catalogue, grown to `--catalogue` items drawn from one Gaussian per class
(the mean and covariance of that class's real embeddings, each class as often as among the real ones), normalised:
the classes' distribution of directions at the asked size, without copies of real items. Compared on it: exact
search on the full vector (NumPy), the full-vector `ScannIndex` (as `tfdml export` builds it: recall target 0.95)
and `tfdml.export.PrefixIndex` on the 8-, 16- and 32-d prefixes (its shortlist sized for the same target), each by
recall@10 against exact full-vector search on the 1,000 queries, ms per query in a batch of 1,000 and one at a time
(200 queries), and build seconds. One JSON line per run is appended to `results.jsonl`; `table.md` is rebuilt from
all lines.
"""

import argparse
import json
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "benchmarks", "nested")
CACHE = os.path.join(OUT_DIR, ".cache")  # the seed-0 Fashion-MNIST embeddings the search part reads (not committed)
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
DIMS = (8, 16, 32, 64)
STEPS, LEARNING_RATE, WIDTHS = 300, 2e-3, (16, 32, 64, 128)
LOSS = ("MultiSimilarityLoss", {"alpha": 2.0, "beta": 50.0, "base": 0.5})
DATASETS = {
    "glyphs": {"image_size": 32, "classes_per_batch": 22, "samples_per_class": 3},
    "fashion_mnist": {"image_size": 28, "classes_per_batch": 5, "samples_per_class": 13},
}
SETUPS = ("nested64", "plain64", "separate8", "separate16", "separate32")
SEARCH_DIMS = (8, 16, 32)
QUERIES, SINGLE_QUERIES, K = 1000, 200, 10


def load(dataset):
    """`{train_x, train_y, test_x, test_y}`: float32 [N, s, s, 1] in [0, 1], int labels from 0."""
    if dataset == "glyphs":
        from benchmarks.glyph_methods import benchmark_methods as bm

        return bm.load_data(dict(bm.CONFIG, image_size=DATASETS["glyphs"]["image_size"]))
    from tfdml.data.idx import read_idx

    def split(name):
        images = read_idx(os.path.join(FASHION_DIR, f"{name}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(FASHION_DIR, f"{name}-labels-idx1-ubyte.gz")).astype(np.int64)
        return images[..., None].astype(np.float32) / 255.0, labels

    train_x, train_y = split("train")
    test_x, test_y = split("t10k")
    seen = train_y < 5
    return {
        "train_x": train_x[seen],
        "train_y": train_y[seen],
        "test_x": test_x[test_y >= 5],
        "test_y": test_y[test_y >= 5],
    }


def train(dataset, data, setup, seed):
    import keras
    import tensorflow as tf

    from benchmarks.glyph_methods import benchmark_methods as bm
    from tfdml import losses

    spec = DATASETS[dataset]
    dim = 64 if setup.endswith("64") else int(setup[len("separate") :])
    config = {"image_size": spec["image_size"], "embedding_dim": dim, "widths": list(WIDTHS)}
    model = bm.tfdml_embedder(config, seed=seed)
    loss = getattr(losses, LOSS[0])(**LOSS[1])
    if setup == "nested64":
        loss = losses.NestedLoss(loss, DIMS)
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE), loss=loss)
    batches = bm.index_batches(data["train_y"], spec["classes_per_batch"], spec["samples_per_class"], STEPS, seed)
    images, labels = tf.constant(data["train_x"]), tf.constant(data["train_y"])
    batched = tf.data.Dataset.from_tensor_slices(batches).map(lambda i: (tf.gather(images, i), tf.gather(labels, i)))
    start = time.process_time()
    model.fit(batched.prefetch(2), epochs=1, steps_per_epoch=len(batches), verbose=0)
    return model, time.process_time() - start


def prefix(embeddings, dim):
    part = embeddings[:, :dim]
    return part / np.maximum(np.linalg.norm(part, axis=1, keepdims=True), 1e-12)


def run_training(dataset, data, setup, seed):
    from benchmarks.glyph_methods import benchmark_methods as bm

    model, seconds = train(dataset, data, setup, seed)
    embeddings = bm.embed(model, data["test_x"])
    dims = [d for d in DIMS if d <= embeddings.shape[1]] if setup.endswith("64") else [embeddings.shape[1]]
    scores = {str(d): bm.evaluate(prefix(embeddings, d), data["test_y"]) for d in dims}
    if dataset == "fashion_mnist" and setup == "nested64" and seed == 0:
        _cache_catalogue(model)
    return {
        "part": "training",
        "dataset": dataset,
        "setup": setup,
        "seed": seed,
        "steps": STEPS,
        "train_cpu_seconds": seconds,
        "prefixes": scores,
    }


def _cache_catalogue(model):
    from benchmarks.glyph_methods import benchmark_methods as bm
    from tfdml.data.idx import read_idx

    images = np.concatenate(
        [read_idx(os.path.join(FASHION_DIR, f"{s}-images-idx3-ubyte.gz")) for s in ("t10k", "train")]
    )
    labels = np.concatenate(
        [read_idx(os.path.join(FASHION_DIR, f"{s}-labels-idx1-ubyte.gz")) for s in ("t10k", "train")]
    )
    embeddings = bm.embed(model, images[..., None].astype(np.float32) / 255.0)
    os.makedirs(CACHE, exist_ok=True)
    np.savez(os.path.join(CACHE, "fashion_seed0.npz"), embeddings=embeddings, labels=labels, test_items=10000)


def catalogue(size, seed=0):
    """`(gallery [size, 64], queries [QUERIES, 64])` from the cached embeddings (see the module docstring)."""
    cached = np.load(os.path.join(CACHE, "fashion_seed0.npz"))
    embeddings, labels = cached["embeddings"].astype(np.float64), cached["labels"]
    rng = np.random.default_rng(seed)
    unseen_test = np.flatnonzero((np.arange(len(labels)) < int(cached["test_items"])) & (labels >= 5))
    query_rows = rng.choice(unseen_test, QUERIES, replace=False)
    real = np.delete(np.arange(len(labels)), query_rows)
    extra = max(0, size - len(real))
    # Drawn from one Gaussian per class (the class's mean and covariance), each class as often as among the real.
    classes = rng.choice(labels[real], extra)
    drawn = np.empty((extra, embeddings.shape[1]))
    for c in np.unique(classes):
        rows = embeddings[real][labels[real] == c]
        where = np.flatnonzero(classes == c)
        drawn[where] = rng.multivariate_normal(rows.mean(axis=0), np.cov(rows, rowvar=False), len(where))
    gallery = np.concatenate([embeddings[real], drawn])[:size]
    return np.ascontiguousarray(prefix(gallery, gallery.shape[1]), np.float32), embeddings[query_rows].astype(
        np.float32
    )


def _timed(fn, queries, single):
    start = time.perf_counter()
    found = fn(queries)
    batch_ms = 1000 * (time.perf_counter() - start) / len(queries)
    start = time.perf_counter()
    for query in queries[:single]:
        fn(query[None])
    return found, batch_ms, 1000 * (time.perf_counter() - start) / single


def run_search(size):
    from tfdml.export.prefix import PrefixIndex
    from tfdml.retrieval import ScannIndex
    from tfdml.retrieval.tuning import exact_neighbours

    gallery, queries = catalogue(size)
    exact, exact_ms, exact_single_ms = _timed(
        lambda q: exact_neighbours(q, gallery, K, "dot_product"), queries, SINGLE_QUERIES // 4
    )
    rows = [{"method": "exact_full", "recall@10": 1.0, "ms_batch": exact_ms, "ms_single": exact_single_ms}]
    builders = {"scann_full": lambda: ScannIndex(gallery)}
    builders.update({f"prefix{d}": (lambda d=d: PrefixIndex(gallery, d)) for d in SEARCH_DIMS})
    for method, build in builders.items():
        start = time.perf_counter()
        index = build()
        build_seconds = time.perf_counter() - start
        found, batch_ms, single_ms = _timed(
            lambda q, i=index: i.search(q, k=K, positions=True)[0], queries, SINGLE_QUERIES
        )
        recall = float(np.mean([len(set(a) & set(b)) / K for a, b in zip(found, exact)]))
        rows.append(
            {
                "method": method,
                "recall@10": recall,
                "ms_batch": batch_ms,
                "ms_single": single_ms,
                "build_seconds": build_seconds,
                "index_mode": index.mode,
                "record": index.recall,
            }
        )
        del index
    return {
        "part": "search",
        "catalogue": int(len(gallery)),
        "synthetic": "gaussian_per_class",
        "queries": QUERIES,
        "k": K,
        "rows": rows,
    }


# ------------------------------------------------------------------------------------------------ results
def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _mean_sd(values):
    values = np.asarray(values, np.float64)
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if len(values) > 1 else f"{values.mean():.3f}"


def training_table(records):
    lines = []
    for dataset in DATASETS:
        rows = [r for r in records if r["part"] == "training" and r["dataset"] == dataset]
        # Only seeds that every set-up ran: each column then averages the same seeds.
        seeds = sorted(
            s for s in {r["seed"] for r in rows} if {r["setup"] for r in rows if r["seed"] == s} >= set(SETUPS)
        )
        rows = [r for r in rows if r["seed"] in seeds]
        if not rows:
            continue
        lines += [
            f"**{dataset}** (unseen classes; mean ± sd over seeds {', '.join(map(str, seeds))})",
            "",
            "| dims | metric | nested 64-d, prefix | trained at that size | plain 64-d, prefix |",
            "|---:|---|---:|---:|---:|",
        ]
        for dim in DIMS:

            def scores(setup, metric, dim=dim, rows=rows):
                return [
                    r["prefixes"][str(dim)][metric] for r in rows if r["setup"] == setup and str(dim) in r["prefixes"]
                ]

            separate = "plain64" if dim == 64 else f"separate{dim}"
            for metric, name in (("recall@1", "R@1"), ("map@r", "MAP@R")):
                cells = [scores("nested64", metric), scores(separate, metric), scores("plain64", metric)]
                lines.append(f"| {dim} | {name} | " + " | ".join(_mean_sd(c) if c else "" for c in cells) + " |")
        lines.append("")
    return lines


def search_table(records):
    lines = []
    for record in [r for r in records if r["part"] == "search"][-1:]:
        lines += [
            f"**Search**: {record['catalogue']:,} items (64-d), {record['queries']:,} queries, k = {record['k']}",
            "",
            "| method | recall@10 vs exact full | ms / query (batch) | ms / query (single) | build s | setting |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for row in record["rows"]:
            build = f"{row['build_seconds']:.1f}" if "build_seconds" in row else ""
            lines.append(
                f"| {row['method']} | {row['recall@10']:.4f} | {row['ms_batch']:.3f} | {row['ms_single']:.3f} "
                f"| {build} | {_setting(row)} |"
            )
        lines.append("")
    return lines


def _setting(row):
    """How an index of the search part ended up searching, from its recall record."""
    rec = row.get("record") or {}
    if "shortlist" in rec:
        verdict = "meets" if rec["met"] else "misses"
        how = "ScaNN" if row["index_mode"] == "approximate" else "brute force (its ScaNN index fell back)"
        return (
            f"prefix searched by {how}; shortlist {rec['shortlist']} ({rec['shortlist_factor']} x k): tuning recall "
            f"{rec['measured']:.4f}, bound {rec['lower_bound']:.4f} {verdict} target {rec['target']:g}"
        )
    if rec.get("fell_back"):
        return (
            f"fell back to brute force: approximate recall@10 {rec['approximate_recall']:.4f} with all "
            f"{rec['num_leaves']} leaves searched, {rec['reorder']} re-ordered < target {rec['target']:g}"
        )
    if rec:
        return f"ScaNN, {rec['leaves_to_search']}/{rec['num_leaves']} leaves, reorder {rec['reorder']}"
    return "NumPy brute force (the reference)"


def write_table(records):
    with open(os.path.join(OUT_DIR, "table.md"), "w") as f:
        f.write("\n".join(training_table(records) + search_table(records)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--catalogue", type=int, default=0, help="items of the search part (0: skip it)")
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args(argv)
    path = os.path.join(OUT_DIR, "results.jsonl")
    if not args.summary_only:
        for dataset in args.datasets if args.seeds else []:
            data = load(dataset)
            for seed in args.seeds:
                for setup in args.setups:
                    line = run_training(dataset, data, setup, seed)
                    print(json.dumps(line), flush=True)
                    with open(path, "a") as f:
                        f.write(json.dumps(line) + "\n")
        if args.catalogue:
            line = run_search(args.catalogue)
            print(json.dumps(line), flush=True)
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
    write_table(read_lines(path))


if __name__ == "__main__":
    main()
