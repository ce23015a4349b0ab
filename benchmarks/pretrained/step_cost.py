"""What a metric loss costs in a fine-tuning step: images per second of `model.fit` on EfficientNet-Lite0
(ImageNet weights, every layer trained) with each loss, against a plain Keras `fit` with softmax
cross-entropy on a 1000-way classifier over the same backbone, on the same batches, in one process.

Each model trains on the same fixed class-balanced batches (C classes x K images of random pixels) for
`--steps` steps after `--warmup` untimed ones (tracing), in turns (softmax, loss 1, ..., softmax, loss 1, ...)
so that a change of the machine's load falls on every row alike; the table reports the median over turns of
each row's images per second and its step time over the softmax step's in the same turn (wall clock and
this process's CPU time). On a shared CPU those ratios move by 10-20 % from run to run, more than a loss
costs; so each loss's value and gradient on one batch of embeddings are also timed alone, the most the loss
can add to a step, and shown as a share of the step.

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


def step_seconds(model, batches, warmup, steps):
    """`(wall, CPU)` seconds a step: CPU time counts this process's threads only, so it moves less than the
    wall clock when other jobs share the machine."""
    model.fit(batches.take(warmup), verbose=0)
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(batches.take(steps), verbose=0)
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def loss_alone_seconds(loss, labels, dim, repeats=50):
    """The loss's value and its gradient with respect to the embeddings of one batch, alone: best of `repeats`
    calls of one `tf.function`, the most the loss can add to a step."""
    embeddings = tf.math.l2_normalize(tf.random.stateless_normal((len(labels), dim), (0, 1)), -1)
    labels = tf.constant(labels)

    @tf.function
    def call(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(labels, x)
        return value, tape.gradient(value, x)

    call(embeddings)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        [t.numpy() for t in call(embeddings)]
        times.append(time.perf_counter() - started)
    return min(times)


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
        turns.append({name: step_seconds(m, batches, args.warmup, args.steps) for name, m in models.items()})
    rows = []
    for name, model in models.items():
        wall = statistics.median(t[name][0] for t in turns)
        cpu_ratio = statistics.median(t[name][1] / t["softmax"][1] for t in turns)
        wall_ratio = statistics.median(t[name][0] / t["softmax"][0] for t in turns)
        alone = None if name == "softmax" else loss_alone_seconds(model.loss, labels, 128)
        rows.append(
            {
                "loss": name,
                "images_per_s": round(batch / wall, 2),
                "step_vs_softmax_wall": round(wall_ratio, 3),
                "step_vs_softmax_cpu": round(cpu_ratio, 3),
                "loss_alone_ms": None if alone is None else round(1000 * alone, 3),
                "loss_share_of_step": None if alone is None else round(alone / wall, 5),
            }
        )
    machine = pretrained.machine()
    setting = {"image_size": args.image_size, "batch": f"{args.classes}x{args.per_class}", "steps": args.steps}
    with open(os.path.join(HERE, "step_cost.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps({**row, **setting, "turns": args.turns, "machine": machine}) + "\n")
    lines = [
        "| loss | images / s | step / softmax step, wall | CPU | loss + gradient alone | share of the step |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        alone = "" if row["loss_alone_ms"] is None else f"{row['loss_alone_ms']:.2f} ms"
        share = "" if row["loss_share_of_step"] is None else f"{100 * row['loss_share_of_step']:.2f} %"
        lines.append(
            f"| {row['loss']} | {row['images_per_s']:.1f} | {row['step_vs_softmax_wall']:.2f}x | "
            f"{row['step_vs_softmax_cpu']:.2f}x | {alone} | {share} |"
        )
    pretrained.write_markdown("step_cost.md", lines)


if __name__ == "__main__":
    main()
