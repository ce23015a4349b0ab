"""`tfdml export`: a saved Keras embedder (.keras) -> TF Serving SavedModel (+ ScaNN index).

    tfdml export --model reports/glyphs_rll/model.keras --name glyphs_rll
    tfdml export --model cub.keras --name cub --gallery-dir /data/cub_test --version 3
"""

import json
import os
import sys

HELP = "Export a trained Keras embedder as a TF Serving SavedModel, optionally with a ScaNN gallery index."


def register(subparsers):
    parser = subparsers.add_parser(
        "export", help=HELP,
        description=HELP + " Writes <base-dir>/<name>/<version>/ atomically (serving_default takes uint8 "
        "images of any size and preprocesses them as the job's evaluation did; embed_preprocessed takes "
        "preprocessed float tensors), with tfdml_metadata.json (filled from the report's config.yaml and "
        "metrics.json when the model file sits in a 'tfdml train' report folder) and, with --gallery-dir, "
        "the gallery's ScaNN index inside the version (assets.extra/tfdml_index, ignored by TF Serving). "
        "Serve it with: tensorflow_model_server --rest_api_port=8501 --model_name=<name> "
        "--model_base_path=$PWD/<base-dir>/<name>")
    parser.add_argument("--model", required=True, metavar="KERAS_FILE",
                        help="a model saved with model.save('....keras') (tfdml train writes "
                             "<report-dir>/model.keras).")
    parser.add_argument("--name", required=True, help="model name: the directory under --base-dir that TF "
                                                      "Serving's --model_base_path points to.")
    parser.add_argument("--base-dir", default="exported_models",
                        help="TF Serving base directory (default exported_models).")
    parser.add_argument("--version", type=int, help="version number (default: next free integer); an existing "
                                                    "version is replaced.")
    parser.add_argument("--image-size", type=int, nargs=2, metavar=("HEIGHT", "WIDTH"),
                        help="input size of the model (default: the model's input size).")
    parser.add_argument("--no-center-crop", action="store_true",
                        help="resize images straight to the input size instead of resizing to 256/224 of it "
                             "and cropping the centre (the evaluation preprocessing of tfdml.data). A model "
                             "from a report folder whose job trained on whole images (no random crop) is "
                             "exported without the crop anyway.")
    parser.add_argument("--preprocess",
                        help="pixel preprocessing in the graph, for a Keras model that does not preprocess its "
                             "input itself: none, unit (x/255), symmetric (x/127.5-1) or a dotted function "
                             "name (default: none). tfdml embedders apply their own preprocessing to raw "
                             "pixels (their first layer), so the graph adds none.")
    parser.add_argument("--gallery-dir", metavar="DIR",
                        help="build the ScaNN index of these images (one sub-folder per class); files that "
                             "cannot be decoded are skipped and named. Default: the job's evaluation data "
                             "when the model sits in a 'tfdml train' report folder (embedded data set or "
                             "image folder), else no index.")
    parser.add_argument("--no-index", action="store_true", help="export the SavedModel without an index.")
    parser.set_defaults(func=run)
    return parser


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


def run(args):
    from tfdml.cli.reporting import warnings_to_stderr

    with warnings_to_stderr('export'):
        return _run(args)


def _run(args):
    import keras

    import tfdml.losses  # noqa: F401  (registers the serializable tfdml classes)
    import tfdml.models  # noqa: F401
    from tfdml import export as export_lib

    try:
        if not os.path.exists(args.model):
            raise FileNotFoundError(f"no model file at {args.model}")
        model = keras.saving.load_model(args.model, compile=False)
        training_config, metrics = report_files(args.model)
        from tfdml.data.preprocessing import evaluation_center_crop
        from tfdml.data.sources import image_folder, job_evaluation_source

        channels = export_lib.input_channels(model)
        gallery = None
        if args.gallery_dir and args.no_index:
            raise ValueError("give at most one of --gallery-dir and --no-index.")
        if args.gallery_dir:
            gallery = image_folder(args.gallery_dir, channels=channels)
        elif not args.no_index:
            gallery = job_evaluation_source(training_config, channels)
        # A model from a report folder is served with the geometry its job evaluated with.
        center_crop = not args.no_center_crop and (
            training_config is None or evaluation_center_crop(training_config.get("data", {}).get("augment", True)))
        path = export_lib.export_saved_model(
            model, base_dir=args.base_dir, name=args.name, version=args.version,
            image_size=tuple(args.image_size) if args.image_size else None, preprocess=args.preprocess,
            overwrite=args.version is not None, center_crop=center_crop,
            training_config=training_config, metrics=metrics, gallery=gallery)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError) as error:
        print(f"tfdml export: error: {error}", file=sys.stderr)
        return 2
    print(f"exported SavedModel: {path}")
    if gallery is not None:
        summary = export_lib.load_metadata(path)["index"]
        print(f"ScaNN index of {summary['size']} images of {gallery.name}, {summary['classes']} classes: "
              f"{os.path.join(path, export_lib.INDEX_DIR)}")
    return 0


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("export"))
