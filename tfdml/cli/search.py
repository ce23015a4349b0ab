"""`tfdml search`: top-k gallery neighbours of query images from an exported model and its ScaNN index, or
(`--exact`) from the version's `search` signature, the exact search that TF Serving answers.

    tfdml search --model exported_models/cub query1.jpg query2.jpg -k 5 --grid neighbours.png
    tfdml search --model exported_models/cub q1.jpg q2.jpg --query-label 017 --query-label 142
    tfdml search --model exported_models/cub query1.jpg --exact
"""

import json
import os
import sys

import numpy as np

from tfdml.cli import positive_int, usage_error
from tfdml.config import output_file_problem

HELP = "Find the nearest gallery images of query images with an exported model and its ScaNN index."

DESCRIPTION = (
    HELP + " The index is the one exported with the model version "
    "(<base_dir>/<name>/<version>/assets.extra/tfdml_index, written by 'tfdml train', 'tfdml export "
    "--gallery-dir' or tfdml.export.export_index); an index built with another version is refused. "
    "Prints each neighbour's id (file path, or item number of an embedded data set), class, score and "
    "match decision, and what 'match' promises (the calibration recorded at export: open set by "
    "default, i.e. its precision holds on a stream of queries half of whose classes are absent from "
    "the gallery); "
    "optionally writes JSON and a retrieval grid PNG. Query files that cannot be decoded are skipped "
    "and named. With --exact, the version's 'search' signature answers instead (exact cosine top-k "
    "in TensorFlow, with calibrated match decisions: what TF Serving returns; no ScaNN needed)."
)


def register(subparsers):
    parser = subparsers.add_parser("search", help=HELP, description=DESCRIPTION)
    parser.add_argument(
        "queries", nargs="+", metavar="IMAGE", help="query image files (JPEG, PNG, BMP, GIF, WebP, TIFF)."
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="exported model: <base_dir>/<name> (latest version) or a version directory.",
    )
    parser.add_argument("--version", type=positive_int, help="model version to use instead of the latest.")
    parser.add_argument(
        "--index",
        metavar="DIR",
        help="another ScaNN index directory (default: the one inside the model version); "
        "it must have been built with the same model version.",
    )
    parser.add_argument(
        "-k",
        "--k",
        type=positive_int,
        default=5,
        help="number of neighbours per query (default 5; with --exact at most the top_k "
        "the version was exported with).",
    )
    # One value per option (not nargs="+"): a list option before the images would swallow them.
    parser.add_argument(
        "--query-label",
        "--query-labels",
        dest="query_labels",
        action="append",
        metavar="CLASS",
        help="class of a query (a class name stored in the index, or a label number: the position of the "
        "class among the index's class names, which are its gallery's classes only); give it "
        "once per query image, in the order of the images; neighbours are then marked "
        "same-class (green) or other-class (red).",
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="use the version's 'search' signature (exact, in TensorFlow, with the match "
        "decision) instead of the ScaNN index.",
    )
    parser.add_argument("--json", metavar="FILE", help="write the neighbours as JSON to this file.")
    parser.add_argument(
        "--grid", metavar="PNG", help="write a retrieval grid PNG: queries and their neighbours with class and score."
    )
    parser.set_defaults(func=run)
    return parser


def _query_label(text, index):
    if index.class_names is not None and text in index.class_names:
        return index.class_names.index(text)
    try:
        return int(text)
    except ValueError:
        names = ", ".join(index.class_names[:20]) if index.class_names else "none stored"
        raise ValueError(
            f"--query-label: {text!r} is neither a class name of the index ({names}) nor a label number."
        ) from None


def _query_title(path, label, index):
    """One line under a grid's query: its class when given, else its (shortened) file name."""
    if label is not None:
        return "class " + (
            index.class_names[label] if index.class_names and 0 <= label < len(index.class_names) else str(label)
        )
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

    with warnings_to_stderr("search"):
        return _run(args)


