"""`tfdml evaluate`: retrieval metrics of embeddings, or of an exported model on a dataset.

tfdml evaluate --model exported_models/glyphs_rll            # the data the job evaluated on
tfdml evaluate --embeddings emb.npz --ks 1 2 4 8 --json metrics.json --plot recall.png
tfdml evaluate --model exported_models/glyphs_rll --dataset glyphs
tfdml evaluate --model exported_models/shop --image-dir gallery/ --query-image-dir query/
tfdml evaluate --model exported_models/glyphs_rll --projector reports/glyphs_rll/tensorboard
tfdml evaluate --model exported_models/glyphs_rll --worst-queries worst/   # worst/worst_queries.html
"""

import json
import logging
import os
import sys
import zipfile

import numpy as np

from tfdml.cli import add_expansion_options, positive_int, usage_error
from tfdml.config import output_dir_problem, output_file_problem

logger = logging.getLogger("tfdml.evaluate")

HELP = "Compute Recall@K, MAP@R, R-precision, NMI and F1 of embeddings or of an exported model."


def register(subparsers):
    parser = subparsers.add_parser(
        "evaluate",
        help=HELP,
        description=HELP + " Prints a table of fractions (as 'tfdml train' does); "
        "optionally writes JSON and a Recall@K plot. Give either --embeddings or --model. An exported model "
        "embeds raw images through its serving signature (the preprocessing the job evaluated with), so "
        "evaluating a job's export on the job's evaluation data reproduces the job's metrics. Images that "
        "cannot be decoded are skipped and named.",
    )
    source = parser.add_argument_group("what to evaluate (one of)")
    source.add_argument(
        "--embeddings",
        metavar="NPZ",
        help="NumPy .npz file with arrays 'embeddings' and 'labels' (and optionally "
        "'query_embeddings' and 'query_labels' for query/gallery evaluation).",
    )
    source.add_argument(
        "--model",
        metavar="DIR",
        help="exported model: <base_dir>/<name> (latest version) or a version directory "
        "written by 'tfdml train' or 'tfdml export'.",
    )
    data = parser.add_argument_group(
        "data for --model (default: the evaluation data recorded in the export by 'tfdml train')"
    )
    data.add_argument(
        "--dataset",
        metavar="NAME",
        help="embedded data set (no download), its test split (the unseen classes): 'digits' "
        "is scikit-learn's 8x8 digits 5-9 (896 images), 'glyphs' tfdml.data.glyphs.",
    )
    data.add_argument(
        "--image-dir",
        metavar="DIR",
        help="gallery images, one sub-directory per class (the sub-directory names, sorted, give the labels).",
    )
    data.add_argument(
        "--query-image-dir",
        metavar="DIR",
        help="query images laid out like --image-dir, for query/gallery evaluation (In-shop); "
        "class sub-directories are matched by name.",
    )
    data.add_argument("--version", type=positive_int, help="model version to use instead of the latest.")
    data.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass (default 64).")
    _add_metric_and_output_options(parser)
    parser.set_defaults(func=run)
    return parser


def _add_metric_and_output_options(parser):
    options = parser.add_argument_group("metrics")
    options.add_argument(
        "--ks", type=positive_int, nargs="+", default=[1, 2, 4, 8], help="the K values of Recall@K (default 1 2 4 8)."
    )
    options.add_argument(
        "--metrics",
        nargs="+",
        default=["recall", "map@r", "r_precision", "nmi", "f1"],
        choices=["recall", "map@r", "r_precision", "nmi", "f1"],
        help="metrics to compute (default: all).",
    )
    options.add_argument(
        "--approximate",
        action="store_true",
        help="use ScaNN approximate search instead of exact search (large galleries).",
    )
    options.add_argument(
        "--distance",
        choices=["squared_euclidean", "squared_l2", "dot_product"],
        default="squared_euclidean",
        help="ranking distance (equivalent for L2-normalised embeddings; squared_l2 is ScaNN's name of "
        "squared_euclidean, the default, as the job).",
    )
    options.add_argument("--seed", type=int, default=0, help="k-means seed for NMI and F1 (default 0).")
    add_expansion_options(parser)
    _add_output_options(parser)


