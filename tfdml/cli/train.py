"""`tfdml train`: train, evaluate, export and report from a configuration.

tfdml train                                   # the embedded default: glyphs, no network needed
tfdml train --image-dir photos/               # your own images: one sub-folder per class
tfdml train --config configs/rll_lmh_cub.yaml --set data.data_dir=/data/tfds
tfdml train --set loss.name=triplet --set loss.params.mining=semi_hard --epochs 4
tfdml train --ray head-node:6379 --workers 2 --report-dir /shared/reports/glyphs   # on a Ray cluster
"""

import json
import os
import sys

from tfdml.cli.reporting import warnings_to_stderr
from tfdml.config import ConfigError, given_keys, load_config, parse_override
from tfdml.config.descriptions import commented_yaml
from tfdml.embed_job import on_loopback

HELP = "Train an embedder from a YAML configuration, evaluate it with ScaNN, export it and write a report."


def register(subparsers):
    parser = subparsers.add_parser(
        "train",
        help=HELP,
        description=HELP + " With no options it runs the embedded default job: a small-CNN embedder trained "
        "with Ranked List Loss on half of the font-rendered characters of tfdml.data.glyphs and evaluated on "
        "the unseen half, exported to exported_models/glyphs_rll/<version>/ with its ScaNN index, and a "
        "report in reports/glyphs_rll/. A run stopped with Ctrl-C or SIGTERM (or killed) resumes from its checkpoints "
        "when started again with the same report directory and configuration, also when it stopped after "
        "training but before its report was complete. A report directory another run is writing is refused. "
        "Configuration errors exit with status 2.",
    )
    parser.add_argument(
        "--config",
        metavar="YAML",
        help="configuration file (see configs/); its values override the built-in defaults printed by --print-config.",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one configuration value, e.g. --set optimizer.learning_rate=0.01 or "
        "--set model.levels=[H]; values are parsed as YAML; repeatable.",
    )
    parser.add_argument(
        "--image-dir",
        metavar="DIR",
        help="train on your own images: DIR/<class name>/<image files>. Without "
        "--eval-image-dir the classes are split in halves by sorted folder name: the "
        "model trains on the first half and is evaluated on the unseen second half. "
        "The job is named after DIR. Without --config it trains new L, M and H heads on EfficientNet-Lite0's "
        "ImageNet features (installed with tfdml) at 160 px: first on the features of the training images computed "
        "once, then for one pass over augmented images; --set model.freeze_backbone=false --epochs 3 "
        "fine-tunes the whole network, --set model.backbone=small_cnn trains the small CNN from scratch.",
    )
    parser.add_argument(
        "--eval-image-dir",
        metavar="DIR",
        help="evaluation images laid out like --image-dir (classes unseen in training).",
    )
    _add_run_options(parser)
    cluster = parser.add_argument_group("on a Ray cluster (the ray extra)")
    cluster.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the job on the Ray cluster at ADDRESS (HOST:PORT, the address the head node's ray start "
        "prints, or auto) with Ray Train: --workers workers under MultiWorkerMirroredStrategy, worker 0 "
        "checkpointing, evaluating, exporting and reporting. The report, checkpoint and export folders must be "
        "storage every node writes.",
    )
    cluster.add_argument("--workers", type=int, default=2, help="Ray Train workers with --ray (default 2).")
    cluster.add_argument(
        "--worker-cpus", type=float, default=1.0, help="CPUs each worker asks of Ray with --ray (default 1)."
    )
    parser.set_defaults(func=run)
    return parser


def _add_run_options(parser):
    group = parser.add_argument_group("training run, outputs and resuming")
    _shortcut(group, "epochs", type=int)
    _shortcut(group, "steps_per_epoch", type=int)
    _shortcut(group, "seed", type=int, note="same seed, same run")
    _shortcut(
        group,
        "report_dir",
        metavar="DIR",
        help="where the report and checkpoints go (default: reports/<name>, or reports/<name>-2, -3, ... when "
        "it holds the report of an earlier run, which is kept).",
    )
    group.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a finished run's report in the report directory (without it, the report is kept: "
        "a given --report-dir holding one is refused, the default one moves on to reports/<name>-2).",
    )
    group.add_argument(
        "--restart",
        action="store_true",
        help="discard an unfinished run's checkpoints in the report directory and train from "
        "epoch 1 (without it, such a run resumes, and a changed configuration is refused).",
    )
    _shortcut(
        group, "export_dir", metavar="DIR", help="TF Serving base directory of the export (default: exported_models)."
    )
    _shortcut(
        group,
        "export_version",
        type=int,
        help="version directory to write (default: the next free integer); an existing version is replaced.",
    )
    group.add_argument("--no-export", action="store_true", help="skip the SavedModel and index export.")
    group.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration as YAML, each key's meaning in a comment above it, and exit "
        "without training.",
    )
    group.add_argument(
        "--quiet",
        action="store_true",
        help="one line per epoch instead of progress bars (the default when the output is not a terminal).",
    )


