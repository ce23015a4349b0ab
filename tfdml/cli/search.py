"""`tfdml search`: top-k gallery neighbours of query images from an exported model and its ScaNN index.

    tfdml search --model exported_models/cub query1.jpg query2.jpg -k 5 --grid neighbours.png
"""

import argparse
import json
import os
import sys

import numpy as np

HELP = "Find the nearest gallery images of query images with an exported model and its ScaNN index."


def register(subparsers):
    parser = subparsers.add_parser(
        "search", help=HELP, description=HELP + " The index is the one written by 'tfdml export' / "
        "tfdml.export.export_index (<base_dir>/<name>/index). Prints the neighbours; optionally writes "
        "JSON and a retrieval grid PNG.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("queries", nargs="+", metavar="IMAGE", help="query image files (JPEG, PNG, ...).")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="exported model: <base_dir>/<name> (latest version) or a version directory.")
    parser.add_argument("--version", type=int, help="model version to use instead of the latest.")
    parser.add_argument("--index", metavar="DIR",
                        help="ScaNN index directory (default: the 'index' directory beside the versions).")
    parser.add_argument("-k", "--k", type=int, default=5, help="number of neighbours per query.")
    parser.add_argument("--query-labels", type=int, nargs="+", metavar="LABEL",
                        help="class label of each query; with labels stored in the index, neighbours are "
                             "marked same-class (green) or other-class (red) in the grid.")
    parser.add_argument("--json", metavar="FILE", help="write the neighbours as JSON to this file.")
    parser.add_argument("--grid", metavar="PNG",
                        help="write a retrieval grid PNG (needs gallery ids that are image paths, as "
                             "export_index stores when the gallery is given as files).")
    parser.set_defaults(func=run)
    return parser


def default_index_dir(model_path, version=None):
    """`<base>/<name>/index` for a model given as `<base>/<name>` or `<base>/<name>/<version>`."""
    from tfdml.export import INDEX_DIR, resolve_export_dir

    version_dir = resolve_export_dir(model_path, version)
    return os.path.join(os.path.dirname(os.path.abspath(version_dir)), INDEX_DIR)


def run(args):
    from tfdml.export import ExportedEmbedder, read_image
    from tfdml.retrieval import ScannIndex

    try:
        if args.query_labels is not None and len(args.query_labels) != len(args.queries):
            raise ValueError(f"--query-labels has {len(args.query_labels)} entries for "
                             f"{len(args.queries)} queries.")
        embedder = ExportedEmbedder(args.model, args.version)
        index = ScannIndex.load(args.index or default_index_dir(args.model, args.version))
        images = [read_image(path, embedder.channels) for path in args.queries]
        ids, values = index.search(embedder.embed(images), k=min(args.k, index.size))
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"tfdml search: error: {error}", file=sys.stderr)
        return 2
    rows = np.arange(index.size) if index.ids is None else index.ids
    positions = [[int(np.flatnonzero(rows == i)[0]) for i in row] for row in ids]
    flags = None
    if args.query_labels is not None and index.labels is not None:
        flags = index.labels[np.asarray(positions)] == np.asarray(args.query_labels)[:, None]
    value_name = "score" if index.distance == "dot_product" else "distance"
    report = []
    for q, path in enumerate(args.queries):
        print(f"{path}:")
        neighbours = []
        for rank, (found, value) in enumerate(zip(ids[q], values[q]), start=1):
            entry = {"rank": rank, "id": found.item() if hasattr(found, "item") else found,
                     value_name: float(value)}
            if index.labels is not None:
                entry["label"] = index.labels[positions[q][rank - 1]].item()
            neighbours.append(entry)
            print(f"  {rank:3d}. {entry['id']}  {value_name}={value:.4f}"
                  + (f"  label={entry['label']}" if "label" in entry else ""))
        report.append({"query": path, "neighbours": neighbours})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.grid:
        if not all(isinstance(i, str) and os.path.exists(i) for i in np.ravel(ids).tolist()):
            print("tfdml search: --grid skipped: the index ids are not image files "
                  "(build the index from image paths)", file=sys.stderr)
        else:
            from tfdml.plots import plot_retrieval_grid

            neighbour_images = [[read_image(i, embedder.channels) for i in row] for row in ids.tolist()]
            plot_retrieval_grid(images, neighbour_images, flags, args.grid,
                                titles=[[f"{v:.2f}" for v in row] for row in values])
            print(f"retrieval grid written to {args.grid}")
    return 0


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("search"))
