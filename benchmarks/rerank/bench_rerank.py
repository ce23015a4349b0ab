"""What alpha-QE and DBA (`tfdml.retrieval.expansion`) gain or lose on unseen classes, and what they cost.

    nice python -m benchmarks.rerank.bench_rerank                       # glyphs and Fashion-MNIST, seeds 0-4
    nice python -m benchmarks.rerank.bench_rerank --datasets glyphs --seeds 0 1
    python -m benchmarks.rerank.bench_rerank --table-only                # rebuild table.md from results.jsonl

Protocol: for each data set and seed, a small CNN (`tfdml.models.small_cnn`, widths 16-32-64-128, global
average pool, Dense 64, L2 normalisation) is trained from scratch with Ranked List Loss (margin 0.4, alpha 1.2,
Tn 10, uniform query weighting) and Adam (2e-3) for a fixed number of steps on class-balanced C x K index
batches of the training classes; the classes held out of training are then searched, every image a query
against all the others (same-set mode). Each re-ranking is scored by `tfdml.retrieval.evaluate` on the same
embeddings (Recall@1 and MAP@R, exact search):

- glyphs: `tfdml.data.glyphs` at 32 px, 20 images per class, 150 training characters, 151 unseen ones;
  22 classes x 3 images per batch, 300 steps.
- Fashion-MNIST: the idx files under `/usr/share/datasets/fashion-mnist` (read by `read_idx` below); training
  on the training split of classes 0-4, retrieval on the test split of classes 5-9 (5,000 images, 1,000 per
  class); 5 classes x 12 images per batch, 300 steps.

Cost per query: the wall time of an exact top-10 search of every query (`tfdml.ops.exact_search`), with and
without alpha-QE before it (QE's own search plus the second one), divided by the number of queries; DBA's cost
is offline, once per gallery (`database_augmentation` of the whole gallery), given per gallery item. Times
are best of 3 on a shared 2-core machine. Lines are appended to `results.jsonl`; `table.md` is rebuilt
from them (mean and standard deviation over the seeds of each data set).
"""

import argparse
import datetime
import json
import os
import statistics
import time

import numpy as np

from benchmarks.glyph_methods.benchmark_methods import index_batches
from tfdml.data.idx import read_idx

HERE = os.path.dirname(os.path.abspath(__file__))
FASHION = "/usr/share/datasets/fashion-mnist"
ALPHA = 3.0
# (name, query_expansion, database_augmentation)
VARIANTS = (
    ("plain", 0, 0),
    ("QE n=1", 1, 0),
    ("QE n=2", 2, 0),
    ("QE n=5", 5, 0),
    ("DBA n=2", 0, 2),
    ("DBA n=2 + QE n=2", 2, 2),
)
CONFIG = {
    "glyphs": {"image_size": 32, "classes_per_batch": 22, "samples_per_class": 3, "steps": 300},
    "fashion_mnist": {"image_size": 28, "classes_per_batch": 5, "samples_per_class": 12, "steps": 300},
}
COMMON = {"widths": [16, 32, 64, 128], "embedding_dim": 64, "learning_rate": 2e-3, "alpha": ALPHA}


def load(dataset):
    """`(train_x [N, S, S, 1] in [0, 1], train_y contiguous, test_x, test_y)` of the training and unseen classes."""
    if dataset == "glyphs":
        from tfdml.data.glyphs import glyph_arrays

        train_x, train_y, _ = glyph_arrays("train", image_size=32, images_per_class=20)
        test_x, test_y, _ = glyph_arrays("test", image_size=32, images_per_class=20)
    else:
        train_x = read_idx(f"{FASHION}/train-images-idx3-ubyte.gz")[..., None]
        train_y = read_idx(f"{FASHION}/train-labels-idx1-ubyte.gz").astype(np.int64)
        test_x = read_idx(f"{FASHION}/t10k-images-idx3-ubyte.gz")[..., None]
        test_y = read_idx(f"{FASHION}/t10k-labels-idx1-ubyte.gz").astype(np.int64)
        seen, unseen = train_y < 5, test_y >= 5  # half the classes held out of training
        train_x, train_y, test_x, test_y = train_x[seen], train_y[seen], test_x[unseen], test_y[unseen]
    _, train_y = np.unique(train_y, return_inverse=True)
    return (
        train_x.astype(np.float32) / 255.0,
        train_y.astype(np.int64),
        test_x.astype(np.float32) / 255.0,
        test_y.astype(np.int64),
    )


