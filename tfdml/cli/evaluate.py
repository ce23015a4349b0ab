"""`tfdml evaluate`: retrieval metrics of embeddings, or of an exported model on a dataset.

    tfdml evaluate --embeddings emb.npz --ks 1 2 4 8 --json metrics.json --plot recall.png
    tfdml evaluate --model exported_models/digits --dataset digits
    tfdml evaluate --model exported_models/glyphs_rll --dataset glyphs
    tfdml evaluate --model exported_models/shop --image-dir gallery/ --query-image-dir query/
"""

import argparse
import json
import os
import sys

import numpy as np

HELP = "Compute Recall@K, MAP@R, R-precision, NMI and F1 of embeddings or of an exported model."
DIGITS_TEST_CLASSES = tuple(range(5, 10))


def register(subparsers):
    parser = subparsers.add_parser(
        "evaluate", help=HELP, description=HELP + " Prints a table; optionally writes JSON and a Recall@K "
        "plot. Give either --embeddings or --model with a dataset.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    source = parser.add_argument_group("what to evaluate (one of)")
    source.add_argument("--embeddings", metavar="NPZ",
                        help="NumPy .npz file with arrays 'embeddings' and 'labels' (and optionally "
                             "'query_embeddings' and 'query_labels' for query/gallery evaluation).")
    source.add_argument("--model", metavar="DIR",
                        help="exported model: <base_dir>/<name> (latest version) or a version directory "
                             "written by 'tfdml export'.")
    data = parser.add_argument_group("dataset for --model")
    data.add_argument("--dataset", choices=["digits", "glyphs"],
                      help="built-in dataset: 'digits' is scikit-learn's 8x8 digits, test classes 5-9 "
                           "(the zero-shot split, about 900 images); 'glyphs' is tfdml.data.glyphs' test "
                           "half of the characters (unseen in training), rendered at the model's input "
                           "size with seed 0.")
    data.add_argument("--image-dir", metavar="DIR",
                      help="gallery images, one sub-directory per class (the sub-directory names, sorted, "
                           "give the labels).")
    data.add_argument("--query-image-dir", metavar="DIR",
                      help="query images laid out like --image-dir, for query/gallery evaluation (In-shop); "
                           "class sub-directories are matched by name.")
    data.add_argument("--version", type=int, help="model version to use instead of the latest.")
    data.add_argument("--batch-size", type=int, default=64, help="images per forward pass.")
    options = parser.add_argument_group("metrics")
    options.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8], help="the K values of Recall@K.")
    options.add_argument("--metrics", nargs="+", default=["recall", "map@r", "r_precision", "nmi", "f1"],
                         choices=["recall", "map@r", "r_precision", "nmi", "f1"], help="metrics to compute.")
    options.add_argument("--approximate", action="store_true",
                         help="use ScaNN approximate search instead of exact search (large galleries).")
    options.add_argument("--distance", choices=["squared_l2", "dot_product"], default="squared_l2",
                         help="ranking distance (equivalent for L2-normalised embeddings).")
    options.add_argument("--seed", type=int, default=0, help="k-means seed for NMI and F1.")
    out = parser.add_argument_group("outputs")
    out.add_argument("--json", metavar="FILE", help="write the metrics as JSON to this file.")
    out.add_argument("--plot", metavar="PNG", help="write a Recall@K plot to this PNG file.")
    parser.set_defaults(func=run)
    return parser


def load_digits_split(classes=DIGITS_TEST_CLASSES):
    """scikit-learn digits of the given classes as uint8 RGB images `[N, 8, 8, 3]` and labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    keep = np.isin(digits.target, classes)
    gray = np.round(digits.images[keep] * (255.0 / 16.0)).astype(np.uint8)
    return np.repeat(gray[..., None], 3, axis=-1), digits.target[keep].astype(np.int64)


def load_glyphs_split(image_size=32, split="test"):
    """`tfdml.data.glyphs` images of one split as uint8 `[N, size, size, 1]` and their labels."""
    from tfdml.data.glyphs import glyph_arrays

    images, labels, _ = glyph_arrays(split, image_size=image_size)
    return images, labels


def _embed_paths(embedder, paths, batch_size):
    from tfdml.export import read_image

    return embedder.embed([read_image(p, embedder.channels) for p in paths], batch_size=batch_size)


def _load_inputs(args):
    if bool(args.embeddings) == bool(args.model):
        raise ValueError("give exactly one of --embeddings or --model.")
    if args.embeddings:
        with np.load(args.embeddings) as data:
            missing = {"embeddings", "labels"} - set(data.files)
            if missing:
                raise ValueError(f"{args.embeddings} lacks arrays {sorted(missing)} (has {data.files}).")
            arrays = {key: data[key] for key in data.files}
        return (arrays["embeddings"], arrays["labels"], arrays.get("query_embeddings"),
                arrays.get("query_labels"))
    from tfdml.data.sources import list_class_folders
    from tfdml.export import ExportedEmbedder

    if bool(args.dataset) == bool(args.image_dir):
        raise ValueError("with --model give exactly one of --dataset or --image-dir.")
    embedder = ExportedEmbedder(args.model, args.version)
    if args.dataset == "digits":
        images, labels = load_digits_split()
        images = images[..., :embedder.channels]  # grayscale models take one channel
        return embedder.embed(images, batch_size=args.batch_size), labels, None, None
    if args.dataset == "glyphs":
        images, labels = load_glyphs_split(int(embedder.metadata["image_size"][0]))
        images = np.repeat(images, embedder.channels, axis=-1)  # grayscale glyphs for an RGB model
        return embedder.embed(images, batch_size=args.batch_size), labels, None, None
    paths, labels, names = list_class_folders(args.image_dir)
    gallery = _embed_paths(embedder, paths, args.batch_size)
    if not args.query_image_dir:
        return gallery, labels, None, None
    query_paths, query_labels, _ = list_class_folders(args.query_image_dir, class_names=names)
    return gallery, labels, _embed_paths(embedder, query_paths, args.batch_size), query_labels


def format_table(results):
    """Two-column text table of metric -> value (in %)."""
    width = max(len(key) for key in results)
    lines = [f"{'metric'.ljust(width)}  value (%)", f"{'-' * width}  ---------"]
    lines += [f"{key.ljust(width)}  {100 * value:9.2f}" for key, value in results.items()]
    return "\n".join(lines)


def run(args):
    from tfdml.retrieval import evaluate

    try:
        embeddings, labels, query_embeddings, query_labels = _load_inputs(args)
        results = evaluate(embeddings, labels, ks=args.ks, query_embeddings=query_embeddings,
                           query_labels=query_labels, metrics=args.metrics, exact=not args.approximate,
                           distance=args.distance, seed=args.seed, progress=len(labels) > 20000)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"tfdml evaluate: error: {error}", file=sys.stderr)
        return 2
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"metrics written to {args.json}")
    if args.plot:
        if any(key.startswith("recall@") for key in results):
            from tfdml.plots import plot_recall_curve

            plot_recall_curve(results, args.plot)
            print(f"Recall@K plot written to {args.plot}")
        else:
            print("no recall@K computed: --plot skipped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("evaluate"))
