"""`tfdml embed` as an Apache Beam pipeline: images -> the export's serving signature (Beam's `RunInference`
with its TensorFlow model handler) -> sharded embedding files, one `ScannIndex` per shard.

The steps (each runs on as many workers as the runner gives it):

1. read: the files of a folder tree `class/image` or of a glob (class = the parent folder's name), or the
   `tf.train.Example`s of TFRecord files (features `image`: the encoded image, optional `id` and `class`);
2. decode: `tfdml.export.read_image`'s decoder, to uint8 pixels with the export's channel count; an image
   that cannot be read or decoded goes to `skipped.jsonl` with its id and the reason (never a failed pipeline);
3. embed: `RunInference` with `TFModelHandlerTensor` running the SavedModel's `serving_default` signature,
   which resizes, crops and preprocesses in its graph: the embeddings are the served ones, by construction.
   A batch of images of different sizes is run one size at a time (the signature takes one size per call);
4. shard: items go to shard `crc32(id) % num_shards`; each shard is written (rows sorted by id, TFRecord or
   Parquet, `tfdml.beam.files`) and indexed (`ScannIndex`, whose recall against exact search is measured as
   on one machine), one shard per worker at a time: a worker's memory holds one shard.

`embed_pipeline` returns the pipeline (not run) for a Python caller to extend or run; `run_embed` runs it
with the output-folder rules of `tfdml embed` (refuse an existing folder unless `overwrite`, write a local
folder in a staging folder renamed into place at the end) and writes `manifest.json`.

Example (an export and a folder of your own; `tests/test_beam.py` runs the same calls on generated images):

    job = EmbedJob(model="exported_models/cub", output="embeddings/cub", image_dir="cub/images")
    manifest = run_embed(job)                                  # DirectRunner
    run_embed(job, ["--runner=FlinkRunner", "--flink_master=localhost:8081"])
"""

import dataclasses
import datetime
import json
import os
import shutil
import tempfile
import zlib
from collections import Counter

import apache_beam as beam
import numpy as np
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import KeyedModelHandler, PredictionResult, RunInference
from apache_beam.ml.inference.tensorflow_inference import TFModelHandlerTensor
from apache_beam.options.pipeline_options import PipelineOptions

from tfdml.beam import files as F
from tfdml.data.sources import IMAGE_EXTENSIONS, ImageReadError, decode_image_bytes
from tfdml.embed_job import EmbedJob  # noqa: F401  (tfdml.beam.EmbedJob: the job run_embed runs)
from tfdml.export import EMBEDDING_OUTPUT, IMAGE_INPUT, METADATA_FILE, SERVING_SIGNATURE, resolve_export_dir
from tfdml.retrieval.index import ScannIndex, replace_directory

_SKIPPED = "skipped"


def model_version_dir(model):
    """The version folder of an export (local: `<base>/<name>` resolves to its latest version; a URL must
    name the version folder itself)."""
    return model if "://" in model else os.path.abspath(resolve_export_dir(model))


def model_metadata(version_dir):
    """`tfdml_metadata.json` of an export (any filesystem TensorFlow reads)."""
    return F.read_json(F.join(version_dir, METADATA_FILE))


class SavedModelHandler(TFModelHandlerTensor):
    """Beam's TensorFlow model handler over an exported SavedModel, loaded with `tf.saved_model.load`
    (Keras 3's `load_model`, which the stock handler calls, reads `.keras` files only) and run through its
    `serving_default` signature (`serving_inference`). Elements are uint8 `[H, W, C]` images."""

    def __init__(self, version_dir, batch_size):
        super().__init__(version_dir, inference_fn=serving_inference, max_batch_size=batch_size, min_batch_size=1)
        self.version_dir = version_dir

    def load_model(self):
        return tf.saved_model.load(self.version_dir)


def serving_inference(model, batch, inference_args=None, model_id=None):
    """`RunInference`'s inference function: the `embedding` output of the `serving_default` signature for
    each image of `batch`, images of one size per call."""
    serve = model.signatures[SERVING_SIGNATURE]
    by_shape = {}
    for position, image in enumerate(batch):
        by_shape.setdefault(np.shape(image), []).append(position)
    embeddings = [None] * len(batch)
    for positions in by_shape.values():
        images = tf.constant(np.stack([batch[i] for i in positions]))
        for position, vector in zip(positions, serve(**{IMAGE_INPUT: images})[EMBEDDING_OUTPUT].numpy()):
            embeddings[position] = vector
    return [PredictionResult(image, vector, model_id) for image, vector in zip(batch, embeddings)]


def _skip(item_id, reason):
    beam.metrics.Metrics.counter("tfdml.embed", "skipped").inc()
    return beam.pvalue.TaggedOutput(_SKIPPED, json.dumps({"id": item_id, "reason": reason}))


