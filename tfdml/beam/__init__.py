"""Beyond one machine: embed, index and evaluate a catalogue with Apache Beam (the beam extra:
`pip install -e ".[beam]"` in the top folder of tfdml's source).

Modules: `embed` (the `tfdml embed` pipeline: images -> the export's serving signature with Beam's
`RunInference` -> sharded embedding files and one `ScannIndex` per shard), `evaluation` (Recall@K, MAP@R and
R-precision over the shards, streaming over query shards). The steps themselves and the output folder's files
are `tfdml.catalogue` (shared with the Ray driver, `tfdml.ray`). Searching the shards together is
`tfdml.retrieval.sharded.ShardedIndex`, which needs no Beam.

Apache Beam is an optional dependency: it is imported by this package only, and importing the package
without it raises an `ImportError` that says how to install it.
"""

from tfdml.embed_job import BEAM_INSTALL

try:  # the optional dependency, checked before anything else loads: Beam and its TensorFlow model handler
    import apache_beam  # noqa: F401
    from apache_beam.ml.inference import tensorflow_inference  # noqa: F401
except ImportError as error:  # exercised in a subprocess by tests/beam/test_beam_optional.py
    raise ImportError(
        f"tfdml.beam (tfdml embed) needs Apache Beam: {BEAM_INSTALL} in the top folder of tfdml's source "
        f"(missing: {error.name})"
    ) from error

from tfdml.beam.embed import EmbedJob, embed_pipeline, run_embed
from tfdml.beam.evaluation import evaluate_output, evaluation_pipeline
from tfdml.catalogue.files import read_shard, shard_records

__all__ = [
    "EmbedJob",
    "embed_pipeline",
    "evaluate_output",
    "evaluation_pipeline",
    "read_shard",
    "run_embed",
    "shard_records",
]
