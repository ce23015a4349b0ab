"""Recall@K, MAP@R and R-precision of a `tfdml embed` output, as a Beam pipeline over its query shards.

Same-set protocol (as `tfdml.retrieval.evaluate` without query embeddings): every embedded image queries all
the others, its own item excluded; labels are the class names. Each element of the pipeline is one query
shard: a worker reads that shard's embeddings, searches every shard's index in turn (`ShardedIndex`: one
index loaded at a time) and merges the per-shard top-k lists, then turns the merged lists into metric sums
(`tfdml.retrieval.sharded.retrieval_sums`; the step is `tfdml.catalogue.steps.query_shard_sums`, shared with
the Ray driver); the sums are added over query shards and divided once. A worker
holds one query shard, one index and the `[rows, k]` lists, whatever the catalogue's size. With brute-force
shard indexes (`--index-mode exact`, or `auto` below 20,000 items a shard) the metrics equal `evaluate`'s on
the concatenated embeddings.

Example (the output folder of a `tfdml embed` run; `tests/beam/test_beam.py` runs it on generated images):

    evaluate_output("embeddings/cub", ks=(1, 2, 4, 8))
    # {'map@r': 0.21, 'r_precision': 0.32, 'recall@1': 0.61, ...}
"""

import functools

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from tfdml.catalogue import files as F
from tfdml.catalogue.steps import evaluation_inputs, gallery_counts, query_shard_sums  # noqa: F401  (re-exported)
from tfdml.retrieval.sharded import RETRIEVAL_METRICS, add_sums, metrics_from_sums


def evaluation_pipeline(output, ks=(1, 2, 4, 8), metrics=RETRIEVAL_METRICS, options=None, write_to=None):
    """The Beam pipeline (not run) that evaluates `output` and writes the metrics as JSON to `write_to`
    (default `<output>/evaluation.json`).

    Args:
      output: a folder written by `tfdml embed` (`run_embed`), with shard indexes.
      ks: the K of Recall@K.
      metrics: any of `"recall"`, `"map@r"`, `"r_precision"`.
      options: `PipelineOptions` or a list of Beam's command-line options (default: the DirectRunner).
      write_to: the JSON file written.
    """
    ks, metrics = tuple(int(k) for k in ks), tuple(metrics)
    records, counts = evaluation_inputs(output, metrics)
    write_to = write_to or F.join(output, F.EVALUATION_FILE)
    if not isinstance(options, PipelineOptions):
        options = PipelineOptions(list(options or []))
    pipeline = beam.Pipeline(options=options)
    sums = functools.partial(query_shard_sums, output=output, records=records, counts=counts, ks=ks, metrics=metrics)
    (
        pipeline
        | "QueryShards" >> beam.Create(records)
        | "SearchAndScore" >> beam.Map(sums)
        | "AddSums" >> beam.CombineGlobally(lambda parts: functools.reduce(add_sums, parts, {}))
        | "Metrics"
        >> beam.Map(lambda total: F.write_json(write_to, {**metrics_from_sums(total), "queries": total["queries"]}))
    )
    return pipeline


def evaluate_output(output, ks=(1, 2, 4, 8), metrics=RETRIEVAL_METRICS, options=None):
    """Runs `evaluation_pipeline` and returns the metrics (a dict, also written to `evaluation.json`)."""
    evaluation_pipeline(output, ks, metrics, options).run().wait_until_finish()
    return F.read_json(F.join(output, F.EVALUATION_FILE))
