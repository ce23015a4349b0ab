"""Cross-batch memory on glyphs: a small batch with XBM against the same batch without it and a large batch.

    python -m benchmarks.xbm.bench_xbm                                   # 2 losses x 3 set-ups x seeds 0-4 (~15 min)
    python -m benchmarks.xbm.bench_xbm --seeds 0 1 --losses contrastive
    python -m benchmarks.xbm.bench_xbm --summary-only                    # JSON summary, table and plot from the JSONL
    python -m benchmarks.xbm.bench_xbm --steps 900 --start-step 300 --out-dir benchmarks/xbm/900_steps  # longer runs

Protocol: that of `benchmarks/glyph_methods/benchmark_methods.py` (glyphs at 32 px, trained on the "train"
characters, Recall@1 and MAP@R on the unseen "test" characters, the small CNN 16-32-64-128 with a 64-d embedding, Adam
2e-3), the same number of steps for every set-up, class-balanced C x K batches drawn once per seed:

- `small`: 8 classes x 3 images (24 per step);
- `small_xbm96`, `small_xbm384`: the same batches, the loss wrapped in `CrossBatchMemory` with a memory of 96
  (4 batches) or 384 items (16 batches), used after a warm-up of `START_STEP` steps (the paper's warm-up);
- `large`: 32 x 3 (96 per step). 96^2 = 24 x 384: the large batch compares as many pairs per step as the small
  batch with the 384-item memory, but backpropagates through four times as many images.

The time a step takes with XBM is measured apart (`--timing`): one model per set-up on one fixed 8 x 3 batch,
`train_on_batch` in interleaved rounds (plain, memory 384, memory 3072, plain, ...) after a warm-up, so that
the load of the shared machine hits all alike; only the ratios to the plain step are reported. One JSON line
per loss, set-up and seed (or timing run) is appended to `<out-dir>/results.jsonl` (default `benchmarks/xbm/`);
lines already there are skipped unless `--rerun`. The summary (printed as JSON), `table.md` and `xbm.png` are
rebuilt from all lines.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.glyph_methods import benchmark_methods as bm  # noqa: E402

OUT_DIR = os.path.join(ROOT, "benchmarks", "xbm")
CONFIG = dict(bm.CONFIG, steps=300, samples_per_class=3)
START_STEP = 100
SETUPS = {
    "small": {"classes_per_batch": 8, "memory": None},
    "small_xbm96": {"classes_per_batch": 8, "memory": 96},
    "small_xbm384": {"classes_per_batch": 8, "memory": 384},
    "large": {"classes_per_batch": 32, "memory": None},
}
TIMING_MEMORIES = (384, 3072)
TIMING_ROUNDS, TIMING_STEPS = 12, 10
LOSSES = {
    "contrastive": ("ContrastiveLoss", {"pos_margin": 0.0, "neg_margin": 1.0}),
    "multi_similarity": ("MultiSimilarityLoss", {"alpha": 2.0, "beta": 50.0, "base": 0.5}),
}


def _compiled(loss_name, memory, seed, start_step=None):
    start_step = START_STEP if start_step is None else start_step
    import keras

    from tfdml import losses

    model = bm.tfdml_embedder(CONFIG, seed=seed)
    class_name, params = LOSSES[loss_name]
    loss = getattr(losses, class_name)(**params)
    if memory:
        loss = losses.CrossBatchMemory(
            loss, memory_size=memory, embedding_dim=CONFIG["embedding_dim"], start_step=start_step
        )
    model.compile(optimizer=keras.optimizers.Adam(CONFIG["learning_rate"]), loss=loss)
    return model


def run_one(loss_name, setup, data, seed):
    import tensorflow as tf

    spec = SETUPS[setup]
    batches = bm.index_batches(
        data["train_y"], spec["classes_per_batch"], CONFIG["samples_per_class"], CONFIG["steps"], seed
    )
    model = _compiled(loss_name, spec["memory"], seed)
    images, labels = tf.constant(data["train_x"]), tf.constant(data["train_y"])
    dataset = tf.data.Dataset.from_tensor_slices(batches).map(
        lambda idx: (tf.gather(images, idx), tf.gather(labels, idx))
    )
    start = time.process_time()
    model.fit(dataset.prefetch(2), epochs=1, steps_per_epoch=len(batches), verbose=0)
    train_cpu_seconds = time.process_time() - start
    return dict(bm.evaluate(bm.embed(model, data["test_x"]), data["test_y"]), train_cpu_seconds=train_cpu_seconds)


def run_timing(loss_name, data, seed=0):
    """Seconds per step (median over rounds) of the plain loss and of XBM at each `TIMING_MEMORIES` size, on
    one 8 x 3 batch, interleaved; the memories are past their warm-up and full. Then the loss call alone."""
    import tensorflow as tf

    batch = bm.index_batches(data["train_y"], 8, CONFIG["samples_per_class"], 1, seed)[0]
    x, y = data["train_x"][batch], data["train_y"][batch]
    models = {"plain": _compiled(loss_name, None, seed)}
    for memory in TIMING_MEMORIES:
        models[f"xbm{memory}"] = _compiled(loss_name, memory, seed, start_step=0)
    for name, model in models.items():  # trace, fill the memories
        for _ in range(1 + (int(name[3:]) // len(y) if name != "plain" else 0)):
            model.train_on_batch(x, y)
    seconds = {name: [] for name in models}
    for _ in range(TIMING_ROUNDS):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(TIMING_STEPS):
                model.train_on_batch(x, y)
            seconds[name].append((time.perf_counter() - start) / TIMING_STEPS)
    plain = np.asarray(seconds["plain"])
    ratios = {
        f"{name}_over_plain": float(np.median(np.asarray(s) / plain)) for name, s in seconds.items() if name != "plain"
    }
    # The loss alone (value and gradient on the batch's embeddings, traced), interleaved the same way: what
    # the memory adds, as a fraction of a whole plain training step (the whole-step ratios above are within
    # the noise of a shared machine).
    embeddings = tf.constant(np.asarray(models["plain"](x, training=False)))
    calls = {}
    for name, model in models.items():

        @tf.function
        def call(labels, features, loss=model.loss):
            with tf.GradientTape() as tape:
                tape.watch(features)
                value = loss(labels, features)
            return tape.gradient(value, features)

        call(tf.constant(y), embeddings)
        calls[name] = call
    loss_seconds = {name: [] for name in models}
    for _ in range(TIMING_ROUNDS):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(10 * TIMING_STEPS):
                call(tf.constant(y), embeddings)
            loss_seconds[name].append((time.perf_counter() - start) / (10 * TIMING_STEPS))
    step = float(np.median(plain))
    added = {
        f"{name}_loss_added_over_plain_step": float((np.median(s) - np.median(loss_seconds["plain"])) / step)
        for name, s in loss_seconds.items()
        if name != "plain"
    }
    return dict(ratios, **added, plain_loss_over_plain_step=float(np.median(loss_seconds["plain"]) / step))


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarise(lines):
    latest = {}
    for line in lines:  # the latest line of each (loss, setup, seed) counts
        latest[(line["loss"], line["setup"], line["seed"])] = line
    summary = {
        "start_step": START_STEP,
        "steps": CONFIG["steps"],
        "setups": {
            k: f"{v['classes_per_batch']} x {CONFIG['samples_per_class']}"
            + (f" + XBM({v['memory']})" if v["memory"] else "")
            for k, v in SETUPS.items()
        },
        "results": {},
    }
    for loss_name in LOSSES:
        per_loss = {}
        for setup in SETUPS:
            rows = [v for k, v in latest.items() if k[0] == loss_name and k[1] == setup]
            if not rows:
                continue
            per_loss[setup] = {
                metric: {
                    "mean": float(np.mean([r[metric] for r in rows])),
                    "std": float(np.std([r[metric] for r in rows])),
                    "n": len(rows),
                }
                for metric in ("recall@1", "map@r")
            }
        timing = latest.get((loss_name, "timing", 0))
        if timing:
            per_loss["loss_time_added_over_plain_step"] = {
                k.split("_")[0]: v for k, v in timing.items() if k.endswith("_loss_added_over_plain_step")
            }
            per_loss["step_time_over_plain"] = {
                k[: -len("_over_plain")]: v for k, v in timing.items() if k.endswith("_over_plain")
            }
        summary["results"][loss_name] = per_loss
    return summary


def markdown_table(summary):
    lines = [
        (
            f"Glyphs, 32 px, zero-shot retrieval (Recall@1, MAP@R in %, mean +- std over seeds), {summary['steps']} "
            f"Adam steps of class-balanced batches, small CNN 64-d. XBM warm-up: {summary['start_step']} steps."
        ),
        "",
        "| loss | set-up | Recall@1 | MAP@R | n |",
        "|---|---|---|---|---|",
    ]
    for loss_name, per_loss in summary["results"].items():
        for setup, label in summary["setups"].items():
            if setup in per_loss:
                r, m = per_loss[setup]["recall@1"], per_loss[setup]["map@r"]
                lines.append(
                    f"| {loss_name} | {label} | {100 * r['mean']:.1f} +- {100 * r['std']:.1f} | "
                    f"{100 * m['mean']:.1f} +- {100 * m['std']:.1f} | {r['n']} |"
                )
    lines.append("")
    for loss_name, per_loss in summary["results"].items():
        ratio = per_loss.get("step_time_over_plain")
        if ratio:
            lines.append(
                f"- {loss_name}, time of an 8 x 3 training step with XBM / without: "
                + ", ".join(f"memory {name[3:]}: {value:.2f}x" for name, value in ratio.items())
                + "."
            )
        added = per_loss.get("loss_time_added_over_plain_step")
        if added:
            lines.append(
                f"- {loss_name}, the loss call (value and gradient) with XBM takes longer than without by, "
                "as a fraction of a whole plain 8 x 3 training step: "
                + ", ".join(f"memory {name[3:]}: {100 * value:+.1f}%" for name, value in added.items())
                + "."
            )
    return "\n".join(lines) + "\n"


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses_ = [name for name, per_loss in summary["results"].items() if any(s in per_loss for s in SETUPS)]
    setups = list(summary["setups"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    width = 0.8 / len(setups)
    for ax, metric in zip(axes, ("recall@1", "map@r")):
        for i, setup in enumerate(setups):
            means = [
                100 * summary["results"][name].get(setup, {}).get(metric, {}).get("mean", np.nan) for name in losses_
            ]
            stds = [
                100 * summary["results"][name].get(setup, {}).get(metric, {}).get("std", np.nan) for name in losses_
            ]
            ax.bar(
                np.arange(len(losses_)) + i * width, means, width, yerr=stds, capsize=3, label=summary["setups"][setup]
            )
        ax.set_xticks(np.arange(len(losses_)) + width * (len(setups) - 1) / 2, losses_)
        ax.set_ylabel(f"{metric} (%)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Glyphs: small batch with and without cross-batch memory, large batch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    global START_STEP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--out-dir", default=OUT_DIR)
    parser.add_argument("--rerun", action="store_true")
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--timing", action="store_true", help="only the step-time ratios (seed 0)")
    parser.add_argument("--steps", type=int, default=CONFIG["steps"], help="training steps of every set-up")
    parser.add_argument("--start-step", type=int, default=START_STEP, help="XBM warm-up steps")
    args = parser.parse_args(argv)
    CONFIG["steps"], START_STEP = args.steps, args.start_step
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "results.jsonl")
    if not args.summary_only:
        done = {(line["loss"], line["setup"], line["seed"]) for line in read_lines(path)}
        data = bm.load_data(CONFIG)
        run = f"{os.getpid()}-{int(time.time())}"
        jobs = (
            [(loss_name, "timing", 0) for loss_name in args.losses]
            if args.timing
            else [(loss_name, setup, seed) for seed in args.seeds for loss_name in args.losses for setup in args.setups]
        )
        for loss_name, setup, seed in jobs:
            if (loss_name, setup, seed) in done and not args.rerun:
                continue
            result = run_timing(loss_name, data) if setup == "timing" else run_one(loss_name, setup, data, seed)
            line = dict(loss=loss_name, setup=setup, seed=seed, run=run, **result)
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
            print(json.dumps(line), file=sys.stderr, flush=True)
    summary = summarise(read_lines(path))
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(markdown_table(summary))
    if summary["results"]:
        plot(summary, os.path.join(args.out_dir, "xbm.png"))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