def argument_problem(args):
    """What is wrong with the arguments that can be told without TensorFlow (exit 2 at once), or None."""
    if args.query_labels is not None and len(args.query_labels) != len(args.queries):
        return (
            f"{len(args.query_labels)} --query-label for {len(args.queries)} query images: give one "
            "--query-label CLASS per image, in the order of the images."
        )
    if not os.path.exists(args.model):
        return f"--model: no exported model at {args.model}"
    if args.index and not os.path.isdir(args.index):
        return f"--index: no such folder: {args.index}"
    for option, path in (("--json", args.json), ("--grid", args.grid)):
        problem = path and output_file_problem(path)  # tried now, not after the work
        if problem:
            return f"{option}: {problem}"
    return None


def _run(args):
    problem = argument_problem(args)
    if problem:  # before TensorFlow is imported
        return usage_error("search", problem)
    from tfdml.data.sources import read_image_files
    from tfdml.export import load_index

    try:
        if args.exact:
            if args.index:
                raise ValueError(
                    "--index is the ScaNN index; --exact uses the version's search signature: give one of them."
                )
            return _run_exact(args)
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
    search_info = embedder.metadata.get("search") or {}
    # The exported match rule applies to the index's scores too: dot products of unit vectors are the cosines.
    threshold = search_info.get("match_threshold") if index.distance == "dot_product" else None
    print(
        f"model {embedder.name} version {embedder.version}, gallery of {index.size} images"
        + (f", match: {search_info['match']}" if "match" in search_info else "")
    )
    report = []
    for q, path in enumerate(queries):
        print(f"{path}:")
        found = zip(ids[q].tolist(), values[q], positions[q], [None] * len(positions[q]) if flags is None else flags[q])
        report.append({"query": path, "neighbours": _neighbours(index, found, threshold, value_name)})
    query_titles = [
        _query_title(path, None if query_labels is None else query_labels[q], index) for q, path in enumerate(queries)
    ]
    _write_outputs(
        args,
        report,
        images,
        lambda: neighbour_images(index, positions, ids, embedder.channels),
        flags,
        query_titles,
        value_name,
    )
    return 0


def _neighbours(index, found, threshold, value_name):
    """The report entries of one query's neighbours (`found`: id, score, gallery position, same class or None),
    each printed as one line."""
    neighbours = []
    for rank, (key, value, position, same_class) in enumerate(found, start=1):
        entry = {"rank": rank, "id": key, value_name: float(value)}
        if index.labels is not None:
            entry["label"] = index.labels[position].item()
            entry["class"] = index.class_name(position)
        if same_class is not None:
            entry["same_class"] = bool(same_class)
        if threshold is not None:
            entry["match"] = bool(value >= threshold)
        neighbours.append(entry)
        shown = f"  class {entry['class']}" if "class" in entry else ""
        marked = "  match" if entry.get("match") else ""
        print(f"  {rank:3d}. {describe_id(key)}{shown}  {value_name} {value:.4f}{marked}")
    return neighbours


