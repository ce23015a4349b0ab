"""`tfdml export`: a saved Keras embedder (.keras) -> TF Serving SavedModel (+ ScaNN index, + `search` signature).

tfdml export --model reports/glyphs_rll/model.keras              # named glyphs_rll, as the job
tfdml export --model cub.keras --name cub --gallery-dir /data/cub_test --version 3 --top-k 20
"""

import json
import math
import os
import sys
import zipfile

from tfdml.cli import add_expansion_options, positive_int, usage_error
from tfdml.config import MATCH_MODES, ConfigError, ExportConfig, output_dir_problem
from tfdml.locks import FolderLock
from tfdml.retrieval_options import TARGET_RECALL

HELP = "Export a trained Keras embedder as a TF Serving SavedModel, optionally with a ScaNN gallery index."


def register(subparsers):
    parser = subparsers.add_parser(
        "export",
        help=HELP,
        description=HELP + " Writes <base-dir>/<name>/<version>/ atomically (serving_default takes uint8 "
        "images of any size and preprocesses them as the job's evaluation did; embed_preprocessed takes "
        "preprocessed float tensors), with tfdml_metadata.json (filled from the report's config.yaml and "
        "metrics.json when the model file sits in a 'tfdml train' report folder) and, with --gallery-dir, "
        "the gallery's ScaNN index inside the version (assets.extra/tfdml_index, ignored by TF Serving) and "
        "the 'search' signature (images in; the --top-k nearest gallery items' scores, class names, ids and "
        "calibrated match decisions out, core TensorFlow ops only). "
        "Serve it with: tensorflow_model_server --rest_api_port=8501 --model_name=<name> "
        "--model_base_path=$PWD/<base-dir>/<name>",
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="KERAS_FILE",
        help="a model saved with model.save('....keras') (tfdml train writes <report-dir>/model.keras).",
    )
    parser.add_argument(
        "--name",
        help="model name: the directory under --base-dir that TF Serving's "
        "--model_base_path points to (default: the job's export name when the "
        "model sits in a 'tfdml train' report folder).",
    )
    parser.add_argument(
        "--base-dir", default="exported_models", help="TF Serving base directory (default exported_models)."
    )
    parser.add_argument(
        "--version",
        type=positive_int,
        help="version number (default: next free integer); an existing version is replaced.",
    )
    parser.add_argument(
        "--image-size",
        type=positive_int,
        nargs=2,
        metavar=("HEIGHT", "WIDTH"),
        help="input size of the model (default: the model's input size).",
    )
    parser.add_argument(
        "--no-center-crop",
        action="store_true",
        help="resize images straight to the input size instead of resizing to 256/224 of it "
        "and cropping the centre (the evaluation preprocessing of tfdml.data). A model "
        "from a report folder whose job trained on whole images (no random crop) is "
        "exported without the crop anyway.",
    )
    parser.add_argument(
        "--preprocess",
        help="pixel preprocessing in the graph, for a Keras model that does not preprocess its "
        "input itself: none, unit (x/255), symmetric (x/127.5-1) or a dotted function "
        "name (default: none). tfdml embedders apply their own preprocessing to raw "
        "pixels (their first layer), so the graph adds none.",
    )
    _add_gallery_options(parser)
    add_expansion_options(parser)
    parser.set_defaults(func=run)
    return parser


def _add_gallery_options(parser):
    group = parser.add_argument_group("gallery, ScaNN index and search signature")
    group.add_argument(
        "--gallery-dir",
        metavar="DIR",
        help="build the ScaNN index of these images (one sub-folder per class); files that "
        "cannot be decoded are skipped and named. Default: the job's evaluation data "
        "when the model sits in a 'tfdml train' report folder (embedded data set or "
        "image folder), else no index.",
    )
    group.add_argument(
        "--no-index",
        action="store_true",
        help="export the SavedModel without an index (and so without the search signature).",
    )
    group.add_argument(
        "--no-search",
        action="store_true",
        help="leave the 'search' signature out (the gallery's ScaNN index is still written).",
    )
    group.add_argument(
        "--target-recall",
        type=recall_target,
        metavar="R",
        help="for an approximate ScaNN index (galleries from 20,000 items): the recall@10 against exact "
        "search it must reach, measured on 500 gallery items left out of their own neighbours; the leaves "
        "searched and re-ordering are raised until it holds at a 95%% lower confidence bound (the mean less "
        "1.645 standard errors), and the measured recall, its bound, settings and query "
        "time are printed and recorded in the index. A target not met cheaper than exact search falls back "
        "to brute force, which is said. 'none' keeps the automatic settings unmeasured (default: the job's "
        f"export.target_recall for a model in a report folder, else {TARGET_RECALL:g}).",
    )
    _add_search_options(group)


