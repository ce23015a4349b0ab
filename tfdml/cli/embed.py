"""`tfdml embed`: embed a catalogue of images with an exported model on Apache Beam or Ray, shard and index it.

tfdml embed --model exported_models/cub --image-dir cub/images --output embeddings/cub
tfdml embed --engine ray --address head-node:6379 --actors 8 --model /shared/cub --image-dir /shared/images \
    --output /shared/embeddings
tfdml embed --model exported_models/cub --images 'photos/*/*.jpg' --output out --format parquet --evaluate
tfdml embed --model gs://b/models/cub/1 --tfrecords 'gs://b/images-*.tfrecord' --output gs://b/emb \\
    --runner DataflowRunner --project P --region europe-west1 --temp_location gs://b/tmp
"""

import contextlib
import dataclasses
import logging
import os
import sys

from tfdml.cli import positive_int, usage_error
from tfdml.embed_job import BEAM_INSTALL, ENGINES, RAY_INSTALL, EmbedJob, RayCluster

HELP = "Embed, shard and index a catalogue of images with an exported model on Apache Beam or Ray."


def register(subparsers):
    parser = subparsers.add_parser(
        "embed",
        help=HELP,
        description=HELP + " Images are decoded as tfdml.export.read_image decodes them and run through the "
        "export's serving signature with Beam's RunInference (the TensorFlow model handler), so the embeddings "
        "are the served ones. Writes sharded embedding files (id, class, embedding), one ScaNN index per shard "
        "(recall measured as on one machine), skipped.jsonl (each image that cannot be read, with the reason) and "
        "manifest.json. Runs on Beam's DirectRunner unless --runner says otherwise; any other option is one of "
        "Beam's pipeline options and goes to the runner unchanged (e.g. --direct_num_workers 2 "
        "--direct_running_mode multi_processing, --flink_master, --project, --temp_location). Needs the beam extra "
        f"({BEAM_INSTALL} in the top folder of tfdml's source). With --engine ray the same steps run on Ray Data "
        f"(the ray extra, {RAY_INSTALL}).",
    )
    groups = {}
    for field in dataclasses.fields(EmbedJob):  # the job's fields are the options (tfdml.embed_job)
        _add_job_option(parser, groups, field)
    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument(
        "--evaluate",
        action="store_true",
        help="then compute Recall@K, MAP@R and R-precision over the shards (every image queries all the others; "
        "labels are the class names) with a second pipeline, streaming over query shards; writes evaluation.json.",
    )
    evaluation.add_argument(
        "--ks", type=positive_int, nargs="+", default=[1, 2, 4, 8], help="the K values of Recall@K (default 1 2 4 8)."
    )
    parser.add_argument(
        "--engine",
        choices=list(ENGINES),
        default="beam",
        help="beam (default; --runner and Beam's options) or ray (Ray Data on the cluster at --address).",
    )
    ray_group = parser.add_argument_group("ray (with --engine ray)")
    ray_group.add_argument(
        "--address",
        help="the Ray cluster's head node, HOST:PORT (the address its ray start prints) or auto; default: a local "
        "one-node Ray started for the run. The output folder must be one every node writes.",
    )
    ray_group.add_argument(
        "--actors", type=positive_int, default=RayCluster.actors, help="model replicas (Ray actors) embedding at once."
    )
    ray_group.add_argument(
        "--actor-cpus",
        type=float,
        default=RayCluster.cpus,
        help="CPUs each actor and task asks of Ray; a fraction lets actors and tasks share a node's CPUs.",
    )
    parser.add_argument(
        "--runner",
        default="DirectRunner",
        help="Beam runner: DirectRunner, FlinkRunner, SparkRunner, DataflowRunner, ... Options this command does "
        "not know are Beam's and go to the runner unchanged.",
    )
    parser.set_defaults(func=run, beam_options=True)
    return parser


def _add_job_option(parser, groups, field):
    """The option of an `EmbedJob` field, in its argument group (made at its first field)."""
    cli, target = field.metadata["cli"], parser
    if cli["group"] is not None:
        if cli["group"] not in groups:
            groups[cli["group"]] = parser.add_argument_group(cli["group"])
        target = groups[cli["group"]]
    flag = cli["flag"] or "--" + field.name.replace("_", "-")
    if field.type is bool:
        target.add_argument(flag, dest=field.name, action="store_true", help=cli["help"])
        return
    number = {int: positive_int, float: float}.get(field.type)
    kwargs = {"type": number} if number else {}
    if cli["required"]:
        kwargs["required"] = True
    else:
        kwargs["default"] = field.default
    for key in ("metavar", "choices"):
        if cli[key] is not None:
            kwargs[key] = list(cli[key]) if key == "choices" else cli[key]
    target.add_argument(flag, dest=field.name, help=cli["help"], **kwargs)