def _add_output_options(parser):
    out = parser.add_argument_group("outputs")
    out.add_argument("--json", metavar="FILE", help="write the metrics as JSON to this file.")
    out.add_argument("--plot", metavar="PNG", help="write a Recall@K plot to this PNG file.")
    out.add_argument(
        "--worst-queries",
        metavar="DIR",
        help="write a page of the worst queries into this folder (worst_queries.html, its images in "
        "worst_queries_images/ and the figure worst_queries.png; readable offline): each query with its top "
        "neighbours, their classes and scores, and its nearest correct item with its rank. With --embeddings, "
        "optional arrays 'class_names', 'images' and 'query_images' of the .npz are used.",
    )
    out.add_argument(
        "--worst-order",
        choices=["rank", "ap"],
        default="rank",
        help="order of --worst-queries: 'rank' (default), worst first by the rank of the nearest correct item; "
        "'ap', lowest first by the query's average precision (its term of MAP@R).",
    )
    out.add_argument(
        "--worst-count", type=positive_int, default=12, help="queries on the --worst-queries page (default 12)."
    )
    out.add_argument(
        "--projector",
        metavar="LOGDIR",
        help="write the (gallery) embeddings with their class names and a sprite of their images "
        "for TensorBoard's projector into this log directory (run 'projector'; then "
        "'tensorboard --logdir LOGDIR'). With --embeddings, optional arrays 'class_names' and "
        "'images' of the .npz are used.",
    )


def embed_source(embedder, source, batch_size, view=None):
    """`(embeddings, labels)` of every loadable item of `source` through the exported model; `view` (a dict),
    when given, receives the loaded images and the class names (for the projector)."""
    from tfdml.data.sources import load_items

    images, kept = load_items(source)
    if view is not None:
        view.update(images=images, class_names=getattr(source, "class_names", None))
        paths = getattr(source, "paths", None)  # an image folder's: the worst queries' page names the files
        if paths is not None:
            from tfdml.report_pages import item_files

            view["files"] = item_files([paths[i] for i in kept])
    return embedder.embed(images, batch_size=batch_size), source.labels[kept]


def argument_problem(args):
    """What is wrong with the arguments that can be told without TensorFlow (exit 2 at once), or None."""
    if bool(args.embeddings) == bool(args.model):
        return "give exactly one of --embeddings or --model."
    if args.embeddings and (args.dataset or args.image_dir or args.query_image_dir):
        return "--dataset, --image-dir and --query-image-dir choose the data of --model, not of --embeddings."
    if args.dataset and args.image_dir:
        return "give at most one of --dataset or --image-dir."
    if args.query_image_dir and not args.image_dir:
        return "--query-image-dir needs --image-dir (the gallery)."
    paths = [
        ("--embeddings", args.embeddings, os.path.isfile),
        ("--model", args.model, os.path.exists),
        ("--image-dir", args.image_dir, os.path.isdir),
        ("--query-image-dir", args.query_image_dir, os.path.isdir),
    ]
    for option, path, exists in paths:
        if path and not exists(path):
            return f"{option}: no such {'file' if exists is os.path.isfile else 'folder'}: {path}"
    if args.embeddings and not zipfile.is_zipfile(args.embeddings):
        # np.load would answer "pickled data" for a text file, or return a bare array for an .npy file.
        return (
            f"--embeddings: {args.embeddings} is not an .npz archive (np.savez writes one, with arrays "
            "'embeddings' and 'labels')."
        )
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        problem = path and output_file_problem(path)  # tried now, not after the work
        if problem:
            return f"{option}: {problem}"
    for option, folder in (("--projector", args.projector), ("--worst-queries", args.worst_queries)):
        problem = folder and output_dir_problem(folder, writable=True)
        if problem:
            return f"{option}: {problem}"
    return None