class DecodeImage(beam.DoFn):
    """`(id, class, encoded bytes or None)` -> `((id, class), uint8 pixels)`; a file (`None`: read the id as
    a path) or image that cannot be read or decoded -> the `skipped` output, with its reason."""

    def __init__(self, channels):
        self.channels = channels

    def process(self, item):
        item_id, name, data = item
        if data is None:
            try:
                with FileSystems.open(item_id, compression_type="uncompressed") as f:
                    data = f.read()
            except Exception as error:  # any filesystem's read error: skipped and named, the pipeline goes on
                yield _skip(item_id, f"cannot be read: {type(error).__name__}: {error}")
                return
        try:
            pixels = decode_image_bytes(data, item_id, self.channels)
        except ImageReadError as error:
            yield _skip(item_id, str(error)[len(item_id) + 2 :])
            return
        beam.metrics.Metrics.counter("tfdml.embed", "decoded").inc()
        yield (item_id, name), pixels


def parse_example(record):
    """A TFRecord record -> `(id, class, image bytes)`, or the `skipped` output when it is no
    `tf.train.Example` with an `image` bytes feature. Without `id` the id is the image's SHA-1."""
    import hashlib

    try:
        feature = tf.train.Example.FromString(record).features.feature
        data = feature["image"].bytes_list.value[0]
    except Exception as error:  # a damaged record or another schema: skipped and named
        digest = hashlib.sha1(record).hexdigest()
        yield _skip(f"sha1:{digest}", f"not a tf.train.Example with an 'image' bytes feature ({type(error).__name__})")
        return

    def text(key):
        values = feature[key].bytes_list.value if key in feature else []
        return values[0].decode() if values else None

    yield text("id") or f"sha1:{hashlib.sha1(data).hexdigest()}", text("class") or "", data


def file_item(path):
    """An image file's `(id, class, None)`: the id is the path, the class its parent folder's name."""
    return path, os.path.basename(os.path.dirname(path.rstrip("/"))), None


def shard_of(item_id, num_shards):
    """The shard of an id (CRC-32: the same on every worker and every run)."""
    return zlib.crc32(item_id.encode()) % num_shards


class WriteShard(beam.DoFn):
    """`(shard, [(id, class, embedding)])` -> its embedding file and `ScannIndex` under `output`; yields the
    shard's `shards.jsonl` line (rows, class counts, index mode and measured recall)."""

    def __init__(self, output, job):
        self.output, self.job = output, job

    def process(self, grouped):
        shard, items = grouped
        items = sorted(items, key=lambda item: item[0])
        ids = [item[0] for item in items]
        classes = [item[1] for item in items]
        embeddings = np.stack([item[2] for item in items]).astype(np.float32)
        job = self.job
        path = F.write_shard(
            F.shard_file(self.output, shard, job.num_shards, job.file_format), ids, classes, embeddings, job.file_format
        )
        record = {
            "shard": int(shard),
            "file": os.path.basename(path),
            "rows": len(ids),
            "dim": int(embeddings.shape[1]),
            "classes": dict(Counter(classes)),
        }
        if job.index_mode != "none":
            index = ScannIndex(
                embeddings,
                ids=np.asarray(ids, dtype=str),
                labels=np.asarray(classes, dtype=str),
                distance="dot_product",  # the export's embeddings are L2-normalised
                mode=job.index_mode,
                num_neighbors=min(job.num_neighbors, len(ids)),
                target_recall=job.target_recall,
            )
            save_index(index, F.shard_index_dir(self.output, shard))
            record["index"] = {"dir": os.path.join(F.INDEXES_DIR, f"shard-{shard:05d}"), "mode": index.mode}
            if index.recall:
                record["index"]["recall"] = index.recall
        yield json.dumps(record)


def save_index(index, target):
    """`ScannIndex.save` to a local folder, or saved locally and copied to a URL (`tf.io.gfile`)."""
    if "://" not in target:
        return index.save(target)
    with tempfile.TemporaryDirectory() as local:
        index.save(os.path.join(local, "index"))
        for folder, _, names in os.walk(os.path.join(local, "index")):
            relative = os.path.relpath(folder, os.path.join(local, "index"))
            destination = target if relative == "." else F.join(target, *relative.split(os.sep))
            tf.io.gfile.makedirs(destination)
            for name in names:
                tf.io.gfile.copy(os.path.join(folder, name), F.join(destination, name), overwrite=True)
    return target


def read_items(pipeline, job):
    """The pipeline's `(id, class, bytes or None)` items of the job's input."""
    if job.tfrecords:
        return (
            pipeline
            | "ReadTFRecords" >> beam.io.ReadFromTFRecord(job.tfrecords)
            | "ParseExamples" >> beam.FlatMap(parse_example).with_outputs(_SKIPPED, main="items")
        )
    extensions = tuple(IMAGE_EXTENSIONS)
    items = (
        pipeline
        | "MatchFiles" >> beam.io.fileio.MatchFiles(job.pattern)
        | "ImageFiles" >> beam.Filter(lambda match: match.path.lower().endswith(extensions))
        | "FileItems" >> beam.Map(lambda match: file_item(match.path))
    )
    return {"items": items}


