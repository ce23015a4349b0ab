"""Recall@1 on unseen classes: triplet vs triplet + ALA and margin vs margin + ALA on sklearn digits; JSON.

Protocol (zero-shot, like the paper's benchmarks): train on digits 0-4, embed digits 5-9 and report
Recall@1 (nearest neighbour, the query excluded). Equal budgets: for each seed both methods see exactly the
same episodes (training subset: 3 classes x 20 images; validation subset: the 2 other training classes x 10),
the same number of metric updates with the same optimizer, and the same capped set of training tuples per
step. The baseline minimises the plain mean of the per-tuple losses on the training subset (it never uses
the validation subset, which for ALA only trains the assessor); ALA weights the same tuples with the
meta-trained assessor (Algorithm 1).

Usage: python scripts/ala_digits_experiment.py [--seeds 5] [--steps 200]
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
from sklearn.datasets import load_digits  # noqa: E402

from tfdml.models import ALAModel  # noqa: E402
from tfdml.ops.tuples import margin_tuple_losses, triplet_indices, triplet_tuple_losses  # noqa: E402

TRAIN_CLASSES, TEST_CLASSES = range(0, 5), range(5, 10)


def load():
    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int32")
    train = np.isin(y, TRAIN_CLASSES)
    return (x[train], y[train]), (x[~train], y[~train])


def episodes(x, y, steps, seed, train_classes=3, train_per_class=20, val_per_class=10):
    rng = np.random.default_rng(seed)
    by_class = {c: np.flatnonzero(y == c) for c in np.unique(y)}
    out = []
    for _ in range(steps):
        classes = rng.permutation(list(by_class))
        pick = lambda cs, k: np.concatenate([rng.choice(by_class[c], k, replace=False) for c in cs])  # noqa
        tr, va = pick(classes[:train_classes], train_per_class), pick(classes[train_classes:], val_per_class)
        out.append((x[tr], y[tr], x[va], y[va]))
    return tf.data.Dataset.from_tensor_slices(tuple(np.stack(parts) for parts in zip(*out)))


def embedder(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                             keras.layers.Dense(32), keras.layers.UnitNormalization()])


def recall_at_1(embeddings, labels):
    sims = embeddings @ embeddings.T
    np.fill_diagonal(sims, -np.inf)
    return float(np.mean(labels[np.argmax(sims, axis=1)] == labels))


def train_plain(kind, data, seed, lr, max_tuples):
    model = embedder(seed)
    optimizer = keras.optimizers.Adam(lr)
    per_tuple = triplet_tuple_losses if kind == "triplet" else margin_tuple_losses

    @tf.function
    def step(train_x, train_y, val_x, val_y, iteration):
        # Same tuples as ALAModel: same cap, same (seed, iteration) stream.
        tuples = triplet_indices(train_y, max_tuples, tf.stack([tf.constant(seed, tf.int64), iteration]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_tuple(model(train_x, training=True), tuples))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    for iteration, episode in enumerate(data):
        step(*episode, tf.constant(iteration, tf.int64))
    return model


def train_ala(kind, data, seed, lr, max_tuples, inner_lr, assessor_lr, assessor_steps):
    model = ALAModel(embedder(seed), base_loss=kind, inner_learning_rate=inner_lr, assessor_steps=assessor_steps,
                     max_tuples=max_tuples, seed=seed)
    model.compile(optimizer=keras.optimizers.Adam(lr), assessor_optimizer=keras.optimizers.Adam(assessor_lr))
    history = model.fit(data, epochs=1, verbose=0).history
    return model.embedder, history


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--inner-lr", type=float, default=0.5)
    parser.add_argument("--assessor-lr", type=float, default=1e-2)
    parser.add_argument("--assessor-steps", type=int, default=3)
    parser.add_argument("--max-tuples", type=int, default=1024)
    parser.add_argument("--losses", default="triplet,margin")
    args = parser.parse_args()
    (train_x, train_y), (test_x, test_y) = load()
    results = {"experiment": "digits zero-shot Recall@1 (train 0-4, test 5-9)", "config": vars(args), "runs": {}}
    start = time.time()
    for kind in args.losses.split(","):
        plain, ala, weight_stats = [], [], []
        for seed in range(args.seeds):
            data = episodes(train_x, train_y, args.steps, seed)
            base = train_plain(kind, data, seed, args.lr, args.max_tuples)
            plain.append(recall_at_1(base.predict(test_x, verbose=0), test_y))
            model, history = train_ala(kind, data, seed, args.lr, args.max_tuples, args.inner_lr,
                                       args.assessor_lr, args.assessor_steps)
            ala.append(recall_at_1(model.predict(test_x, verbose=0), test_y))
            weight_stats.append((history["weight_mean"][-1], history["weight_variance"][-1]))
        summary = lambda v: {"mean": round(statistics.mean(v), 4), "std": round(statistics.stdev(v), 4)  # noqa
                             if len(v) > 1 else 0.0, "per_seed": [round(r, 4) for r in v]}
        results["runs"][kind] = {
            "plain": summary(plain), "ala": summary(ala),
            "ala_minus_plain": summary([a - p for a, p in zip(ala, plain)]),
            "ala_epoch_mean_weight_mean": round(statistics.mean(w for w, _ in weight_stats), 4),
            "ala_epoch_mean_weight_variance": float(statistics.mean(v for _, v in weight_stats)),
        }
    results["seconds"] = round(time.time() - start, 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