def _load_inputs(args, view=None):
    if args.embeddings:
        with np.load(args.embeddings) as data:
            missing = {"embeddings", "labels"} - set(data.files)
            if missing:
                raise ValueError(f"{args.embeddings} lacks arrays {sorted(missing)} (has {data.files}).")
            arrays = {key: data[key] for key in data.files}
        if view is not None:
            view.update(
                images=arrays.get("images"),
                class_names=arrays.get("class_names"),
                query_images=arrays.get("query_images"),
            )
        return (arrays["embeddings"], arrays["labels"], arrays.get("query_embeddings"), arrays.get("query_labels"))
    from tfdml.data.sources import embedded_source, image_folder, job_evaluation_source, single_image_classes
    from tfdml.export import ExportedEmbedder

    embedder = ExportedEmbedder(args.model, args.version)
    if args.dataset:
        # Data sets drawn at a size (glyphs) are drawn at the model's input size.
        source = embedded_source(args.dataset, "test", image_size=embedder.metadata["image_size"][0])
    elif args.image_dir:
        source = image_folder(args.image_dir, channels=embedder.channels)
    else:
        source = job_evaluation_source(embedder.metadata.get("training_config"), embedder.channels)
        if source is None:
            raise ValueError(
                f"{embedder.path} records no evaluation data it can load (it was not exported "
                "by 'tfdml train' from an embedded data set or image folder): give --dataset "
                "or --image-dir."
            )
    print(
        f"evaluating {embedder.name} version {embedder.version} on {source.name}: {len(source)} images, "
        f"{len(source.classes)} classes"
    )
    single = single_image_classes(source)
    if single and not args.query_image_dir:
        logger.warning(
            "%d %s a single image and %s no query (only a gallery item): %s",
            len(single),
            "class has" if len(single) == 1 else "classes have",
            "asks" if len(single) == 1 else "ask",
            source.name_classes(single),
        )
    gallery, labels = embed_source(embedder, source, args.batch_size, view)
    if not args.query_image_dir:
        return gallery, labels, None, None
    queries = image_folder(args.query_image_dir, channels=embedder.channels, class_names=source.class_names)
    query_view = {}
    query_embeddings, query_labels = embed_source(embedder, queries, args.batch_size, query_view)
    if view is not None:
        view["query_images"], view["query_files"] = query_view.get("images"), query_view.get("files")
    return gallery, labels, query_embeddings, query_labels


def format_table(results):
    """Two-column text table of metric -> value (fractions, as `tfdml train` prints them)."""
    width = max(len("metric"), max(len(key) for key in results))
    lines = [f"{'metric'.ljust(width)}   value", f"{'-' * width}  ------"]
    lines += [f"{key.ljust(width)}  {value:.4f}" for key, value in results.items()]
    return "\n".join(lines)


def run(args):
    from tfdml.cli.reporting import warnings_to_stderr

    with warnings_to_stderr("evaluate"):
        return _run(args)


def _run(args):
    problem = argument_problem(args)
    if problem:  # before TensorFlow is imported
        return usage_error("evaluate", problem)
    from tfdml.retrieval import evaluate

    try:
        view = {}
        embeddings, labels, query_embeddings, query_labels = _load_inputs(args, view)
        results = evaluate(
            embeddings,
            labels,
            ks=args.ks,
            query_embeddings=query_embeddings,
            query_labels=query_labels,
            metrics=args.metrics,
            exact=not args.approximate,
            distance=args.distance,
            seed=args.seed,
            progress=len(labels) > 20000,
            query_expansion=args.query_expansion,
            database_augmentation=args.database_augmentation,
            expansion_alpha=args.expansion_alpha,
        )
    except (ValueError, TypeError, OSError, zipfile.BadZipFile) as error:
        return usage_error("evaluate", error)
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
    if args.worst_queries:
        try:
            _write_worst_queries(args, embeddings, labels, query_embeddings, query_labels, view)
        except (ValueError, OSError) as error:
            return usage_error("evaluate", f"--worst-queries: {error}")
    if args.projector:
        from tfdml.projector import write_projector

        try:
            written = write_projector(args.projector, embeddings, labels, view.get("class_names"), view.get("images"))
        except (ValueError, OSError) as error:
            return usage_error("evaluate", f"--projector: {error}")
        print(
            f"projector: {written['points']} embeddings written to {written['run_dir']} "
            f"(tensorboard --logdir {args.projector})"
        )
    return 0


def _write_worst_queries(args, embeddings, labels, query_embeddings, query_labels, view):
    from tfdml.report_pages import write_worst_queries_page
    from tfdml.retrieval import worst_queries

    worst = worst_queries(
        embeddings,
        labels,
        query_embeddings,
        query_labels,
        count=args.worst_count,
        by=args.worst_order,
        distance=args.distance,
    )
    images, query_images = view.get("images"), view.get("query_images")
    if query_embeddings is not None and query_images is None:
        images = None  # the page shows the query images beside the gallery's, or neither
    names = view.get("class_names")
    written = write_worst_queries_page(
        args.worst_queries,
        worst,
        images,
        query_images,
        None if names is None else [str(name) for name in names],
        title="Worst queries",
        files=view.get("files"),
        query_files=view.get("query_files"),
    )
    print(f"worst queries: {written['page']}" + (f" and {written['grid']}" if written["grid"] else ""))


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("evaluate"))