def embed_pipeline(job, options=None, output=None, pipeline=None):
    """The Beam pipeline of `job` (see the module docstring), not yet run.

    Args:
      job: an `EmbedJob`.
      options: `apache_beam.options.pipeline_options.PipelineOptions` or a list of Beam's command-line
        options (`["--runner=FlinkRunner", ...]`); default: the DirectRunner.
      output: the folder written (default `job.output`; `run_embed` passes a staging folder).
      pipeline: a pipeline to add the steps to (default: a new one with `options`).

    Returns the `beam.Pipeline`; `pipeline.run().wait_until_finish()` runs it.
    """
    output = output or job.output
    if pipeline is None:
        if not isinstance(options, PipelineOptions):
            options = PipelineOptions(list(options or []))
        pipeline = beam.Pipeline(options=options)
    version_dir = model_version_dir(job.model)
    channels = int(model_metadata(version_dir)["input"]["channels"])
    read = read_items(pipeline, job)
    decoded = read["items"] | "Decode" >> beam.ParDo(DecodeImage(channels)).with_outputs(_SKIPPED, main="images")
    skipped = [decoded[_SKIPPED]] + ([read[_SKIPPED]] if job.tfrecords else [])
    handler = KeyedModelHandler(SavedModelHandler(version_dir, job.batch_size))
    num_shards = job.num_shards
    (
        decoded["images"]
        | "Embed" >> RunInference(handler)
        | "Rows" >> beam.Map(lambda keyed: (keyed[0][0], keyed[0][1], np.asarray(keyed[1].inference, np.float32)))
        | "Shard" >> beam.Map(lambda row: (shard_of(row[0], num_shards), row))
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShard(output, job))
        | "ShardRecords" >> beam.io.WriteToText(F.join(output, F.SHARDS_FILE), num_shards=1, shard_name_template="")
    )
    (
        skipped
        | "AllSkipped" >> beam.Flatten()
        | "SkippedRecords" >> beam.io.WriteToText(F.join(output, F.SKIPPED_FILE), num_shards=1, shard_name_template="")
    )
    return pipeline


def input_problem(job):
    """`"no file matches ..."` when the job's input matches no file (one file is looked up), else None."""
    if not FileSystems.match([job.pattern], limits=[1])[0].metadata_list:
        return f"no file matches {job.pattern}"
    return None


def output_problem(output, overwrite):
    """Why `output` cannot be written (an existing, non-empty folder without `overwrite`), or None."""
    if tf.io.gfile.exists(output):
        if not tf.io.gfile.isdir(output):
            return f"{output} exists and is not a folder."
        if tf.io.gfile.listdir(output) and not overwrite:
            return f"{output} already holds files (an earlier run?); pass --overwrite to replace it, or another folder."
    return None


def run_embed(job, options=None, say=print):
    """Runs `embed_pipeline(job, options)` and writes `manifest.json`; returns the manifest (a dict).

    A local output is written in a staging folder beside it and renamed into place when complete (an
    existing one, with `overwrite`, is replaced only then, so a failed run loses nothing); a URL output is
    written in place. `FileExistsError` for an existing output without `overwrite`.
    """
    problem = output_problem(job.output, job.overwrite)
    if problem:
        raise FileExistsError(problem)
    local = "://" not in job.output
    if local:
        target = os.path.abspath(job.output)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".tmp-embed-{os.path.basename(target)}-", dir=os.path.dirname(target))
    else:
        if tf.io.gfile.exists(job.output):
            tf.io.gfile.rmtree(job.output)
        target = staging = job.output
    try:
        started = datetime.datetime.now(datetime.timezone.utc)
        pipeline = embed_pipeline(job, options, output=staging)
        pipeline.run().wait_until_finish()
        manifest = _manifest(job, staging, started)
        F.write_json(F.join(staging, F.MANIFEST_FILE), manifest)
        if local:
            replace_directory(staging, target)
    finally:
        if local:
            shutil.rmtree(staging, ignore_errors=True)
    skipped = manifest["skipped"]
    if skipped:
        named = "; ".join(
            f"{item['id']} ({item['reason']})" for item in F.read_jsonl(F.join(target, F.SKIPPED_FILE))[:20]
        )
        say(f"skipped {skipped} image(s) that cannot be read or decoded (listed in {F.SKIPPED_FILE}): {named}")
    return manifest


def _manifest(job, folder, started):
    shards = F.shard_records(folder)
    return {
        "format": "tfdml.embed/1",
        "model": model_version_dir(job.model),
        "model_name": model_metadata(model_version_dir(job.model)).get("name"),
        "input": job.pattern,
        "input_kind": "tfrecords" if job.tfrecords else "images",
        "embedded": sum(shard["rows"] for shard in shards),
        "skipped": len(F.read_jsonl(F.join(folder, F.SKIPPED_FILE))),
        "dim": shards[0]["dim"] if shards else None,
        "file_format": job.file_format,
        "num_shards": job.num_shards,
        "shards": shards,
        "job": dataclasses.asdict(job),
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
