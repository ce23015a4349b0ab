"""`tfdml export`: a saved Keras embedder (.keras) -> TF Serving SavedModel (+ ScaNN index).

    tfdml export --model reports/digits_rll/model.keras --name digits_rll
    tfdml export --model cub.keras --name cub --gallery-dir /data/cub_test --version 3
"""

import argparse
import os

HELP = "Export a trained Keras embedder as a TF Serving SavedModel, optionally with a ScaNN gallery index."


def register(subparsers):
    parser = subparsers.add_parser(
        "export", help=HELP,
        description=HELP + " Writes <base-dir>/<name>/<version>/ atomically (serving_default takes uint8 "
        "images of any size; embed_preprocessed takes preprocessed float tensors) and, with --gallery-dir, "
        "<base-dir>/<name>/index/. Serve it with: tensorflow_model_server --rest_api_port=8501 "
        "--model_name=<name> --model_base_path=$PWD/<base-dir>/<name>",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", required=True, metavar="KERAS_FILE",
                        help="a model saved with model.save('....keras') (tfdml train writes "
                             "<report-dir>/model.keras).")
    parser.add_argument("--name", required=True, help="model name: the directory under --base-dir that TF "
                                                      "Serving's --model_base_path points to.")
    parser.add_argument("--base-dir", default="exported_models", help="TF Serving base directory.")
    parser.add_argument("--version", type=int, help="version number (default: next free integer); an existing "
                                                    "version is replaced.")
    parser.add_argument("--image-size", type=int, nargs=2, metavar=("HEIGHT", "WIDTH"),
                        help="input size the graph resizes to (default: the model's input size).")
    parser.add_argument("--preprocess",
                        help="pixel preprocessing in the graph: none, unit (x/255), symmetric (x/127.5-1) or "
                             "a dotted function name (default: what the model declares; unit for a model "
                             "that declares none).")
    parser.add_argument("--gallery-dir", metavar="DIR",
                        help="also build the ScaNN index of these images (one sub-folder per class).")
    parser.set_defaults(func=run)
    return parser


def run(args):
    import keras

    import tfdml.losses  # noqa: F401  (registers the serializable tfdml classes)
    import tfdml.models  # noqa: F401
    from tfdml import export as export_lib

    if not os.path.exists(args.model):
        raise SystemExit(f"tfdml export: no model file at {args.model}")
    model = keras.saving.load_model(args.model, compile=False)
    preprocess = args.preprocess
    if preprocess is None and getattr(model, "preprocessing", "absent") is None:
        preprocess = "unit"  # tfdml models without backbone preprocessing are trained on [0, 1] pixels
    path = export_lib.export_saved_model(
        model, base_dir=args.base_dir, name=args.name, version=args.version,
        image_size=tuple(args.image_size) if args.image_size else None, preprocess=preprocess,
        overwrite=args.version is not None)
    print(f"exported SavedModel: {path}")
    if args.gallery_dir:
        from tfdml.data.sources import list_class_folders

        files, labels, _ = list_class_folders(args.gallery_dir)
        export_lib.export_index(files, base_dir=args.base_dir, name=args.name, labels=labels)
        print(f"ScaNN index of {len(files)} images: {os.path.join(args.base_dir, args.name, 'index')}")
    return 0