def argument_problem(args):
    """What is wrong with the arguments that can be told without Beam or TensorFlow, or None."""
    given = [option for option in ("image_dir", "images", "tfrecords") if getattr(args, option)]
    if len(given) != 1:
        return "give exactly one of --image-dir, --images or --tfrecords."
    if args.image_dir and "://" not in args.image_dir and not os.path.isdir(args.image_dir):
        return f"--image-dir: no such folder: {args.image_dir}"
    if "://" not in args.model and not os.path.exists(args.model):
        return f"--model: no such folder: {args.model}"
    if not 0.0 < args.target_recall <= 1.0:
        return f"--target-recall must be in (0, 1], got {args.target_recall}."
    if args.evaluate and args.index_mode == "none":
        return "--evaluate searches the shard indexes: it needs an --index-mode other than none."
    if args.engine == "ray" and (args.extra or args.runner != "DirectRunner"):
        return f"--engine ray takes no Beam options: {' '.join(args.extra) or '--runner ' + args.runner}"
    ray_options = (args.address, args.actors, args.actor_cpus) != (None, RayCluster.actors, RayCluster.cpus)
    if args.engine != "ray" and ray_options:
        return "--address, --actors and --actor-cpus are options of --engine ray."
    return None


def run(args):
    problem = argument_problem(args)
    if problem:  # before Beam and TensorFlow are imported
        return usage_error("embed", problem)
    if args.engine == "ray" and RayCluster(address=args.address).on_loopback:
        # Read by Ray when imported: without it Ray rewrites 127.0.0.1 to the network address (tfdml.ray.cluster).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:  # the optional dependency: one line that says how to install it
        if args.engine == "ray":
            import tfdml.ray  # noqa: F401
        else:
            import tfdml.beam  # noqa: F401
    except ImportError as error:
        return usage_error("embed", error)
    from tfdml.cli.reporting import warnings_to_stderr

    with warnings_to_stderr("embed"):
        return _run(args)


def _engine(args):
    """`(run_embed, evaluate_output, input_problem)` of the chosen engine, its options bound."""
    if args.engine == "ray":
        from tfdml.ray import embed as ray_embed

        cluster = RayCluster(address=args.address, actors=args.actors, cpus=args.actor_cpus)

        def input_problem(job):
            return None if ray_embed.input_files(job) else f"no file matches {job.pattern}"

        return (
            lambda job, say: ray_embed.run_embed(job, cluster, say=say),
            lambda output, ks: ray_embed.evaluate_output(output, ks=ks, cluster=cluster),
            input_problem,
        )
    from tfdml.beam import evaluate_output, run_embed
    from tfdml.beam.embed import input_problem

    beam_options = [f"--runner={args.runner}", *args.extra]
    return (
        lambda job, say: run_embed(job, beam_options, say=say),
        lambda output, ks: evaluate_output(output, ks=ks, options=beam_options),
        input_problem,
    )


def _run(args):
    from tfdml import interrupts
    from tfdml.catalogue.steps import output_problem
    from tfdml.durable import storage_error
    from tfdml.locks import FolderLock

    try:
        run_embed, evaluate_output, input_problem = _engine(args)
        job = EmbedJob(**{field.name: getattr(args, field.name) for field in dataclasses.fields(EmbedJob)})
        problem = output_problem(job.output, job.overwrite) or input_problem(job)
        if problem:
            return usage_error("embed", problem)
    except (ValueError, OSError) as error:
        return usage_error("embed", error)
    lock = FolderLock(args.output, "tfdml embed", advice="wait for it to finish, or write another folder")
    with lock if "://" not in args.output else _no_lock():
        try:
            with _worker_errors_unlogged():
                manifest = run_embed(job, lambda text: print(f"tfdml embed: warning: {text}", file=sys.stderr))
        except Exception as error:  # a runner wraps a worker's error: a refused write is still said in one line
            refused = storage_error(error, args.output)
            if refused is None and not isinstance(error, (ValueError, OSError)):
                raise
            return usage_error("embed", refused or error)
        interrupts.complete(f"the embeddings in {args.output}")
        print(
            f"embedded {manifest['embedded']} images into {len(manifest['shards'])} shards in {args.output} "
            f"({manifest['skipped']} skipped: {os.path.join(args.output, 'skipped.jsonl')})"
        )
        for shard in manifest["shards"]:
            index = shard.get("index")
            recall = index and index.get("recall")
            detail = f", index {index['mode']}" if index else ""
            if recall:
                detail += f", recall@{recall['k']} {recall['measured']:.3f}"
            print(f"  {shard['file']}: {shard['rows']} rows{detail}")
        if args.evaluate:
            try:
                results = evaluate_output(args.output, args.ks)
            except ValueError as error:
                return usage_error("embed", error)
            from tfdml.cli.evaluate import format_table

            print(format_table({key: value for key, value in results.items() if key != "queries"}))
            print(f"metrics of {results['queries']} queries written to {os.path.join(args.output, 'evaluation.json')}")
    return 0


@contextlib.contextmanager
def _worker_errors_unlogged():
    """Beam logs a worker's error with its traceback before the runner raises it again: here it is said once,
    in one line (a refused write) or with its traceback (any other error, raised on)."""
    logger = logging.getLogger("apache_beam.runners.common")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


class _no_lock:
    """A URL output has no local folder to lock: the runner's own job bookkeeping guards it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    from tfdml.cli import main_for

    sys.exit(main_for("embed"))