# The options that stand for one configuration key each (option's dest -> key), declared once: the option, its
# help ("shortcut for --set KEY=N" unless it says more), the override it makes and the errors that name it.
_SHORTCUTS = {
    "epochs": "training.epochs",
    "steps_per_epoch": "training.steps_per_epoch",
    "seed": "seed",
    "report_dir": "report.dir",
    "export_dir": "export.base_dir",
    "export_version": "export.version",
}


def _shortcut(group, dest, metavar="N", help=None, note=None, **kwargs):
    """Adds `--<dest>`, the option that stands for the configuration key `_SHORTCUTS[dest]`."""
    text = f"shortcut for --set {_SHORTCUTS[dest]}={metavar}" + (f" ({note})." if note else ".")
    group.add_argument("--" + dest.replace("_", "-"), metavar=metavar, help=help or text, **kwargs)


# What `--image-dir` trains unless `--set` says otherwise: EfficientNet-Lite0 from its ImageNet weights (installed
# with tfdml, no download) at 160 px, the best of 96-224 px for frozen features; its backbone frozen and new L, M
# and H heads trained on the backbone's features of the training images, computed once, then for one pass over
# the augmented images. The pretrained benchmark measures it against frozen features, raw pixels and fine-tuning the
# whole network, which did worse on a CPU's budget.
FOLDER_MODEL = (
    ("model.backbone", "efficientnet_lite0"),
    ("model.weights", "imagenet"),
    ("model.widths", None),
    ("model.type", "multilevel"),  # L, M and H heads: the ends of stages 5 and 7 and the head
    ("model.embedding_dim", 128),
    ("model.freeze_backbone", True),
)
FOLDER_TRAINING = (
    ("data.image_size", 160),
    ("data.augment", True),
    ("optimizer.learning_rate", 1e-4),
    ("optimizer.head_lr_multiplier", 10.0),
    ("training.epochs", 1),
    ("training.steps_per_epoch", None),
    ("training.head_warmup_steps", 300),
)


def _folder_job(args):
    """Overrides that `--image-dir` / `--eval-image-dir` stand for (before --set, which may change them).

    The pretrained model and its training settings apply without `--config` (a configuration file says how
    to train); the pretrained backbone's keys are left out when `--set` names another backbone, whose own
    defaults (no ImageNet weights) apply."""
    if args.image_dir is None:
        if args.eval_image_dir is not None:
            raise ConfigError("--eval-image-dir needs --image-dir (the training images)")
        return []
    name = os.path.basename(os.path.normpath(os.path.abspath(args.image_dir))) or "images"
    own_backbone = any(
        key == "model.backbone" for item in args.overrides for key, _ in _leaves(*_dotted(parse_override(item)))
    )
    defaults = () if args.config else (*(() if own_backbone else FOLDER_MODEL), *FOLDER_TRAINING)
    return [
        ("data.source", "folder"),
        ("data.path", args.image_dir),
        ("data.eval_path", args.eval_image_dir),
        ("name", name),
        ("description", f"images of {args.image_dir}"),
        *defaults,
    ]


# Options that stand for configuration keys: an error about the key names the option when it was given.
_OPTION_OF = {"data.path": "image_dir", "data.eval_path": "eval_image_dir", **{k: d for d, k in _SHORTCUTS.items()}}


def _overrides(args):
    shortcuts = {key: getattr(args, dest) for dest, key in _SHORTCUTS.items()}
    shortcuts["export.enabled"] = False if args.no_export else None
    shortcuts = {key: value for key, value in shortcuts.items() if value is not None}
    _check_agreement(args.overrides, shortcuts)
    return _folder_job(args) + list(args.overrides) + list(shortcuts.items())


def _check_agreement(sets, shortcuts):
    """A `ConfigError` when a `--set` gives a key that an option also gives, another value: the option would
    replace it without a word (and a wrong value would never be checked)."""
    for text in sets:
        for key, given in _leaves(*_dotted(parse_override(text))):
            if key in shortcuts and given != shortcuts[key]:
                option = (
                    "--no-export"
                    if key == "export.enabled"
                    else f"--{_OPTION_OF[key].replace('_', '-')} {shortcuts[key]}"
                )
                raise ConfigError(f"--set {text.strip()} and {option} disagree: give {key} once")


def _dotted(override):
    """`(dotted key, value)` of a parsed `--set`."""
    keys, value = override
    return ".".join(keys), value


def _leaves(key, value):
    """`(dotted key, value)` of every value a `--set` gives (`training={epochs: 3}` gives `training.epochs`)."""
    if isinstance(value, dict) and value:
        return [leaf for name, item in value.items() for leaf in _leaves(f"{key}.{name}", item)]
    return [(key, value)]


def resolve(args):
    """The validated `Config` of the command line (defaults <- --config <- --image-dir <- --set <- shortcuts)."""
    return load_config(args.config, _overrides(args))


