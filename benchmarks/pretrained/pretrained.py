"""Retrieval from an ImageNet-pretrained backbone (EfficientNet-Lite0), the regime of the papers and of users:
raw pixels, frozen ImageNet features, heads trained on the frozen features with each loss (Group Loss and
DML-ALA against its uniform twin among them), multi-level RLL against its H-only twin, nested heads by prefix,
and the `tfdml train --image-dir` defaults fine-tuning the whole network.

Every method trains on one half of a data set's classes and retrieves the unseen other half (Recall@1 and
MAP@R, %), seeds 0-4 (0-2 for fine-tuning), one JSON line per run in `results.jsonl` (`nested.jsonl` for the
nested heads); `table.md`, `paired.md` and `nested.md` are written from them. Data sets:

- `icons`: the desktop icon themes Debian packages, one class per icon name drawn by 8+ designers
  (`icons.py` builds the folder; 265 classes, 2,711 images); the `tfdml train --image-dir` split: the first
  half of the sorted class names to train, the second to retrieve;
- `glyphs`: the embedded 301-character data set (the main job's split, 150 / 151 characters), grey as RGB;
- `fashion`: Fashion-MNIST from the system package `dataset-fashion-mnist` (classes 0-4 to train, 2,000
  images each; the 5,000 test images of classes 5-9 to retrieve), grey as RGB.

    python -m benchmarks.pretrained.pretrained frozen --data icons --sizes 96,128,160,224
    python -m benchmarks.pretrained.pretrained heads --data icons,glyphs,fashion
    python -m benchmarks.pretrained.pretrained nested --data icons,glyphs,fashion
    python -m benchmarks.pretrained.pretrained finetune --data icons --seeds 0,1,2
    python -m benchmarks.pretrained.pretrained table
"""

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

import tfdml
from tfdml.ala_options import episode_sizes
from tfdml.data.glyphs import glyph_arrays
from tfdml.data.sources import class_halves

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results.jsonl")
ICONS = os.environ.get("TFDML_ICONS", "/tmp/icons")
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
IMAGE_SIZE = {"icons": 160, "glyphs": 64, "fashion": 64}
# Heads on frozen features: 300 steps of 8 classes x 4 images (fashion: 5 x 12, it has 5 training classes),
# a 128-d embedding, Adam at 1e-3, each loss at its library defaults.
HEAD_STEPS, HEAD_DIM, HEAD_LR = 300, 128, 1e-3
HEAD_LOSSES = ("ranked_list", "triplet_semihard", "margin", "multi_similarity", "contrastive", "proxy_anchor")
# Group Loss's head carries a classifier, trained alone with softmax cross-entropy for this many steps first (the
# paper's classification pre-training), then Group Loss for HEAD_STEPS at its library defaults.
GROUP_PRETRAIN_STEPS = 100
GROUP_METHODS = {"group": None, "group_6x9": (6, 9)}  # the benchmark's batch, or the official CUB one
# DML-ALA on the clean labels (the paper's claim) against its uniform twin, the base loss itself trained through the
# same episodes: ALAModel at its defaults on the head, each episode the head's batch plus one validation class per
# 5 training classes (fashion: 4 x 12 and 1 validation class, it has 5 training classes).
ALA_METHODS = ("ala_contrastive", "ala_uniform_contrastive", "ala_triplet", "ala_uniform_triplet")
# Nested embeddings from the pretrained backbone, the nested benchmark's protocol on heads: a 128-d head trained with
# NestedLoss(multi-similarity) over these prefixes, against heads trained at 8 and 16 dimensions and the plain
# 128-d head's prefixes; each prefix L2-normalised and evaluated on its own.
NESTED_DIMS = (8, 16, 32, 64, 128)
NESTED_SHOWN = (8, 16, 128)
NESTED_RESULTS = os.path.join(HERE, "nested.jsonl")
FEATURE_CACHE = os.environ.get("TFDML_FEATURE_CACHE", os.path.join(tempfile.gettempdir(), "tfdml-pretrained"))


def machine():
    """The CPU model, its cores and TensorFlow's version: figures repeat on one machine, not across machines."""
    model = platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    return {"cpu": model, "cores": os.cpu_count(), "tf": tf.__version__}


