"""Time of one DML-ALA step vs one plain step with the same embedder and training batch; prints JSON.

Wall time (median and min over repeats) and process CPU time (median) per step: on a shared machine the
CPU time is the steadier figure.

Episode as in the paper: a training subset of 100 images (20 classes x 5) and a validation subset of 20
(4 classes x 5). Two embedders (64-d, L2-normalised): "small" (2 convs on 32x32x3, where the per-tuple
assessor dominates) and "wide" (4 wider convs on 64x64x3, where the embedder passes dominate, closer to a
real backbone). The plain step is
`TripletLoss(margin=0.2, mining="all")` on the training subset with the same optimizer. ALA steps are
timed at the library's defaults (no switch set) and at the defaults with the virtual step on the embedder's head
only (`lookahead_variables="head"`; `--only-defaults` times these two rows alone), and with the paper's
K = 3 assessor updates and with K = 1 (the base loss is the plain step's, every
triplet of the batch: with uniform weights ALA's real step is the plain step), with the paper's per-tuple
recurrence (`state="per_tuple"`) and the per-step approximation, and with
`weighting="uniform"` (the base loss through its listed terms, no assessor), and at
K = 3 with the assessor updated every N = 1, 2, 5 steps (`meta_interval`; the steps between reuse it). The
difference between per_tuple and per_step rows is the cost of the recurrence over the tuples. ALA runs at
the library defaults (`variant="default"`) unless a row says `variant`.

With `meta_interval` N > 1 only every N-th step is a meta step: the per-step figures to read are the means
(`step_ms_mean`, `ratio_to_plain_mean`, `cpu_ms_mean`, `ratio_to_plain_cpu_mean`) over `--repeats` steps, a
multiple of 10 so that every N divides it.
There is no other public DML-ALA implementation to compare against (peer figure: null).

Usage: python -m benchmarks.ala_step.bench_ala [--repeats 20] [--only-defaults | --only-meta-interval]
       [--embedders small,wide]
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdml.losses.triplet import TripletLoss  # noqa: E402
from tfdml.models import ALAModel  # noqa: E402

TARGET_RATIO = 2.5


EMBEDDERS = {"small": (32, (16, 32)), "wide": (64, (32, 64, 128, 128))}  # image size, conv filters


def make_embedder(kind, seed=0):
    keras.utils.set_random_seed(seed)
    size, filters = EMBEDDERS[kind]
    convs = [
        keras.layers.Conv2D(f, 3, strides=2 if i < 2 else 1, padding="same", activation="relu")
        for i, f in enumerate(filters)
    ]
    return keras.Sequential(
        [
            keras.Input((size, size, 3)),
            *convs,
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(64),
            keras.layers.UnitNormalization(),
        ]
    )


def make_episode(kind, seed=0):
    rng = np.random.default_rng(seed)
    size = EMBEDDERS[kind][0]
    train_y = np.repeat(np.arange(20), 5).astype("int32")
    val_y = np.repeat(np.arange(20, 24), 5).astype("int32")
    return (
        tf.constant(rng.normal(size=(100, size, size, 3)).astype("float32")),
        tf.constant(train_y),
        tf.constant(rng.normal(size=(20, size, size, 3)).astype("float32")),
        tf.constant(val_y),
    )


def time_step(step, episode, repeats):
    """`(median wall, min wall, median CPU, mean wall, mean CPU)` seconds per step."""
    for _ in range(3):  # trace and warm up
        step(episode)
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        out = step(episode)
        tf.nest.map_structure(lambda t: t.numpy(), out)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return (
        statistics.median(walls),
        min(walls),
        statistics.median(cpus),
        statistics.mean(walls),
        statistics.mean(cpus),
    )


def plain_step_fn(kind):
    embedder = make_embedder(kind)
    optimizer = keras.optimizers.SGD(1e-3)
    loss_fn = TripletLoss(margin=0.2, mining="all")

    @tf.function
    def step(episode):
        train_x, train_y = episode[0], episode[1]
        with tf.GradientTape() as tape:
            loss = loss_fn(train_y, embedder(train_x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, embedder.trainable_variables), embedder.trainable_variables))
        return loss

    return step


def ala_step_fn(kind, **switches):
    """The ALA step with `switches` (`tfdml.ala_options.ALAOptions`; none given: the library's defaults)."""
    # The plain step's loss: with uniform weights ALA's real step is that loss's step.
    model = ALAModel(make_embedder(kind), base_loss=TripletLoss(margin=0.2, mining="all"), **switches)
    model.compile(optimizer=keras.optimizers.SGD(1e-3))
    return tf.function(model.train_step)


def row(seconds, plain, **settings):
    median, minimum, cpu, mean, cpu_mean = seconds
    return {
        **settings,
        "step_ms_median": round(median * 1e3, 2),
        "step_ms_min": round(minimum * 1e3, 2),
        "cpu_ms_median": round(cpu * 1e3, 2),
        "ratio_to_plain_median": round(median / plain[0], 2),
        "ratio_to_plain_min": round(minimum / plain[1], 2),
        "ratio_to_plain_cpu": round(cpu / plain[2], 2),
        "step_ms_mean": round(mean * 1e3, 2),
        "cpu_ms_mean": round(cpu_mean * 1e3, 2),
        "ratio_to_plain_mean": round(mean / plain[3], 2),
        "ratio_to_plain_cpu_mean": round(cpu_mean / plain[4], 2),
        "within_target": min(mean / plain[3], minimum / plain[1]) <= TARGET_RATIO,
    }


def settings(only_defaults=False, only_meta_interval=False):
    """The ALA rows to time, as `ALAModel` switches (`{}`: the library's defaults)."""
    rows = [{}, dict(lookahead_variables="head")]
    if only_defaults:
        return rows
    rows += [dict(state="per_tuple", assessor_steps=3, meta_interval=n) for n in (1, 2, 5)]
    if only_meta_interval:
        return rows[2:]
    rows += [
        dict(state="per_tuple", assessor_steps=3, variant="paper"),
        dict(state="per_step", assessor_steps=0, weighting="uniform"),
        dict(state="per_tuple", assessor_steps=1),
        dict(state="per_step", assessor_steps=3),
        dict(state="per_step", assessor_steps=1),
    ]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--embedders", default=",".join(EMBEDDERS))
    parser.add_argument(
        "--only-meta-interval",
        action="store_true",
        help="only the plain step and the K = 3 rows at meta_interval 1, 2, 5 (per_tuple)",
    )
    parser.add_argument(
        "--only-defaults",
        action="store_true",
        help="only the plain step and the library defaults, exact and with the head-only look-ahead",
    )
    args = parser.parse_args()
    if args.repeats % 10:
        parser.error("--repeats must be a multiple of 10 (every meta_interval divides it)")
    results = {
        "benchmark": "dml_ala_step_vs_plain_step",
        "device": "CPU",
        "cpu_threads": os.cpu_count(),
        "episode": {"train": 100, "val": 20, "embedding": 64, "train_triplets": 100 * 4 * 95},
        "peer": None,
        "target_ratio": TARGET_RATIO,
        "embedders": {},
    }
    for kind in args.embedders.split(","):
        episode = make_episode(kind)
        plain = time_step(plain_step_fn(kind), episode, args.repeats)
        rows = []
        for switches in settings(args.only_defaults, args.only_meta_interval):
            seconds = time_step(ala_step_fn(kind, **switches), episode, args.repeats)
            rows.append(row(seconds, plain, **(switches or {"defaults": True})))
        results["embedders"][kind] = {
            "image_size": EMBEDDERS[kind][0],
            "filters": EMBEDDERS[kind][1],
            "plain_triplet_step_ms_median": round(plain[0] * 1e3, 2),
            "plain_triplet_step_ms_min": round(plain[1] * 1e3, 2),
            "plain_triplet_cpu_ms_median": round(plain[2] * 1e3, 2),
            "plain_triplet_step_ms_mean": round(plain[3] * 1e3, 2),
            "plain_triplet_cpu_ms_mean": round(plain[4] * 1e3, 2),
            "ala": rows,
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