def _config_error(error, args):
    print(f"tfdml train: error: {_with_option(str(error), args)}", file=sys.stderr)
    return 2


def _with_option(message, args):
    """`report.dir: ...` -> `report.dir (--report-dir): ...` when the key's option was given."""
    key, colon, rest = message.partition(":")
    if not colon or getattr(args, _OPTION_OF.get(key, "-"), None) is None:
        return message
    return f"{key} (--{_OPTION_OF[key].replace('_', '-')}):{rest}"


def _print_summary(summary):
    model, raw = summary["model"], summary["raw_pixels"]
    print(f"\n{'metric':<14}{'model':>10}{'raw pixels':>12}")
    for key in model:
        print(f"{key:<14}{model[key]:>10.4f}{raw.get(key, float('nan')):>12.4f}")
    epochs, this_run = len(summary["history"].get("loss", [])), summary["epochs_this_run"]
    resumed = (
        ""
        if this_run == epochs
        else (
            f"; {summary['train_seconds_this_run']:.1f} s of it in this run, epochs {epochs - this_run + 1}-{epochs}"
            if this_run
            else "; all of it in earlier runs"
        )
    )
    print(f"\ntraining: {summary['train_seconds']:.1f} s for {epochs} epoch{'s' if epochs != 1 else ''}{resumed}")
    print(
        f"this process: {summary['wall_seconds']:.1f} s since it started (Python and TensorFlow imports "
        f"included), {summary['job_seconds']:.1f} s of it in the job (from the configuration to the report)"
    )
    if "export_dir" in summary:
        print(f"exported SavedModel: {summary['export_dir']}")
    print(f"report: {os.path.join(summary['report_dir'], 'metrics.json')}")
    print(json.dumps({"recall@1": model.get("recall@1"), "map@r": model.get("map@r")}))


def _ray_problem(args):
    """What is wrong with the Ray options, or None (told before Ray and TensorFlow are imported)."""
    if not args.ray:
        return (
            "--workers and --worker-cpus are options of --ray."
            if (args.workers, args.worker_cpus) != (2, 1.0)
            else None
        )
    if args.workers < 1:
        return f"--workers must be a positive integer, got {args.workers}."
    if not args.worker_cpus > 0:
        return f"--worker-cpus must be positive, got {args.worker_cpus}."
    if args.restart:
        return "--restart with --ray: delete the report folder's checkpoints, or give another --report-dir."
    return None


def _on_ray(args, config, verbose, fit):
    """The job on the Ray cluster of `--ray` (tfdml.ray.train), the chief's summary."""
    from tfdml import pipeline
    from tfdml.ray import RayTraining, WorkerLost, run_job

    training = RayTraining(address=args.ray, workers=args.workers, cpus=args.worker_cpus)
    try:
        return run_job(config, training, verbose=verbose, fit_classes_per_batch=fit, overwrite=args.overwrite)
    except WorkerLost as error:  # one line: what failed and how to resume
        raise pipeline.JobError(str(error)) from None


def run(args):
    problem = _ray_problem(args)
    if problem:
        print(f"tfdml train: error: {problem}", file=sys.stderr)
        return 2
    if args.ray:
        if on_loopback(args.ray):
            # Read by Ray when imported: without it Ray rewrites 127.0.0.1 to the network address.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            import tfdml.ray  # noqa: F401  (the optional dependency: one line that says how to install it)
        except ImportError as error:
            print(f"tfdml train: error: {error}", file=sys.stderr)
            return 2
    try:
        config = resolve(args)
    except ConfigError as error:  # the keys, types and paths are checked before TensorFlow is imported
        return _config_error(error, args)
    # Imported once the configuration is valid: the job's modules import TensorFlow (seconds).
    from tfdml import pipeline

    try:
        if args.print_config:
            print(commented_yaml(pipeline.resolve_paths(config)), end="")
            return 0
        # Progress bars only on a terminal: redirected logs get one line per epoch.
        verbose = 2 if args.quiet or not sys.stdout.isatty() else 1
        # A data set with fewer classes than the default batch's trains on all of them, unless the user
        # chose data.classes_per_batch.
        fit = "data.classes_per_batch" not in given_keys(args.config, _overrides(args))
        with warnings_to_stderr("train"):  # e.g. the image files an image folder skips, named
            if args.ray:
                summary = _on_ray(args, config, verbose, fit)
            else:
                summary = pipeline.run(
                    config, verbose=verbose, restart=args.restart, fit_classes_per_batch=fit, overwrite=args.overwrite
                )
    except ConfigError as error:  # found by the job: e.g. a batch the data cannot fill
        return _config_error(error, args)
    except pipeline.JobError as error:
        print(f"tfdml train: error: {error}", file=sys.stderr)
        return 2 if error.storage else 1
    if not summary.get("chief", True):
        print(f"worker done in {summary['train_seconds']:.1f} s (the chief evaluates, exports and reports)")
        return 0
    _print_summary(summary)
    return 0


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("train"))