def _add_search_options(group):
    """The search signature's options (in the gallery's group)."""
    group.add_argument(
        "--search-dims",
        type=positive_int,
        metavar="D",
        help="for nested embeddings (trained with loss.nested_dims): build the ScaNN index on the first D "
        "dimensions of each embedding, normalised, and re-rank its shortlist with the full vector; the search "
        "signature does the same. Each shortlist is sized to meet --target-recall against exact search on the "
        "full vector, and the measured recall is printed and recorded in the metadata (default: the full vector).",
    )
    group.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help="neighbours the search signature returns per image (default: the job's "
        "export.top_k for a model in a report folder, else 10).",
    )
    group.add_argument(
        "--gallery-dtype",
        choices=("float32", "bfloat16", "int8"),
        help="how the search signature stores the gallery: float32 (exact), bfloat16 (half "
        "the memory) or int8 with per-row scales (a quarter; the search benchmark measures "
        "their recall cost). Default: the job's, else float32.",
    )
    group.add_argument(
        "--match-precision",
        type=float,
        metavar="P",
        help="the search signature's match output is true at the score threshold where a "
        "top-1 match is correct with this precision on the gallery's labelled items "
        "(see --match-mode; default: the job's, else 0.9).",
    )
    group.add_argument(
        "--match-mode",
        choices=MATCH_MODES,
        help="how the match threshold is calibrated: open (leave-one-class-out: the precision holds on a "
        "stream of queries half of whose classes are absent from the gallery, as for 'is this item in my "
        "catalogue?'), closed (leave-one-out: queries whose class is in the gallery only) or auto (open "
        "whenever the gallery has at least 4 classes). Default: the job's export.match_mode for a model in "
        "a report folder, else auto.",
    )


# `--target-recall none`: told apart from the option not given (None), which takes the job's value.
UNMEASURED = "none"


def recall_target(text):
    """`--target-recall`: a recall in (0, 1], or 'none' (`UNMEASURED`)."""
    import argparse

    if text.lower() == UNMEASURED:
        return UNMEASURED
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a recall in (0, 1] or 'none', got {text!r}")
    return value


def report_files(model_path):
    """`(training_config, metrics)` from the `tfdml train` report folder holding `model_path` (or Nones)."""
    import yaml

    folder = os.path.dirname(os.path.abspath(model_path))
    config = metrics = None
    if os.path.exists(os.path.join(folder, "config.yaml")):
        with open(os.path.join(folder, "config.yaml")) as f:
            config = yaml.safe_load(f)
    if os.path.exists(os.path.join(folder, "metrics.json")):
        with open(os.path.join(folder, "metrics.json")) as f:
            metrics = json.load(f).get("model")
    return config, metrics


# The search signature's options and the `export` keys whose ranges they take.
_SEARCH_OPTIONS = {"top_k": "--top-k", "match_precision": "--match-precision"}


