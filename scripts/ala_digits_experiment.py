"""Triplet vs triplet + ALA and margin vs margin + ALA on sklearn digits, several seeds; prints JSON.

Protocol (zero-shot, like the paper's benchmarks): train on digits 0-4, embed digits 5-9 and report Recall@1
and MAP@R (`tfdml.retrieval.evaluate`). No confound: each pair of runs is built by
`tfdml.models.ala.ala_training` with the same seed, so both see the same episodes (training subset: 3
classes x 8 images; validation subset: the 2 other training classes x 5), the same capped tuples per step
(default cap 1024), the same sums over tuples, the same optimizer and the same number of steps; the
baseline (`weighting="uniform"`) gives every tuple weight 1 and never uses the validation subset, which for
ALA only trains the assessor (Algorithm 1, per-tuple recurrence, K = 3, assessor SGD 4e-4).

`--plot PATH` also writes the Fig. 4 panels of the last triplet + ALA run (`tfdml.plots.plot_ala_weights`,
one point per `--log-every` steps).

`--label-noise F` runs the extra experiment instead: a fraction F of the training images get a wrong label
(another training digit), triplet + ALA trains on episodes of those labels, and at the end the assessed
weights of the tuples that contain a corrupted image are compared with those of clean tuples (same episodes,
same step): does the assessor give the corrupted tuples lower weights?

Usage: nice -n 10 python scripts/ala_digits_experiment.py [--seeds 5] [--steps 200] [--plot ala_fig4.png]
       nice -n 10 python scripts/ala_digits_experiment.py --label-noise 0.2 [--seeds 2]
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfdml import data, plots, retrieval  # noqa: E402
from tfdml.models import Embedder  # noqa: E402
from tfdml.models.ala import ala_training  # noqa: E402

IMAGE_SIZE = 16


def embed(model, source):
    ds = data.eval_dataset(source, 256, image_size=IMAGE_SIZE)  # raw pixels: the embedder preprocesses
    return np.concatenate([model.predict_on_batch(images) for images, _ in ds]), source.labels


def run(kind, weighting, seed, args, train, test):
    keras.utils.set_random_seed(seed)
    embedder = Embedder("small_cnn", embedding_dim=32, input_shape=(IMAGE_SIZE, IMAGE_SIZE, 1))
    model, ds = ala_training(
        embedder,
        train,
        args.steps,
        base_loss=kind,
        weighting=weighting,
        optimizer=keras.optimizers.Adam(args.lr),
        image_size=IMAGE_SIZE,
        seed=seed,
        episode={"train_size": 24, "val_size": 10, "train_classes": 3, "val_classes": 2},
        state=args.state,
    )
    history = model.fit(ds, epochs=args.steps // args.log_every, steps_per_epoch=args.log_every, verbose=0).history
    embeddings, labels = embed(model, test)
    metrics = retrieval.evaluate(embeddings, labels, ks=(1,), metrics=("recall", "map@r"))
    return metrics["recall@1"], metrics["map@r"], history


def label_noise_run(fraction, seed, args, train):
    """Mean assessed weight of clean tuples and of tuples holding a corrupted image, over 20 late episodes."""
    rng = np.random.default_rng(seed)
    labels = train.labels.copy()
    corrupted = rng.random(labels.size) < fraction
    classes = np.unique(labels)
    for i in np.flatnonzero(corrupted):
        labels[i] = rng.choice(classes[classes != labels[i]])
    images = np.stack([np.asarray(train.load(i)) for i in range(len(train))])
    noisy = data.array_source(images, labels)
    keras.utils.set_random_seed(seed)
    embedder = Embedder("small_cnn", embedding_dim=32, input_shape=(IMAGE_SIZE, IMAGE_SIZE, 1))
    model, ds = ala_training(
        embedder,
        noisy,
        args.steps + 20,
        base_loss="triplet",
        optimizer=keras.optimizers.Adam(args.lr),
        image_size=IMAGE_SIZE,
        seed=seed,
        episode={"train_size": 24, "val_size": 10, "train_classes": 3, "val_classes": 2},
        state=args.state,
    )
    model.fit(ds.take(args.steps), verbose=0)
    # The same labels and seed draw the same items whatever the images are: a twin source whose "images" are
    # the item indices tells which items each episode holds.
    index_images = np.stack([np.arange(len(labels)) // 256, np.arange(len(labels)) % 256], 1).astype(np.uint8)
    raw = data.episode_dataset(
        data.array_source(index_images[:, None, :, None], labels),
        train_size=24,
        val_size=10,
        train_classes=3,
        val_classes=2,
        seed=seed,
        preprocess=lambda x: x,
    )
    clean_w, bad_w = [], []
    for episode, raw_episode in zip(ds.skip(args.steps), raw.skip(args.steps)):
        train_x, train_y = episode[0], episode[1]
        pixels = np.rint(raw_episode[0].numpy()[:, 0, :, 0]).astype(int)
        flags = corrupted[pixels[:, 0] * 256 + pixels[:, 1]]
        tuples, weights = (t.numpy() for t in model.tuple_weights(train_x, train_y))
        bad = flags[tuples].any(axis=1)
        clean_w.extend(weights[~bad].tolist())
        bad_w.extend(weights[bad].tolist())
    return {
        "corrupted_fraction_of_images": round(float(corrupted.mean()), 3),
        "corrupted_fraction_of_tuples": round(len(bad_w) / max(1, len(bad_w) + len(clean_w)), 3),
        "mean_weight_clean": round(float(np.mean(clean_w)), 6),
        "mean_weight_corrupted": round(float(np.mean(bad_w)), 6),
        "std_weight_all": round(float(np.std(clean_w + bad_w)), 6),
    }


def summary(values):
    return {
        "mean": round(statistics.mean(values), 4),
        "std": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
        "per_seed": [round(v, 4) for v in values],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--state", default="per_tuple")
    parser.add_argument("--losses", default="triplet,margin")
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--label-noise", type=float, default=None)
    args = parser.parse_args()
    train, test = data.digits("train"), data.digits("test")
    if args.label_noise is not None:
        start = time.process_time()
        runs = [label_noise_run(args.label_noise, seed, args, train) for seed in range(args.seeds)]
        print(
            json.dumps(
                {
                    "experiment": "label noise: assessed weights of corrupted vs clean tuples",
                    "config": vars(args),
                    "runs": runs,
                    "cpu_seconds": round(time.process_time() - start, 1),
                },
                indent=2,
            )
        )
        return
    results = {
        "experiment": "digits zero-shot (train 0-4, test 5-9), Recall@1 and MAP@R",
        "config": vars(args),
        "runs": {},
    }
    start, cpu = time.time(), time.process_time()
    for kind in args.losses.split(","):
        scores = {"uniform": ([], []), "assessor": ([], [])}
        weight_logs = []
        for seed in range(args.seeds):
            for weighting in ("uniform", "assessor"):
                recall, map_r, history = run(kind, weighting, seed, args, train, test)
                scores[weighting][0].append(recall)
                scores[weighting][1].append(map_r)
                if weighting == "assessor":
                    weight_logs.append(history)
        base, ala = scores["uniform"], scores["assessor"]
        results["runs"][kind] = {
            "plain": {"recall@1": summary(base[0]), "map@r": summary(base[1])},
            "ala": {"recall@1": summary(ala[0]), "map@r": summary(ala[1])},
            "ala_minus_plain": {
                "recall@1": summary([a - p for a, p in zip(ala[0], base[0])]),
                "map@r": summary([a - p for a, p in zip(ala[1], base[1])]),
            },
            "ala_last_logged": {
                key: round(statistics.mean(h[key][-1] for h in weight_logs), 6)
                for key in ("weight_mean", "weight_variance", "hardness_ratio")
            },
        }
        if args.plot and kind == "triplet":
            plots.plot_ala_weights(weight_logs[-1], args.plot, title=f"triplet + ALA on digits (seed {args.seeds - 1})")
    results["seconds"] = round(time.time() - start, 1)
    results["cpu_seconds"] = round(time.process_time() - cpu, 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
