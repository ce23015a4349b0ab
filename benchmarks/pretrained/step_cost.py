"""What a metric loss costs in a fine-tuning step: images per second of `model.fit` on EfficientNet-Lite0
(ImageNet weights, every layer trained) with each loss, against a plain Keras `fit` with softmax
cross-entropy on a 1000-way classifier over the same backbone, on the same batches, in one process.

Each model trains on the same fixed class-balanced batches (C classes x K images of random pixels) for
`--steps` steps after `--warmup` untimed ones (tracing), in turns (softmax, loss 1, ..., softmax, loss 1, ...)
so that a change of the machine's load falls on every row alike; the table reports the median over turns of
each row's images per second and its ratio to the softmax step measured in the same turn.

    python benchmarks/pretrained/step_cost.py                 # writes step_cost.jsonl and step_cost.md here
    python benchmarks/pretrained/step_cost.py --image-size 224 --turns 3
"""

import argparse
import json
import os
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

import tfdml
from benchmarks.pretrained import pretrained
from tfdml.models import efficientnet_lite

HERE = os.path.dirname(os.path.abspath(__file__))
LOSSES = ("ranked_list", "triplet_semihard", "margin", "multi_similarity", "contrastive")


def softmax_model(size):
    backbone = efficientnet_lite.efficientnet_lite("efficientnet_lite0", (size, size, 3))
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Rescaling(1 / 127.5, -1.0)(inputs)
    logits = keras.layers.Dense(1000)(keras.layers.GlobalAveragePooling2D()(backbone(x)))
    model = keras.Model(inputs, logits)
    model.compile(keras.optimizers.Adam(1e-4), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def metric_model(size, loss):
    model = tfdml.models.Embedder("efficientnet_lite0", embedding_dim=128, input_shape=(size, size, 3))
    model.compile(keras.optimizers.Adam(1e-4), loss=loss)
    return model


def images_per_second(model, batches, warmup, steps):
    model.fit(batches.take(warmup), verbose=0)
    started = time.perf_counter()
    model.fit(batches.take(steps), verbose=0)
    return steps * int(batches.element_spec[0].shape[0]) / (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--classes", type=int, default=8, help="C classes per batch")
    parser.add_argument("--per-class", type=int, default=4, help="K images per class")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    batch = args.classes * args.per_class
    pixels = rng.uniform(0, 255, (batch, args.image_size, args.image_size, 3)).astype(np.float32)
    labels = np.repeat(np.arange(args.classes), args.per_class).astype(np.int64)
    batches = tf.data.Dataset.from_tensors((pixels, labels)).repeat()
    models = {"softmax": softmax_model(args.image_size)}
    models.update({loss: metric_model(args.image_size, loss) for loss in LOSSES})
    turns = []
    for _ in range(args.turns):
        turns.append({name: images_per_second(m, batches, args.warmup, args.steps) for name, m in models.items()})
    rows = []
    for name in models:
        rate = statistics.median(t[name] for t in turns)
        ratio = statistics.median(t[name] / t["softmax"] for t in turns)
        rows.append({"loss": name, "images_per_s": round(rate, 2), "vs_softmax": round(ratio, 3)})
    machine = pretrained.machine()
    setting = {"image_size": args.image_size, "batch": f"{args.classes}x{args.per_class}", "steps": args.steps}
    with open(os.path.join(HERE, "step_cost.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps({**row, **setting, "turns": args.turns, "machine": machine}) + "\n")
    lines = [
        "| loss | images / s | step time against softmax |",
        "|---|---|---|",
    ]
    for row in rows:
        extra = "" if row["loss"] == "softmax" else f" ({100 * (1 / row['vs_softmax'] - 1):+.1f} %)"
        lines.append(f"| {row['loss']} | {row['images_per_s']:.1f} | {1 / row['vs_softmax']:.3f}x{extra} |")
    with open(os.path.join(HERE, "step_cost.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