def argument_problem(args):
    """What is wrong with the arguments that can be told without TensorFlow (exit 2 at once), or None."""
    if not os.path.exists(args.model):
        return f"--model: no model file at {args.model}"
    if args.gallery_dir and args.no_index:
        return "give at most one of --gallery-dir and --no-index."
    if (args.query_expansion or args.database_augmentation) and args.no_search:
        return "--query-expansion and --database-augmentation re-rank in the search signature; --no-search writes none."
    if args.search_dims and args.no_index:
        return "--search-dims sets how the gallery index searches; --no-index writes none."
    if args.gallery_dir and not os.path.isdir(args.gallery_dir):
        return f"--gallery-dir: no such folder: {args.gallery_dir}"
    given = {key: getattr(args, key) for key in _SEARCH_OPTIONS if getattr(args, key) is not None}
    try:  # the ranges of the job's export section, checked before anything is embedded
        ExportConfig.from_dict(given)
    except ConfigError as error:
        key, _, rest = str(error).partition(":")
        return f"{_SEARCH_OPTIONS.get(key.removeprefix('export.'), key)}:{rest}"
    try:
        name = _model_name(args, report_files(args.model)[0])
    except ValueError as error:
        name, unnamed = None, str(error)
    # The folder the export writes, or, with no name known yet, the base folder it would be made in.
    problem = output_dir_problem(args.base_dir if name is None else os.path.join(args.base_dir, name), writable=True)
    if problem:
        return f"--base-dir: {problem}"
    if name is None:
        return unnamed
    problem = model_file_problem(args.model)
    return f"--model: {problem}" if problem else None


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def model_file_problem(path):
    """Why `path` is not a model file that `keras.saving.load_model` can read, or None. Keras answers "File
    not found" for any .keras file it cannot open and h5py "file signature not found": both mislead a user
    whose file is there but truncated or of another kind."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "saved_model.pb")):
            return (
                f"{path} is a SavedModel folder (what 'tfdml export' writes), not a Keras model: give the "
                "model.keras that 'tfdml train' wrote in its report folder."
            )
        return f"{path} is a folder; give a .keras model file."
    if not os.path.isfile(path):
        return f"no model file at {path}"
    if path.endswith(".h5"):
        with open(path, "rb") as f:
            if f.read(len(_HDF5_SIGNATURE)) != _HDF5_SIGNATURE:
                return f"{path} exists but is not a readable HDF5 (.h5) Keras file: it is truncated or of another kind."
        return None
    if not path.endswith(".keras"):
        return f"{path} is not a .keras file (Keras 3 reads .keras archives and legacy .h5 files)."
    if not zipfile.is_zipfile(path):
        return (
            f"{path} exists but is not a readable Keras archive (a .keras file is a zip archive; this one is "
            "truncated or of another kind): copy or download it again."
        )
    with zipfile.ZipFile(path) as archive:
        if "config.json" not in archive.namelist():
            return f"{path} is a zip archive but not a Keras model (it has no config.json)."
    return None


def _search_settings(args, training_config):
    """The search signature's and the index's settings: the options given, else the job's `export` section,
    else the section's defaults."""
    job = (training_config or {}).get("export") or {}
    given = {
        "top_k": args.top_k,
        "gallery_dtype": args.gallery_dtype,
        "match_precision": args.match_precision,
        "match_mode": args.match_mode,
        "target_recall": args.target_recall,
    }
    defaults = ExportConfig()
    settings = {
        key: value if value is not None else job.get(key, getattr(defaults, key)) for key, value in given.items()
    }
    recall = settings.pop("target_recall")
    settings["index_settings"] = {"target_recall": None if recall == UNMEASURED else recall}
    return settings


def run(args):
    from tfdml.cli.reporting import warnings_to_stderr

    problem = argument_problem(args)
    if problem:  # before TensorFlow is imported
        return usage_error("export", problem)
    training_config, metrics = report_files(args.model)
    try:
        name = _model_name(args, training_config)
    except ValueError as error:
        return usage_error("export", error)
    # One export per model folder at a time (a second is refused, naming the first): versions never collide.
    lock = FolderLock(
        os.path.join(args.base_dir, name),
        "tfdml export",
        say=lambda text: print(f"tfdml export: note: {text}", file=sys.stderr),
        advice="wait for it to finish (the next export then takes the next version) or give another --name",
    )
    with lock, warnings_to_stderr("export"):
        return _run(args, name, training_config, metrics)


