"""`tfdml search`: top-k gallery neighbours of query images from an exported model and its ScaNN index.

    tfdml search --model exported_models/cub query1.jpg query2.jpg -k 5 --grid neighbours.png
    tfdml search --model exported_models/cub q1.jpg q2.jpg --query-label 017 --query-label 142
"""

import json
import os
import sys

import numpy as np

from tfdml.cli import positive_int, usage_error

HELP = "Find the nearest gallery images of query images with an exported model and its ScaNN index."


def register(subparsers):
    parser = subparsers.add_parser(
        "search", help=HELP, description=HELP + " The index is the one exported with the model version "
        "(<base_dir>/<name>/<version>/assets.extra/tfdml_index, written by 'tfdml train', 'tfdml export "
        "--gallery-dir' or tfdml.export.export_index); an index built with another version is refused. "
        "Prints each neighbour's id (file path, or item number of an embedded data set), class and score; "
        "optionally writes JSON and a retrieval grid PNG. Query files that cannot be decoded are skipped "
        "and named.")
    parser.add_argument("queries", nargs="+", metavar="IMAGE",
                        help="query image files (JPEG, PNG, BMP, GIF, WebP, TIFF).")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="exported model: <base_dir>/<name> (latest version) or a version directory.")
    parser.add_argument("--version", type=positive_int, help="model version to use instead of the latest.")
    parser.add_argument("--index", metavar="DIR",
                        help="another ScaNN index directory (default: the one inside the model version); "
                             "it must have been built with the same model version.")
    parser.add_argument("-k", "--k", type=positive_int, default=5,
                        help="number of neighbours per query (default 5).")
    # One value per option (not nargs="+"): a list option before the images would swallow them.
    parser.add_argument("--query-label", "--query-labels", dest="query_labels", action="append", metavar="CLASS",
                        help="class of a query (a class name stored in the index, or a label number); give it "
                             "once per query image, in the order of the images; neighbours are then marked "
                             "same-class (green) or other-class (red).")
    parser.add_argument("--json", metavar="FILE", help="write the neighbours as JSON to this file.")
    parser.add_argument("--grid", metavar="PNG",
                        help="write a retrieval grid PNG: queries and their neighbours with class and score.")
    parser.set_defaults(func=run)
    return parser


def _query_label(text, index):
    if index.class_names is not None and text in index.class_names:
        return index.class_names.index(text)
    try:
        return int(text)
    except ValueError:
        names = ", ".join(index.class_names[:20]) if index.class_names else "none stored"
        raise ValueError(f"--query-label: {text!r} is neither a class name of the index ({names}) nor a "
                         "label number.") from None


def _query_title(path, label, index):
    """One line under a grid's query: its class when given, else its (shortened) file name."""
    if label is not None:
        return "class " + (index.class_names[label] if index.class_names and 0 <= label < len(index.class_names)
                           else str(label))
    name = os.path.basename(path)
    return name if len(name) <= 18 else "..." + name[-15:]


def describe_id(found):
    """A printable gallery id: a file path as it is, an item number as `item N`."""
    return found if isinstance(found, str) else f"item {found}"


def neighbour_images(index, positions, ids, channels):
    """Pixels of the neighbours (from their files, or stored with the index), or None if unavailable."""
    from tfdml.export import GALLERY_IMAGES_FILE, read_image

    if all(isinstance(i, str) for i in np.ravel(ids).tolist()):
        if all(os.path.exists(i) for i in np.ravel(ids).tolist()):
            return [[read_image(i, channels) for i in row] for row in ids.tolist()]
        return None
    stored = index.load_array(GALLERY_IMAGES_FILE)
    if stored is None:
        return None
    return [[stored[p] for p in row] for row in positions]


def run(args):
    from tfdml.cli.reporting import warnings_to_stderr

    with warnings_to_stderr('search'):
        return _run(args)


def argument_problem(args):
    """What is wrong with the arguments that can be told without TensorFlow (exit 2 at once), or None."""
    if args.query_labels is not None and len(args.query_labels) != len(args.queries):
        return (f"{len(args.query_labels)} --query-label for {len(args.queries)} query images: give one "
                "--query-label CLASS per image, in the order of the images.")
    if not os.path.exists(args.model):
        return f"--model: no exported model at {args.model}"
    if args.index and not os.path.isdir(args.index):
        return f"--index: no such folder: {args.index}"
    for option, path in (("--json", args.json), ("--grid", args.grid)):
        if path and (os.path.isdir(path) or not os.path.isdir(os.path.dirname(os.path.abspath(path)))):
            return f"{option}: cannot write the file {path} (a folder, or its folder does not exist)"
    return None


def _run(args):
    problem = argument_problem(args)
    if problem:  # before TensorFlow is imported
        return usage_error("search", problem)
    from tfdml.data.sources import read_image_files
    from tfdml.export import load_index

    try:
        embedder, index = load_index(args.model, args.version, args.index)
        images, kept = read_image_files(args.queries, embedder.channels, what="query images")
        queries = [args.queries[i] for i in kept]
        query_labels = None
        if args.query_labels is not None:
            query_labels = np.asarray([_query_label(args.query_labels[i], index) for i in kept])
        ids, values = index.search(embedder.embed(images), k=min(args.k, index.size))
    except (ValueError, TypeError, OSError) as error:
        return usage_error("search", error)
    ids = np.asarray(ids)
    all_ids = np.arange(index.size) if index.ids is None else index.ids
    position_of = {key: p for p, key in enumerate(all_ids.tolist())}
    positions = [[position_of[i] for i in row] for row in ids.tolist()]
    flags = None
    if query_labels is not None and index.labels is not None:
        flags = index.labels[np.asarray(positions)] == query_labels[:, None]
    value_name = "score" if index.distance == "dot_product" else "distance"
    print(f"model {embedder.name} version {embedder.version}, gallery of {index.size} images")
    report = []
    for q, path in enumerate(queries):
        print(f"{path}:")
        neighbours = []
        for rank, (found, value) in enumerate(zip(ids[q].tolist(), values[q]), start=1):
            entry = {"rank": rank, "id": found, value_name: float(value)}
            if index.labels is not None:
                entry["label"] = index.labels[positions[q][rank - 1]].item()
                entry["class"] = index.class_name(positions[q][rank - 1])
            if flags is not None:
                entry["same_class"] = bool(flags[q][rank - 1])
            neighbours.append(entry)
            shown = f"  class {entry['class']}" if "class" in entry else ""
            print(f"  {rank:3d}. {describe_id(found)}{shown}  {value_name} {value:.4f}")
        report.append({"query": path, "neighbours": neighbours})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"neighbours written to {args.json}")
    if args.grid:
        pictures = neighbour_images(index, positions, ids, embedder.channels)
        if pictures is None:
            print("tfdml search: --grid skipped: the gallery images are neither files that exist nor stored "
                  "with the index", file=sys.stderr)
        else:
            from tfdml.plots import plot_retrieval_grid

            titles = [[(f"{n['class']} " if "class" in n else "") + f"{n[value_name]:.2f}" for n in entry[
                "neighbours"]] for entry in report]
            query_titles = [_query_title(path, None if query_labels is None else query_labels[q], index)
                            for q, path in enumerate(queries)]
            plot_retrieval_grid(images, pictures, flags, args.grid, titles=titles, query_titles=query_titles)
            print(f"retrieval grid written to {args.grid}")
    return 0


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("search"))
