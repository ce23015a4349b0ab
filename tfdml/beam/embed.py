"""`tfdml embed` as an Apache Beam pipeline: images -> the export's serving signature (Beam's `RunInference`
with its TensorFlow model handler) -> sharded embedding files, one `ScannIndex` per shard. Each step is one of
`tfdml.catalogue.steps` (shared with the Ray driver, `tfdml.ray`) inside a Beam transform.

The steps (each runs on as many workers as the runner gives it):

1. read: the files of a folder tree `class/image` or of a glob (class = the parent folder's name), or the
   `tf.train.Example`s of TFRecord files (features `image`: the encoded image, optional `id` and `class`);
2. decode: `tfdml.export.read_image`'s decoder, to uint8 pixels with the export's channel count; an image
   that cannot be read or decoded goes to `skipped.jsonl` with its id and the reason (never a failed pipeline);
3. embed: `RunInference` with `TFModelHandlerTensor` running the SavedModel's `serving_default` signature,
   which resizes, crops and preprocesses in its graph: the embeddings are the served ones, by construction.
   A batch of images of different sizes is run one size at a time (the signature takes one size per call);
4. shard: items go to shard `crc32(id) % num_shards`; each shard is written (rows sorted by id, TFRecord or
   Parquet) and indexed (`ScannIndex`, recall against exact search measured as on one machine), one shard
   per worker at a time: a worker's memory holds one shard.

`embed_pipeline` returns the pipeline (not run) for a Python caller to extend or run; `run_embed` runs it
with the output-folder rules of `tfdml embed` (`tfdml.catalogue.steps.run_into_output`) and its manifest.

Example (an export and a folder of your own; `tests/beam/test_beam.py` runs the same calls on generated images):

    job = EmbedJob(model="exported_models/cub", output="embeddings/cub", image_dir="cub/images")
    manifest = run_embed(job)                                  # DirectRunner
    run_embed(job, ["--runner=FlinkRunner", "--flink_master=localhost:8081"])
"""

import json

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import KeyedModelHandler, PredictionResult, RunInference
from apache_beam.ml.inference.tensorflow_inference import TFModelHandlerTensor
from apache_beam.options.pipeline_options import PipelineOptions

from tfdml.catalogue import files as F
from tfdml.catalogue import steps
from tfdml.embed_job import EmbedJob  # noqa: F401  (tfdml.beam.EmbedJob: the job run_embed runs)

_SKIPPED = "skipped"


class SavedModelHandler(TFModelHandlerTensor):
    """Beam's TensorFlow model handler over an exported SavedModel, loaded with `tf.saved_model.load`
    (Keras 3's `load_model`, which the stock handler calls, reads `.keras` files only) and run through its
    `serving_default` signature (`serving_inference`). Elements are uint8 `[H, W, C]` images."""

    def __init__(self, version_dir, batch_size):
        super().__init__(version_dir, inference_fn=serving_inference, max_batch_size=batch_size, min_batch_size=1)
        self.version_dir = version_dir

    def load_model(self):
        return steps.ServingEmbedder(self.version_dir).model


def serving_inference(model, batch, inference_args=None, model_id=None):
    """`RunInference`'s inference function: `tfdml.catalogue.steps.serve_images` on the batch."""
    embeddings = steps.serve_images(model, batch)
    return [PredictionResult(image, vector, model_id) for image, vector in zip(batch, embeddings)]


def _skip(skipped):
    beam.metrics.Metrics.counter("tfdml.embed", "skipped").inc()
    return beam.pvalue.TaggedOutput(_SKIPPED, json.dumps(skipped.record()))


def _read_file(path):
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return f.read()


class DecodeImage(beam.DoFn):
    """`(id, class, encoded bytes or None)` -> `((id, class), uint8 pixels)` (`steps.decode_item`, files read
    through Beam's filesystems); a file or image that cannot be read or decoded -> the `skipped` output."""

    def __init__(self, channels):
        self.channels = channels

    def process(self, item):
        item_id, name, data = item
        try:
            pixels = steps.decode_item(item_id, data, self.channels, read=_read_file)
        except steps.Skipped as skipped:
            yield _skip(skipped)
            return
        beam.metrics.Metrics.counter("tfdml.embed", "decoded").inc()
        yield (item_id, name), pixels


def parse_example(record):
    """`steps.parse_example`, a damaged record to the `skipped` output."""
    try:
        yield steps.parse_example(record)
    except steps.Skipped as skipped:
        yield _skip(skipped)


class WriteShard(beam.DoFn):
    """`(shard, [(id, class, embedding)])` -> `steps.write_shard` under `output`; yields the shard's
    `shards.jsonl` line."""

    def __init__(self, output, job):
        self.output, self.job = output, job

    def process(self, grouped):
        shard, items = grouped
        yield json.dumps(steps.write_shard(self.output, shard, list(items), self.job))


def read_items(pipeline, job):
    """The pipeline's `(id, class, bytes or None)` items of the job's input."""
    if job.tfrecords:
        return (
            pipeline
            | "ReadTFRecords" >> beam.io.ReadFromTFRecord(job.tfrecords)
            | "ParseExamples" >> beam.FlatMap(parse_example).with_outputs(_SKIPPED, main="items")
        )
    items = (
        pipeline
        | "MatchFiles" >> beam.io.fileio.MatchFiles(job.pattern)
        | "ImageFiles" >> beam.Filter(lambda match: steps.is_image_file(match.path))
        | "FileItems" >> beam.Map(lambda match: steps.file_item(match.path))
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
    version_dir = steps.model_version_dir(job.model)
    channels = steps.model_channels(version_dir)
    read = read_items(pipeline, job)
    decoded = read["items"] | "Decode" >> beam.ParDo(DecodeImage(channels)).with_outputs(_SKIPPED, main="images")
    skipped = [decoded[_SKIPPED]] + ([read[_SKIPPED]] if job.tfrecords else [])
    handler = KeyedModelHandler(SavedModelHandler(version_dir, job.batch_size))
    num_shards = job.num_shards
    (
        decoded["images"]
        | "Embed" >> RunInference(handler)
        | "Rows" >> beam.Map(lambda keyed: (keyed[0][0], keyed[0][1], np.asarray(keyed[1].inference, np.float32)))
        | "Shard" >> beam.Map(lambda row: (steps.shard_of(row[0], num_shards), row))
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


def run_embed(job, options=None, say=print):
    """Runs `embed_pipeline(job, options)` with the output-folder rules of `steps.run_into_output` (a local
    folder written in a staging folder renamed into place when complete) and writes `manifest.json`; returns
    the manifest (a dict). `FileExistsError` for an existing output without `overwrite`."""

    def write(folder):
        embed_pipeline(job, options, output=folder).run().wait_until_finish()

    return steps.run_into_output(job, write, engine="beam", say=say)
