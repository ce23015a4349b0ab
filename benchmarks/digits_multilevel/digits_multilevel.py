"""Digits zero-shot experiment: single-level vs multi-level RLL vs a softmax-trained embedding.

Trains a small-CNN embedder on digits 0-4 (class-balanced 5 x 12 batches, 32x32) with the same budget for
every variant and reports Recall@1 / MAP@R on the unseen digits 5-9 (exact search, each test image a query
against all others). Prints one JSON object.

  python -m benchmarks.digits_multilevel.digits_multilevel [--epochs 8] [--steps 30] [--seeds 0 1 2] [--dim 32]

Variants: `single` = RLL-H (Embedder, one head); `multi` = RLL-(L,M,H) (concatenated embedding; the
per-level RLL-L/M/H results of the same model are reported too); `softmax` = Embedder with a classifier head
trained with plain cross-entropy (`ClassificationPretraining` for every epoch), its embedding evaluated.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfdml.callbacks import ClassificationPretraining  # noqa: E402
from tfdml.data import class_balanced_dataset, digits, eval_dataset  # noqa: E402
from tfdml.losses import GroupLoss, RankedListLoss  # noqa: E402
from tfdml.models import Embedder, MultiLevelEmbedder  # noqa: E402
from tfdml.retrieval import evaluate  # noqa: E402


def _embed(model, dataset):
    embeddings, labels = [], []
    for images, batch_labels in dataset:
        embeddings.append(model(images, training=False).numpy())
        labels.append(batch_labels.numpy())
    return np.concatenate(embeddings), np.concatenate(labels)


def _metrics(embeddings, labels):
    result = evaluate(embeddings, labels, ks=(1,), metrics=("recall", "map@r"))
    return {"recall@1": round(result["recall@1"], 4), "map@r": round(result["map@r"], 4)}


def run(variant, seed, args):
    keras.utils.set_random_seed(seed)
    shape = (args.image_size, args.image_size, 1)
    heads = dict(head_filters=args.head_filters, head_units=args.head_units)
    callbacks = []
    if variant == "multi":
        model = MultiLevelEmbedder("small_cnn", embedding_dim=args.dim, input_shape=shape, **heads)
        loss = RankedListLoss()
    elif variant == "single":
        model = Embedder("small_cnn", embedding_dim=args.dim, input_shape=shape)
        loss = RankedListLoss()
    else:
        model = Embedder("small_cnn", embedding_dim=args.dim, input_shape=shape, num_classes=5)
        loss = GroupLoss(num_classes=5)  # never used: cross-entropy for every epoch
        callbacks.append(ClassificationPretraining(epochs=args.epochs))
    model.compile(keras.optimizers.Adam(args.lr), loss=loss)
    train = class_balanced_dataset(digits("train"), 5, 12, image_size=args.image_size, seed=seed)
    start = time.time()
    model.fit(train, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0, callbacks=callbacks)
    seconds = time.time() - start
    embeddings, labels = _embed(model, eval_dataset(digits("test"), 256, image_size=args.image_size))
    result = {"all": _metrics(embeddings, labels), "train_seconds": round(seconds, 1), "params": model.count_params()}
    if variant == "multi":
        for level, level_embeddings in model.split_levels(embeddings).items():
            result[level] = _metrics(level_embeddings.numpy(), labels)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--head-filters", type=int, default=128)
    parser.add_argument("--head-units", type=int, default=1024)
    parser.add_argument("--variants", nargs="+", default=["single", "multi", "softmax"])
    args = parser.parse_args()
    report = {"setup": vars(args), "runs": {}}
    for variant in args.variants:
        runs = [run(variant, seed, args) for seed in args.seeds]
        summary = {
            "recall@1_per_seed": [r["all"]["recall@1"] for r in runs],
            "recall@1_mean": round(float(np.mean([r["all"]["recall@1"] for r in runs])), 4),
            "map@r_mean": round(float(np.mean([r["all"]["map@r"] for r in runs])), 4),
            "train_seconds_mean": round(float(np.mean([r["train_seconds"] for r in runs])), 1),
            "params": runs[0]["params"],
        }
        if variant == "multi":
            for level in "LMH":
                summary[f"{level}_recall@1_mean"] = round(float(np.mean([r[level]["recall@1"] for r in runs])), 4)
        report["runs"][variant] = summary
        print(json.dumps({variant: summary}), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