def _write_outputs(args, report, images, pictures, flags, query_titles, value_name="score"):
    """--json and --grid; `pictures()` gives the neighbours' pixels, or None when they cannot be found."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"neighbours written to {args.json}")
    if args.grid:
        pictures = pictures()
        if pictures is None:
            print(
                "tfdml search: --grid skipped: the gallery images are neither files that exist nor stored "
                "with the index",
                file=sys.stderr,
            )
        else:
            from tfdml.plots import plot_retrieval_grid

            # the class on a line of its own, the score on the rank's: a right-to-left name keeps its place
            titles = [[str(n.get("class", "")) for n in entry["neighbours"]] for entry in report]
            scores = [[f"{n[value_name]:.2f}" for n in entry["neighbours"]] for entry in report]
            plot_retrieval_grid(
                images, pictures, flags, args.grid, titles=titles, query_titles=query_titles, scores=scores
            )
            print(f"retrieval grid written to {args.grid}")


def _index_files(version_dir):
    """What the version's index folder says about the gallery without loading ScaNN: class names, item ids
    and the stored pixels (each None when absent)."""
    from tfdml.export import GALLERY_IMAGES_FILE, INDEX_DIR

    folder = os.path.join(version_dir, INDEX_DIR)

    def array(name):
        path = os.path.join(folder, name)
        return np.load(path, allow_pickle=False) if os.path.exists(path) else None

    config = {}
    if os.path.exists(os.path.join(folder, "tfdml_index.json")):
        with open(os.path.join(folder, "tfdml_index.json")) as f:
            config = json.load(f)
    return config.get("class_names"), array("ids.npy"), array(GALLERY_IMAGES_FILE)


def _exact_pictures(ids, stored_ids, stored, channels):
    """Pixels of the signature's neighbours: their files, or the pixels stored with the index (an id
    `<source>:<n>` is item n of the gallery)."""
    from tfdml.export import read_image

    flat = ids.ravel().tolist()
    if all(os.path.exists(i) for i in flat):
        return [[read_image(i, channels) for i in row] for row in ids.tolist()]
    if stored is None:
        return None
    items = (stored_ids if stored_ids is not None else np.arange(len(stored))).tolist()
    position_of = {str(item): p for p, item in enumerate(items)}
    try:
        return [[stored[position_of[i.rpartition(":")[2]]] for i in row] for row in ids.tolist()]
    except KeyError:
        return None


def _exact_report(found, queries, k, query_classes):
    """Prints each query's neighbours from the search signature's outputs; returns the JSON report and, when
    the queries' classes are known, the `[Q, k]` same-class flags."""
    report, flags = [], None if query_classes is None else np.zeros((len(queries), k), bool)
    for q, path in enumerate(queries):
        print(f"{path}:")
        neighbours = []
        for rank in range(1, k + 1):
            entry = {
                "rank": rank,
                "id": found["ids"][q, rank - 1],
                "score": float(found["scores"][q, rank - 1]),
                "match": bool(found["match"][q, rank - 1]),
            }
            if found["labels"][q, rank - 1]:
                entry["class"] = found["labels"][q, rank - 1]
            if flags is not None:
                flags[q, rank - 1] = entry["same_class"] = entry.get("class") == query_classes[q]
            neighbours.append(entry)
            shown = f"  class {entry['class']}" if "class" in entry else ""
            print(
                f"  {rank:3d}. {entry['id']}{shown}  score {entry['score']:.4f}" + ("  match" if entry["match"] else "")
            )
        report.append({"query": path, "neighbours": neighbours})
    return report, flags


def _run_exact(args):
    """`--exact`: the neighbours, classes, scores and match decisions of the version's search signature."""
    from tfdml.data.sources import read_image_files
    from tfdml.export import ExportedEmbedder

    embedder = ExportedEmbedder(args.model, args.version)
    if not embedder.has_search:
        raise ValueError(
            f"{embedder.path} has no 'search' signature (exported without a gallery or with "
            f"--no-search); search its ScaNN index without --exact, or export it again."
        )
    images, kept = read_image_files(args.queries, embedder.channels, what="query images")
    queries = [args.queries[i] for i in kept]
    found = embedder.search(images)
    exported_k = found["scores"].shape[1]
    if args.k > exported_k:
        print(
            f"tfdml search: warning: the search signature returns {exported_k} neighbours (exported with "
            f"--top-k {exported_k}); showing {exported_k}",
            file=sys.stderr,
        )
    k = min(args.k, exported_k)
    class_names, stored_ids, stored = _index_files(embedder.path)
    query_classes = None
    if args.query_labels is not None:
        texts = [args.query_labels[i] for i in kept]
        # A class name first, else a label number, as the ScaNN path reads --query-label (_query_label).
        query_classes = [
            class_names[int(t)]
            if class_names and t not in class_names and t.isdigit() and int(t) < len(class_names)
            else t
            for t in texts
        ]
    search = embedder.metadata.get("search", {})
    print(
        f"model {embedder.name} version {embedder.version}, gallery of {search.get('gallery_size', '?')} "
        f"images, exact search signature ({search.get('gallery_dtype', 'float32')}), match: "
        f"{search.get('match', '?')}"
    )
    report, flags = _exact_report(found, queries, k, query_classes)
    query_titles = [
        f"class {query_classes[q]}" if query_classes else _query_title(path, None, None)
        for q, path in enumerate(queries)
    ]
    _write_outputs(
        args,
        report,
        images,
        lambda: _exact_pictures(found["ids"][:, :k], stored_ids, stored, embedder.channels),
        flags,
        query_titles,
    )
    return 0


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("search"))
