"""DML-ALA under label noise: does the assessor learn which tuples matter? Appends JSON lines, prints a summary.

    nice python -m benchmarks.label_noise.assessor_weights                     # digits, defaults, 5 seeds, ALA + twin
    nice python -m benchmarks.label_noise.assessor_weights --dataset glyphs  # retrieval on glyphs (the method table's
                                                                      # protocol, noisy training labels)
    nice python -m benchmarks.label_noise.assessor_weights --tag paper --ala '{"variant": "paper"}'
    nice python -m benchmarks.label_noise.assessor_weights --summary             # only the summary of the JSONL

Protocol. A fraction `--noise` (default 30 %) of the training images, chosen at random per seed,
get another training class's label. Digits: train on digits 0-4 with those labels (episodes of 3 classes x 8
images and a validation subset of the 2 other classes x 5, `tfdml.models.ala.ala_training`), small CNN
(32-d, 16 px), `--steps` (300) steps of Adam(`--lr`, 1e-3), `ALAModel` at the library defaults unless
`--ala` overrides arguments; retrieval (Recall@1, MAP@R) on digits 5-9. Glyphs: the glyph method table's
protocol (`benchmarks/glyph_methods/benchmark_methods.py`: 32 px, small CNN 16-32-64-128, Adam 2e-3, 300 steps of 22 x 3
batches split into training and validation halves) with noisy training labels; retrieval on the unseen half.

Each seed trains ALA and its uniform-weight twin (`weighting="uniform"`: the same episodes, tuples and
sums, every weight 1). For ALA on digits it also records the logged `weight_mean` (the assessor's mean
output) of the first and the last step, and reads the weights of 20 fresh training subsets drawn from the
noisy training set with `ALAModel.tuple_weights`: a tuple is corrupted when its anchor or its positive
carries a wrong label (the pair that the loss pulls together is not a true pair). The AUC of clean over
corrupted weights (probability that a clean tuple outweighs a corrupted one of the same subset, ties 1/2)
is computed per subset and averaged, over all tuples (`auc_clean_over_corrupted`) and over the active ones
only (`auc_active_tuples`: loss > 0, the only tuples whose weight changes the step; `active_tuple_fraction`).

One JSON line per (dataset, base loss, tag, seed, weighting) in `--out` (default
`benchmarks/label_noise/results_assessor_weights.jsonl`); existing lines are skipped (resumable), `--rerun`
repeats them.
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfdml import data, retrieval  # noqa: E402
from tfdml.models import Embedder  # noqa: E402
from tfdml.models.ala import ala_training  # noqa: E402

IMAGE_SIZE = 16
EPISODE = {"train_size": 24, "val_size": 10, "train_classes": 3, "val_classes": 2}
OUT = os.path.join(ROOT, "benchmarks", "label_noise", "results_assessor_weights.jsonl")


def auc(clean, corrupted):
    """P(clean weight > corrupted weight), ties counted 1/2 (Mann-Whitney U / (n m))."""
    clean, corrupted = np.asarray(clean, float), np.asarray(corrupted, float)
    if clean.size == 0 or corrupted.size == 0:
        return None
    values = np.concatenate([clean, corrupted])
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(values.size)
    ranks[order] = np.arange(1, values.size + 1)
    for value in np.unique(values):  # average ranks of ties
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    u = ranks[: clean.size].sum() - clean.size * (clean.size + 1) / 2
    return float(u / (clean.size * corrupted.size))


def subset_weights(model, images, labels, corrupted, subsets, seed):
    """Per fresh training subset (3 noisy classes x 8 images): AUC of clean over corrupted tuple weights."""
    rng = np.random.default_rng(10_000 + seed)
    by_class = {c: np.flatnonzero(labels == c) for c in np.unique(labels)}
    aucs, active_aucs, clean_w, bad_w, fractions, active_fractions = [], [], [], [], [], []
    for k in range(subsets):
        classes = rng.choice(sorted(by_class), EPISODE["train_classes"], replace=False)
        per_class = EPISODE["train_size"] // EPISODE["train_classes"]
        items = np.concatenate([rng.choice(by_class[c], per_class, replace=False) for c in classes])
        tuples, weights = model.tuple_weights(images[items], labels[items].astype(np.int32), seed=k)
        embedder = model.embedder  # training mode without updating its statistics, as tuple_weights does
        embeddings, _ = embedder.stateless_call(
            [v.value for v in embedder.trainable_variables],
            [v.value for v in embedder.non_trainable_variables],
            tf.convert_to_tensor(images[items]),
            training=True,
        )
        losses = model._tuple_losses(embeddings, tuples, None).numpy()
        tuples, weights = tuples.numpy(), weights.numpy()
        bad = corrupted[items][tuples[:, 0]] | corrupted[items][tuples[:, 1]]
        value = auc(weights[~bad], weights[bad])
        if value is not None:
            aucs.append(value)
        # Only tuples with a loss move the embedder: how the weights order clean and corrupted ones there.
        active = losses > 0
        value = auc(weights[active & ~bad], weights[active & bad])
        if value is not None:
            active_aucs.append(value)
        active_fractions.append(float(active.mean()))
        clean_w.extend(weights[~bad].tolist())
        bad_w.extend(weights[bad].tolist())
        fractions.append(float(bad.mean()))
    return {
        "auc_clean_over_corrupted": round(float(np.mean(aucs)), 4),
        "auc_subsets": len(aucs),
        "auc_per_subset_std": round(float(np.std(aucs)), 4),
        "auc_active_tuples": round(float(np.mean(active_aucs)), 4) if active_aucs else None,
        "active_tuple_fraction": round(float(np.mean(active_fractions)), 3),
        "mean_weight_clean": round(float(np.mean(clean_w)), 5),
        "mean_weight_corrupted": round(float(np.mean(bad_w)), 5),
        "weight_std": round(float(np.std(clean_w + bad_w)), 5),
        "corrupted_tuple_fraction": round(float(np.mean(fractions)), 3),
    }


def digits_run(args, seed, weighting, overrides):
    train, test = data.digits("train"), data.digits("test")
    noisy_labels, corrupted = data.symmetric_label_noise(train.labels, args.noise, seed)
    images = np.stack([np.asarray(train.load(i)) for i in range(len(train))])
    noisy = data.array_source(images, noisy_labels)
    keras.utils.set_random_seed(seed)
    embedder = Embedder("small_cnn", embedding_dim=32, input_shape=(IMAGE_SIZE, IMAGE_SIZE, 1))
    model, ds = ala_training(
        embedder,
        noisy,
        args.steps,
        base_loss=args.base_loss,
        weighting=weighting,
        optimizer=keras.optimizers.Adam(args.lr),
        image_size=IMAGE_SIZE,
        seed=seed,
        episode=EPISODE,
        **overrides,
    )
    history = model.fit(ds, epochs=args.steps, steps_per_epoch=1, verbose=0).history
    record = {"first_weight_mean": history["weight_mean"][0], "last_weight_mean": history["weight_mean"][-1]}
    if weighting == "assessor":
        record["last_meta_loss"] = history["meta_loss"][-1]
        if "hardness_ratio" in history:
            record["last_hardness_ratio"] = history["hardness_ratio"][-1]
        preprocessed = np.concatenate(
            [
                x.numpy()
                for x, _ in data.eval_dataset(
                    noisy, 256, image_size=IMAGE_SIZE, center_crop=False, preprocess=embedder.preprocess
                )
            ]
        )
        record.update(subset_weights(model, preprocessed, noisy_labels, corrupted, args.subsets, seed))
    test_x = np.concatenate(
        [
            x.numpy()
            for x, _ in data.eval_dataset(
                test, 256, image_size=IMAGE_SIZE, center_crop=False, preprocess=embedder.preprocess
            )
        ]
    )
    embeddings = embedder.predict(test_x, verbose=0)
    metrics = retrieval.evaluate(embeddings, test.labels, ks=(1,), metrics=("recall", "map@r"))
    record.update({"recall@1": float(metrics["recall@1"]), "map@r": float(metrics["map@r"])})
    return record


def glyphs_run(args, seed, weighting, overrides):
    from benchmarks.glyph_methods import benchmark_methods as bm

    config = dict(bm.CONFIG, steps=args.steps)
    arrays = bm.load_data(config)
    noisy_labels, _ = data.symmetric_label_noise(arrays["train_y"], args.noise, seed)
    arrays = dict(arrays, train_y=noisy_labels.astype(np.int64))
    batches = bm.index_batches(
        arrays["train_y"], config["classes_per_batch"], config["samples_per_class"], config["steps"], seed
    )
    margins = {"triplet": {"margin": 0.2}, "margin": {"alpha": 0.2, "beta": 1.2}}[args.base_loss]
    spec = {
        "ala": args.base_loss,
        "ala_params": {"loss_params": margins, "max_tuples": 2000, "weighting": weighting, **overrides},
    }
    embeddings, _ = bm.train_tfdml(spec, arrays, batches, config, seed)
    return bm.evaluate(embeddings, arrays["test_y"])


def read(path):
    from benchmarks.glyph_methods import benchmark_methods as bm

    return bm.latest_records(path, lambda record: record["key"])


def paired(records, dataset, base_loss, tag, noise, steps, metric):
    """Mean and standard error of ALA - uniform twin over the seeds that have both."""

    def pick(weighting, r):
        return (r["dataset"], r["base_loss"], r["tag"], r["weighting"], r["noise"], r["steps"]) == (
            dataset,
            base_loss,
            tag,
            weighting,
            noise,
            steps,
        )

    ala = {r["seed"]: r[metric] for r in records.values() if pick("assessor", r)}
    twin = {r["seed"]: r[metric] for r in records.values() if pick("uniform", r)}
    seeds = sorted(set(ala) & set(twin))
    if not seeds:
        return None
    diffs = [ala[s] - twin[s] for s in seeds]
    se = statistics.stdev(diffs) / np.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {
        "n": len(seeds),
        "ala_mean": round(statistics.mean(ala[s] for s in seeds), 4),
        "twin_mean": round(statistics.mean(twin[s] for s in seeds), 4),
        "diff_mean": round(statistics.mean(diffs), 4),
        "diff_se": round(float(se), 4),
        "diff_per_seed": [round(d, 4) for d in diffs],
    }


def summary(records):
    out = []
    groups = sorted({(r["dataset"], r["base_loss"], r["tag"], r["noise"], r["steps"]) for r in records.values()})
    for dataset, base_loss, tag, noise, steps in groups:
        mine = [
            r
            for r in records.values()
            if (r["dataset"], r["base_loss"], r["tag"], r["noise"], r["steps"])
            == (dataset, base_loss, tag, noise, steps)
            and r["weighting"] == "assessor"
        ]
        row = {
            "dataset": dataset,
            "base_loss": base_loss,
            "tag": tag,
            "noise": noise,
            "steps": steps,
            "recall@1": paired(records, dataset, base_loss, tag, noise, steps, "recall@1"),
            "map@r": paired(records, dataset, base_loss, tag, noise, steps, "map@r"),
        }
        if mine and "auc_clean_over_corrupted" in mine[0]:
            row["auc_clean_over_corrupted"] = {
                "mean": round(statistics.mean(r["auc_clean_over_corrupted"] for r in mine), 4),
                "per_seed": [r["auc_clean_over_corrupted"] for r in sorted(mine, key=lambda r: r["seed"])],
            }
            active = [
                r["auc_active_tuples"]
                for r in sorted(mine, key=lambda r: r["seed"])
                if r.get("auc_active_tuples") is not None
            ]
            if active:
                row["auc_active_tuples"] = {"mean": round(statistics.mean(active), 4), "per_seed": active}
            row["last_over_first_weight_mean"] = [
                round(r["last_weight_mean"] / r["first_weight_mean"], 3) for r in sorted(mine, key=lambda r: r["seed"])
            ]
        out.append(row)
    return out


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--dataset", choices=("digits", "glyphs"), default="digits")
    parser.add_argument("--base-loss", default="triplet", choices=("triplet", "margin"))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam rate (digits; glyphs use the table's)")
    parser.add_argument("--noise", type=float, default=0.3)
    parser.add_argument("--subsets", type=int, default=20)
    parser.add_argument("--ala", default="{}", help="JSON object of ALAModel arguments (default: library defaults)")
    parser.add_argument("--tag", default="defaults", help="name of this ALA configuration in the results")
    parser.add_argument("--weightings", nargs="+", default=["assessor", "uniform"])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--rerun", action="store_true")
    parser.add_argument("--summary", action="store_true", help="only print the summary of --out")
    args = parser.parse_args()
    overrides = json.loads(args.ala)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if not args.summary:
        done = read(args.out)
        for seed in args.seeds:
            for weighting in args.weightings:
                # The uniform twin does not depend on the ALA configuration: one per seed, shared by the tags.
                tag = args.tag if weighting == "assessor" else "uniform"
                key = f"{args.dataset}/{args.base_loss}/{tag}/{args.noise}/{args.steps}/{seed}/{weighting}"
                if key in done and not args.rerun:
                    continue
                start, cpu = time.time(), time.process_time()
                run = digits_run if args.dataset == "digits" else glyphs_run
                record = run(args, seed, weighting, overrides if weighting == "assessor" else {})
                record.update(
                    key=key,
                    dataset=args.dataset,
                    base_loss=args.base_loss,
                    tag=tag,
                    seed=seed,
                    weighting=weighting,
                    noise=args.noise,
                    steps=args.steps,
                    lr=args.lr,
                    ala=overrides if weighting == "assessor" else {},
                    wall_s=round(time.time() - start, 1),
                    cpu_s=round(time.process_time() - cpu, 1),
                )
                with open(args.out, "a") as f:
                    f.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
    records = read(args.out)
    print(json.dumps(_with_twins(records, summary(records)), indent=1))


def _with_twins(records, rows):
    """Summary rows of the ALA tags, each paired with the shared uniform twin of the same seeds."""
    out = []
    for row in rows:
        if row["tag"] == "uniform":
            continue
        merged = {
            k: dict(r, tag=row["tag"]) if r["tag"] == "uniform" else r
            for k, r in records.items()
            if (r["dataset"], r["base_loss"], r["noise"], r["steps"])
            == (row["dataset"], row["base_loss"], row["noise"], row["steps"])
            and r["tag"] in (row["tag"], "uniform")
        }
        for metric in ("recall@1", "map@r"):
            row[metric] = paired(
                merged, row["dataset"], row["base_loss"], row["tag"], row["noise"], row["steps"], metric
            )
        out.append(row)
    return out


if __name__ == "__main__":
    main()