def _as_rgb(images, size):
    images = tf.convert_to_tensor(images, tf.float32)
    if images.shape[-1] == 1:
        images = tf.image.grayscale_to_rgb(images)
    return tf.image.resize(images, (size, size), antialias=True).numpy()


def load(name, size, center_crop=False):
    """`(train images, train labels, test images, test labels)`, RGB 0-255 floats at `size` px (icons: resized
    whole, or the centre crop the job evaluates a model trained with augmentation on)."""
    if name == "icons":
        train, test = class_halves(tfdml.data.image_folder(ICONS))
        arrays = []
        for source in (train, test):
            batches = tfdml.data.eval_dataset(source, 64, image_size=size, center_crop=center_crop)
            x, y = zip(*[(b[0].numpy(), b[1].numpy()) for b in batches])
            arrays += [np.concatenate(x), np.concatenate(y)]
        return tuple(arrays)
    if name == "glyphs":
        (train_x, train_y, _), (test_x, test_y, _) = (glyph_arrays(s) for s in ("train", "test"))
        return _as_rgb(train_x, size), train_y, _as_rgb(test_x, size), test_y
    if name == "fashion":
        from tfdml.data.idx import read_idx

        def part(prefix):
            x = read_idx(os.path.join(FASHION_DIR, f"{prefix}-images-idx3-ubyte.gz"))[..., None]
            return x, read_idx(os.path.join(FASHION_DIR, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64)

        (train_x, train_y), (test_x, test_y) = part("train"), part("t10k")
        rng = np.random.default_rng(2024)
        draws = [rng.choice(np.flatnonzero(train_y == c), 2000, replace=False) for c in range(5)]
        kept = np.sort(np.concatenate(draws))
        unseen = test_y >= 5
        return _as_rgb(train_x[kept], size), train_y[kept], _as_rgb(test_x[unseen], size), test_y[unseen]
    raise ValueError(f"unknown data set {name!r}")


def scores(embeddings, labels):
    result = tfdml.retrieval.evaluate(embeddings, labels, ks=(1,), metrics=("recall", "map@r"))
    return {"recall@1": round(100 * result["recall@1"], 2), "map@r": round(100 * result["map@r"], 2)}


def record(row, results=RESULTS):
    row = {**row, "machine": machine()}
    with open(results, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def frozen(args):
    for name in args.data:
        for size in args.sizes or [IMAGE_SIZE[name]]:
            train_x, train_y, test_x, test_y = load(name, size, args.center_crop)
            crop = " (centre crop)" if args.center_crop else ""
            flat = test_x.reshape(len(test_x), -1)
            record({"data": name, "method": f"raw pixels{crop}", "image_size": size, **scores(flat, test_y)})
            embedder = tfdml.models.Embedder("efficientnet_lite0", embedding_dim=None, input_shape=(size, size, 3))
            started = time.perf_counter()
            embeddings = embedder.predict(test_x, batch_size=64, verbose=0)
            seconds = time.perf_counter() - started
            method = f"frozen ImageNet features{crop}"
            row = {"data": name, "method": method, "image_size": size, **scores(embeddings, test_y)}
            record({**row, "images_per_s": round(len(test_x) / seconds, 1)})


def _head_embedder(kind, size, num_classes=None, dim=HEAD_DIM):
    common = dict(embedding_dim=dim, input_shape=(size, size, 3), freeze_backbone=True, num_classes=num_classes)
    if kind == "multilevel":
        return tfdml.models.MultiLevelEmbedder("efficientnet_lite0", **common)
    return tfdml.models.Embedder("efficientnet_lite0", **common)


def _loss(name, num_classes):
    if name == "rll_lmh":
        return tfdml.losses.get("ranked_list")
    if name == "proxy_anchor":  # one proxy per training class id
        return tfdml.losses.ProxyAnchorLoss(num_classes, HEAD_DIM)
    if name in GROUP_METHODS:
        return tfdml.losses.GroupLoss(num_classes)
    return tfdml.losses.get(name)


_IMAGES = {}


def _images(name):
    """`load(name)` at the data set's head size, read once per process."""
    if name not in _IMAGES:
        _IMAGES[name] = load(name, IMAGE_SIZE[name])
    return _IMAGES[name]


def _features(name, kind, embedder):
    """The frozen backbone's features of the training and test images, computed once per data set and level
    layout and kept on disk (`TFDML_FEATURE_CACHE`): the same for every seed and loss."""
    path = os.path.join(FEATURE_CACHE, f"{name}-{kind}-{IMAGE_SIZE[name]}.npz")
    if os.path.exists(path):
        with np.load(path) as saved:
            count = len(saved.files) // 2
            return [saved[f"train{i}"] for i in range(count)], [saved[f"test{i}"] for i in range(count)]
    train_x, _, test_x, _ = _images(name)
    train_f = tfdml.training.backbone_features(embedder, train_x)
    test_f = tfdml.training.backbone_features(embedder, test_x)
    os.makedirs(FEATURE_CACHE, exist_ok=True)
    parts = {f"train{i}": f for i, f in enumerate(train_f)} | {f"test{i}": f for i, f in enumerate(test_f)}
    np.savez(path + ".tmp.npz", **parts)
    os.replace(path + ".tmp.npz", path)
    return train_f, test_f


def _fit_ala(method, embedder, train_f, train_y, batch, seed):
    """DML-ALA (or its uniform twin) on the embedder's H head over cached pooled features, read as 1 x 1 maps."""
    base_loss = method.rsplit("_", 1)[1]
    weighting = "uniform" if "_uniform_" in method else "assessor"
    features = train_f[0][:, None, None, :]
    source = tfdml.data.array_source(features, train_y)
    head = keras.Sequential([keras.Input(features.shape[1:]), embedder.level_heads[0], embedder.normalize])
    model = tfdml.models.ALAModel(head, base_loss=base_loss, weighting=weighting)
    model.compile(optimizer=keras.optimizers.Adam(HEAD_LR))
    val_classes = 1 if batch[0] < 8 else None
    sizes = episode_sizes(*batch, val_classes=val_classes)
    episodes = tfdml.data.episode_dataset(source, **sizes, seed=seed).take(HEAD_STEPS)
    model.fit(episodes, epochs=1, verbose=0)


def heads(args):
    for name in args.data:
        size = IMAGE_SIZE[name]
        train_y, test_y = _labels(name)
        num_classes = int(train_y.max()) + 1
        batch = (5, 12) if len(np.unique(train_y)) < 8 else (8, 4)
        ala_batch = (4, 12) if batch[0] < 8 else batch
        for method in args.losses:
            kind = "multilevel" if method == "rll_lmh" else "single"
            for seed in args.seeds:
                keras.utils.set_random_seed(seed)
                group = method in GROUP_METHODS
                embedder = _head_embedder(kind, size, num_classes if group else None)
                train_f, test_f = _features(name, kind, embedder)
                started = time.process_time()
                if method in ALA_METHODS:
                    _fit_ala(method, embedder, train_f, train_y, ala_batch, seed)
                else:
                    tfdml.training.fit_heads(
                        embedder,
                        train_f,
                        train_y,
                        loss=_loss(method, num_classes),
                        optimizer=keras.optimizers.Adam(HEAD_LR),
                        steps=HEAD_STEPS,
                        pretrain_steps=GROUP_PRETRAIN_STEPS if group else 0,
                        classes_per_batch=(GROUP_METHODS.get(method) or batch)[0],
                        samples_per_class=(GROUP_METHODS.get(method) or batch)[1],
                        seed=seed,
                    )
                cpu = time.process_time() - started
                embeddings = tfdml.training.FeatureHeads(embedder)(test_f).numpy()
                record(
                    {
                        "data": name,
                        "method": f"heads: {method}",
                        "seed": seed,
                        "image_size": size,
                        **scores(embeddings, test_y),
                        "train_cpu_s": round(cpu, 1),
                    }
                )


def _labels(name):
    """The training and test labels, kept beside the features (reading them needs the images otherwise)."""
    path = os.path.join(FEATURE_CACHE, f"{name}-labels-{IMAGE_SIZE[name]}.npz")
    if os.path.exists(path):
        with np.load(path) as saved:
            return saved["train"], saved["test"]
    _, train_y, _, test_y = _images(name)
    os.makedirs(FEATURE_CACHE, exist_ok=True)
    np.savez(path, train=train_y, test=test_y)
    return train_y, test_y


def nested(args):
    for name in args.data:
        size = IMAGE_SIZE[name]
        train_y, test_y = _labels(name)
        batch = (5, 12) if len(np.unique(train_y)) < 8 else (8, 4)
        for method, dim in (("nested", HEAD_DIM), ("plain", HEAD_DIM), ("trained at 8", 8), ("trained at 16", 16)):
            for seed in args.seeds:
                keras.utils.set_random_seed(seed)
                embedder = _head_embedder("single", size, dim=dim)
                train_f, test_f = _features(name, "single", embedder)
                loss = tfdml.losses.MultiSimilarityLoss()
                if method == "nested":
                    loss = tfdml.losses.NestedLoss(loss, dims=NESTED_DIMS)
                tfdml.training.fit_heads(
                    embedder, train_f, train_y, loss=loss, optimizer=keras.optimizers.Adam(HEAD_LR), steps=HEAD_STEPS,
                    classes_per_batch=batch[0], samples_per_class=batch[1], seed=seed,
                )  # fmt: skip
                embeddings = tfdml.training.FeatureHeads(embedder)(test_f).numpy()
                prefixes = [d for d in NESTED_SHOWN if d <= dim]
                by_prefix = {}
                for d in prefixes:
                    prefix = embeddings[:, :d] / np.linalg.norm(embeddings[:, :d], axis=1, keepdims=True)
                    by_prefix[str(d)] = scores(prefix, test_y)
                row = {"data": name, "method": method, "seed": seed, "image_size": size, "prefixes": by_prefix}
                record(row, NESTED_RESULTS)


def nested_lines(results):
    """The nested table: Recall@1 (MAP@R) at each prefix, mean ± sd over seeds."""
    runs = collections.defaultdict(list)
    with open(results) as f:
        for line in f:
            row = json.loads(line)
            runs[(row["data"], row["method"])].append(row["prefixes"])
    header = " | ".join(f"{d}-d Recall@1 (MAP@R)" for d in NESTED_SHOWN)
    lines = [f"| data | head | runs | {header} |", "|---|---|---|" + "---|" * len(NESTED_SHOWN)]
    for (data, method), rows in sorted(runs.items()):
        cells = []
        for d in NESTED_SHOWN:
            if str(d) not in rows[0]:
                cells.append("")
                continue
            r1 = np.array([r[str(d)]["recall@1"] for r in rows])
            mapr = np.array([r[str(d)]["map@r"] for r in rows])
            cells.append(f"{r1.mean():.1f}{_spread(r1)} ({mapr.mean():.1f})")
        lines.append(f"| {data} | {method} | {len(rows)} | " + " | ".join(cells) + " |")
    return lines


def finetune(args):
    for name in args.data:
        if name != "icons":
            raise SystemExit("finetune runs the `tfdml train --image-dir` defaults on the icon folder only")
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as report:
                command = [sys.executable, "-m", "tfdml", "train", "--image-dir", ICONS, "--seed", str(seed),
                           "--no-export", "--quiet", "--report-dir", report] + args.extra  # fmt: skip
                started = time.perf_counter()
                subprocess.run(command, check=True)
                with open(os.path.join(report, "metrics.json")) as f:
                    metrics = json.load(f)
                size = tfdml.config.load_config(os.path.join(report, "config.yaml")).data.image_size
            model = metrics["model"]
            record(
                {
                    "data": name,
                    "method": "tfdml train --image-dir defaults" + (f" {' '.join(args.extra)}" if args.extra else ""),
                    "seed": seed,
                    "image_size": size,
                    "recall@1": round(100 * model["recall@1"], 2),
                    "map@r": round(100 * model["map@r"], 2),
                    "train_s": round(metrics["train_seconds"], 1),
                    "wall_s": round(time.perf_counter() - started, 1),
                }
            )


def _spread(values):
    return f" ± {values.std(ddof=1):.1f}" if len(values) > 1 else ""


# Paired differences over the same seeds (the same head initialisation and batches): (method, its twin).
PAIRS = (
    ("ala_contrastive", "ala_uniform_contrastive"),
    ("ala_triplet", "ala_uniform_triplet"),
    ("ala_uniform_contrastive", "contrastive"),
    ("group_6x9", "group"),
)


def paired_lines(results):
    """Method minus its twin, per seed, Recall@1 and MAP@R points (mean ± sd over the seeds both ran)."""
    runs = collections.defaultdict(dict)
    with open(results) as f:
        for line in f:
            row = json.loads(line)
            if row["method"].startswith("heads: "):
                runs[(row["data"], row["method"][len("heads: ") :])][row["seed"]] = row
    lines = ["| data | method | minus | seeds | Recall@1 | MAP@R |", "|---|---|---|---|---|---|"]
    for data in sorted({data for data, _ in runs}):
        for method, twin in PAIRS:
            seeds = sorted(set(runs[(data, method)]) & set(runs[(data, twin)]))
            if not seeds:
                continue
            cells = []
            for metric in ("recall@1", "map@r"):
                diff = np.array([runs[(data, method)][s][metric] - runs[(data, twin)][s][metric] for s in seeds])
                cells.append(f"{diff.mean():+.1f}{_spread(diff)}")
            lines.append(f"| {data} | {method} | {twin} | {len(seeds)} | {cells[0]} | {cells[1]} |")
    return lines


def table(args):
    write_markdown("table.md", table_lines(RESULTS))
    write_markdown("paired.md", paired_lines(RESULTS))
    if os.path.exists(NESTED_RESULTS):
        write_markdown("nested.md", nested_lines(NESTED_RESULTS))


def table_lines(results):
    """The markdown table of the `results` file: one row per data set, method and size, mean ± sd over runs."""
    rows = collections.defaultdict(list)
    with open(results) as f:
        for line in f:
            row = json.loads(line)
            rows[(row["data"], row["method"], row.get("image_size"))].append(row)
    lines = ["| data | method | px | runs | Recall@1 | MAP@R |", "|---|---|---|---|---|---|"]
    order = ("raw", "frozen", "heads", "fine-tuned", "the --image-dir", "tfdml")  # baselines, then more training

    def place(item):
        (data, method, size), _ = item
        return data, size or IMAGE_SIZE[data], [i for i, m in enumerate(order) if method.startswith(m)][0], method

    for (data, method, size), runs in sorted(rows.items(), key=place):
        r1 = np.array([r["recall@1"] for r in runs])
        mapr = np.array([r["map@r"] for r in runs])
        lines.append(
            f"| {data} | {method} | {size or IMAGE_SIZE.get(data, '')} | {len(runs)} | "
            f"{r1.mean():.1f}{_spread(r1)} | {mapr.mean():.1f}{_spread(mapr)} |"
        )
    return lines


def write_markdown(name, lines):
    """Writes a table's `lines` to `name` beside this script and prints them."""
    with open(os.path.join(HERE, name), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("frozen", "heads", "nested", "finetune", "table"), help="which runs")
    parser.add_argument("--data", default="icons", type=lambda s: s.split(","), help="icons, glyphs, fashion")
    parser.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], help="frozen: image sizes")
    parser.add_argument("--center-crop", action="store_true", help="frozen: the job's evaluation crop (icons)")
    parser.add_argument("--seeds", default=[0, 1, 2, 3, 4], type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument(
        "--losses",
        default=list(HEAD_LOSSES) + ["rll_lmh"] + list(GROUP_METHODS) + list(ALA_METHODS),
        type=lambda s: s.split(","),
        help="heads: methods",
    )
    parser.add_argument("extra", nargs="*", help="finetune: extra `tfdml train` options (after --)")
    args = parser.parse_args()
    {"frozen": frozen, "heads": heads, "nested": nested, "finetune": finetune, "table": table}[args.what](args)


if __name__ == "__main__":
    main()