def _run(args, name, training_config, metrics):
    import keras

    from tfdml import export as export_lib
    from tfdml import interrupts
    from tfdml.data.preprocessing import evaluation_center_crop

    try:
        model = keras.saving.load_model(args.model, compile=False)
        if args.image_size is None and export_lib.model_image_size(model) is None:
            return usage_error(
                "export",
                f"cannot tell the input size of {args.model} (its input shape leaves height and width open): "
                "give it with --image-size HEIGHT WIDTH",
            )
        gallery = _gallery(args, training_config, export_lib.input_channels(model))
        # A model from a report folder is served with the geometry its job evaluated with.
        center_crop = not args.no_center_crop and (
            training_config is None or evaluation_center_crop(training_config.get("data", {}).get("augment", True))
        )
        path = export_lib.export_saved_model(
            model,
            base_dir=args.base_dir,
            name=name,
            version=args.version,
            image_size=tuple(args.image_size) if args.image_size else None,
            preprocess=args.preprocess,
            overwrite=args.version is not None,
            center_crop=center_crop,
            training_config=training_config,
            metrics=metrics,
            gallery=gallery,
            search=not args.no_search,
            search_dims=args.search_dims,
            query_expansion=args.query_expansion,
            database_augmentation=args.database_augmentation,
            expansion_alpha=args.expansion_alpha,
            **_search_settings(args, training_config),
        )
    except (ValueError, TypeError, OSError) as error:
        return usage_error("export", error)
    interrupts.complete(f"the export {path}")  # a stop from here on loses nothing
    _print_export(export_lib, path, gallery)
    return 0


def _model_name(args, training_config):
    """--name, else the name the job's configuration gives its export or itself."""
    job = training_config or {}
    name = args.name or (job.get("export") or {}).get("name") or job.get("name")
    if not name:
        raise ValueError("--name is needed: the model is not in a 'tfdml train' report folder that names it.")
    return name


def _gallery(args, training_config, channels):
    """The gallery to index: --gallery-dir, else the job's evaluation data (None with --no-index, or when the
    job's data is not on this machine, which is said: 'tfdml search' needs an index)."""
    from tfdml.data.sources import image_folder, job_evaluation_source

    if args.gallery_dir:
        return image_folder(args.gallery_dir, channels=channels)
    if args.no_index:
        return None
    gallery = job_evaluation_source(training_config, channels)
    if gallery is None:
        reason = (
            "the model is not in a 'tfdml train' report folder"
            if training_config is None
            else "the job's evaluation data is not on this machine (tfds)"
        )
        print(
            f"tfdml export: note: no ScaNN index: {reason}; give --gallery-dir DIR to build one for 'tfdml search'",
            file=sys.stderr,
        )
    return gallery


def _describe_prefix(record):
    """A prefix search's recall record (`tfdml.export.PrefixIndex`) in one line."""
    target = (
        "" if record["target"] is None else f", target {record['target']:g}" + ("" if record["met"] else " NOT met")
    )
    return (
        f"{record['search_dims']}-d prefix searched, shortlist of {record['shortlist']} re-ranked with the full "
        f"{record['full_dims']}-d vector: recall@{record['k']} {record['measured']:.3f} (lower "
        f"{100 * record['confidence']:g}% bound {record['lower_bound']:.3f}) against exact full-vector search{target}"
    )


def _print_export(export_lib, path, gallery):
    print(f"exported SavedModel: {path}")
    if gallery is None:
        return
    metadata = export_lib.load_metadata(path)
    summary = metadata["index"]
    print(
        f"ScaNN index of {summary['size']} images of {gallery.name}, {summary['classes']} classes: "
        f"{os.path.join(path, export_lib.INDEX_DIR)}"
    )
    recall = summary.get("recall")
    if summary.get("search_dims"):
        print(f"index: {_describe_prefix(recall)}")
    elif recall:
        from tfdml.retrieval.index import describe_recall  # like the other imports here: loaded when needed

        print(f"index: {describe_recall(recall)}")
    else:
        print(f"index: {summary['mode']} search")
    search = metadata.get("search")
    if search:
        print(
            f"search signature: top {search['top_k']} of {search['gallery_size']} items "
            f"({search['gallery_dtype']}), match: {search['match']}"
        )
        if search.get("prefix"):
            print(f"search signature: {_describe_prefix(search['prefix'])}")


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("export"))