def train_and_embed(train_x, train_y, test_x, config, seed):
    import keras
    import tensorflow as tf

    from tfdml.losses import RankedListLoss
    from tfdml.models import Embedder

    keras.utils.set_random_seed(seed)
    size = config["image_size"]
    model = Embedder(
        "small_cnn",
        embedding_dim=COMMON["embedding_dim"],
        input_shape=(size, size, 1),
        weights=None,
        widths=tuple(COMMON["widths"]),
        preprocessing=None,
    )
    batches = index_batches(train_y, config["classes_per_batch"], config["samples_per_class"], config["steps"], seed)
    images, labels = tf.constant(train_x), tf.constant(train_y)
    dataset = tf.data.Dataset.from_tensor_slices(batches).map(lambda i: (tf.gather(images, i), tf.gather(labels, i)))
    loss = RankedListLoss(margin=0.4, alpha=1.2, tn=10.0, query_weighting="uniform")
    model.compile(optimizer=keras.optimizers.Adam(COMMON["learning_rate"]), loss=loss)
    started = time.perf_counter()
    model.fit(dataset.prefetch(2), epochs=1, steps_per_epoch=len(batches), verbose=0)
    train_s = time.perf_counter() - started
    embeddings = np.concatenate(
        [np.asarray(model(test_x[i : i + 512], training=False)) for i in range(0, len(test_x), 512)]
    )
    return embeddings.astype(np.float32), train_s


def best_of(function, repeats=3):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def costs(embeddings):
    """ms per query of a top-10 search without and with alpha-QE (n=2), and DBA (n=2) ms per gallery item."""
    from tfdml.ops.neighbours import exact_search
    from tfdml.retrieval.expansion import database_augmentation, query_expansion

    count = len(embeddings)
    plain = best_of(lambda: exact_search(embeddings, None, 10, "dot_product"))
    qe = best_of(
        lambda: exact_search(
            query_expansion(embeddings, embeddings, 2, ALPHA, same_set=True), embeddings, 11, "dot_product"
        )
    )
    dba = best_of(lambda: database_augmentation(embeddings, 2, ALPHA))
    return {
        "search_ms_per_query": 1e3 * plain / count,
        "qe_search_ms_per_query": 1e3 * qe / count,
        "dba_ms_per_item": 1e3 * dba / count,
    }


def run(datasets, seeds, out):
    from tfdml.retrieval import evaluate

    data = {dataset: load(dataset) for dataset in datasets}
    for seed in seeds:  # seed by seed: a run cut short still covers every data set
        for dataset, (train_x, train_y, test_x, test_y) in data.items():
            embeddings, train_s = train_and_embed(train_x, train_y, test_x, CONFIG[dataset], seed)
            row = {"dataset": dataset, "seed": seed, "queries": len(test_y), "classes": len(np.unique(test_y))}
            for name, qe, dba in VARIANTS:
                result = evaluate(
                    embeddings,
                    test_y,
                    ks=(1,),
                    metrics=("recall", "map@r"),
                    query_expansion=qe,
                    database_augmentation=dba,
                    expansion_alpha=ALPHA,
                )
                row[name] = {"recall@1": result["recall@1"], "map@r": result["map@r"]}
            row.update(costs(embeddings))
            row.update(
                train_s=round(train_s, 1),
                config=dict(CONFIG[dataset], **COMMON),
                load_average=os.getloadavg()[0],
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            )
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(dataset, seed, {name: row[name] for name, _, _ in VARIANTS}, flush=True)


def _mean_sd(values, scale=1.0, digits=3):
    values = [scale * v for v in values]
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def table(results):
    """Markdown: per data set, each variant's Recall@1 and MAP@R (mean ± sd over seeds) and its change from
    plain search; then the costs."""
    rows = [json.loads(line) for line in open(results) if line.strip()]
    lines = []
    for dataset in CONFIG:
        runs = [row for row in rows if row["dataset"] == dataset]
        if not runs:
            continue
        seeds = sorted(row["seed"] for row in runs)
        lines += [
            f"**{dataset}** ({runs[0]['classes']} unseen classes, {runs[0]['queries']} queries; seeds {seeds}, "
            f"alpha {ALPHA:g})",
            "",
            "| re-ranking | Recall@1 | change | MAP@R | change |",
            "|---|---|---|---|---|",
        ]
        for name, _, _ in VARIANTS:
            cells = []
            for metric in ("recall@1", "map@r"):
                cells.append(_mean_sd([row[name][metric] for row in runs]))
                changes = [row[name][metric] - row["plain"][metric] for row in runs]
                cells.append("" if name == "plain" else "+" * (statistics.mean(changes) >= 0) + _mean_sd(changes))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| cost | ms |",
            "|---|---|",
            f"| exact top-10 search, per query | {_mean_sd([r['search_ms_per_query'] for r in runs], digits=4)} |",
            f"| alpha-QE (n=2) and the search, per query | "
            f"{_mean_sd([r['qe_search_ms_per_query'] for r in runs], digits=4)} |",
            f"| DBA (n=2), offline, per gallery item | {_mean_sd([r['dba_ms_per_item'] for r in runs], digits=4)} |",
            f"| ratio: alpha-QE and the search / the search alone | "
            f"{_mean_sd([r['qe_search_ms_per_query'] / r['search_ms_per_query'] for r in runs], digits=2)} |",
            "",
        ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(CONFIG), choices=list(CONFIG))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default=os.path.join(HERE, "results.jsonl"))
    parser.add_argument("--table-only", action="store_true", help="rebuild table.md from the results only.")
    args = parser.parse_args(argv)
    if not args.table_only:
        run(args.datasets, args.seeds, args.out)
    with open(os.path.join(os.path.dirname(args.out), "table.md"), "w") as f:
        f.write(table(args.out))


if __name__ == "__main__":
    main()
