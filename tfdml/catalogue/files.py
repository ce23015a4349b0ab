"""The files of a `tfdml embed` output folder: names, and the embedding shards written and read back.

    <output>/embeddings-00000-of-00004.tfrecord   (or .parquet) one shard: id, class, embedding per image
    <output>/indexes/shard-00000/                  the ScannIndex of that shard (ids = the shard's ids)
    <output>/skipped.jsonl                         one {"id", "reason"} line per image that could not be read
    <output>/shards.jsonl                          one line per shard: its file, rows, index mode and recall
    <output>/manifest.json                         the run: model, inputs, counts, shards, options
    <output>/evaluation.json                       with --evaluate: Recall@K, MAP@R, R-precision

A TFRecord shard holds `tf.train.Example`s with features `id` (bytes), `class` (bytes, empty when the input
has no classes) and `embedding` (floats); a Parquet shard the columns `id` (string), `class` (string) and
`embedding` (list of float32). Rows are sorted by id. Paths may be local or any filesystem TensorFlow reads
and writes (`gs://`, `hdfs://`, `s3://` with its plugin), through `tf.io.gfile`.
"""

import io
import json
import os
import posixpath

import numpy as np
import tensorflow as tf

from tfdml import durable
from tfdml.embed_job import FORMATS  # noqa: F401  (the formats the files are written in)

SKIPPED_FILE = "skipped.jsonl"
SHARDS_FILE = "shards.jsonl"
MANIFEST_FILE = "manifest.json"
EVALUATION_FILE = "evaluation.json"
INDEXES_DIR = "indexes"


def join(folder, *names):
    """`os.path.join` for local folders, `/`-joined for URLs (`gs://...`)."""
    return posixpath.join(folder, *names) if "://" in folder else os.path.join(folder, *names)


def shard_file(output, shard, num_shards, file_format):
    return join(output, f"embeddings-{shard:05d}-of-{num_shards:05d}.{file_format}")


def shard_index_dir(output, shard):
    return join(output, INDEXES_DIR, f"shard-{shard:05d}")


def write_shard(path, ids, classes, embeddings, file_format):
    """Writes one shard (rows in the given order) to `path`, through a temporary name renamed at the end so
    that a retried or interrupted write never leaves half a file under the final name (a local one flushed
    to the disk before it is renamed)."""
    tmp = path + ".tmp"
    embeddings = np.asarray(embeddings, np.float32)
    if file_format == "tfrecord":
        with tf.io.TFRecordWriter(tmp) as writer:
            for item_id, name, vector in zip(ids, classes, embeddings):
                feature = {
                    "id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[item_id.encode()])),
                    "class": tf.train.Feature(bytes_list=tf.train.BytesList(value=[name.encode()])),
                    "embedding": tf.train.Feature(float_list=tf.train.FloatList(value=vector)),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    else:
        import pyarrow as pa  # Parquet only: pyarrow comes with the beam and ray extras
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "id": pa.array(list(ids), pa.string()),
                "class": pa.array(list(classes), pa.string()),
                "embedding": pa.array(list(embeddings), pa.list_(pa.float32())),
            }
        )
        buffer = io.BytesIO()  # pyarrow writes to its own files or to a Python stream, not to a GFile
        pq.write_table(table, buffer)
        with tf.io.gfile.GFile(tmp, "wb") as f:
            f.write(buffer.getvalue())
    if "://" in path:
        tf.io.gfile.rename(tmp, path, overwrite=True)
    else:  # a local file reaches the disk before its name does (a power cut leaves no empty shard)
        durable.publish(tmp, path)
    return path


def read_shard(path):
    """`(ids [N] str, classes [N] str, embeddings [N, D] float32)` of one shard file (either format)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # Parquet only: pyarrow comes with the beam and ray extras

        with tf.io.gfile.GFile(path, "rb") as f:
            table = pq.read_table(io.BytesIO(f.read()))
        embeddings = np.asarray(table.column("embedding").to_pylist(), np.float32)
        ids = np.asarray(table.column("id").to_pylist(), dtype=str)
        classes = np.asarray(table.column("class").to_pylist(), dtype=str)
        return ids, classes, embeddings.reshape(len(ids), -1)
    ids, classes, embeddings = [], [], []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        example = tf.train.Example.FromString(record)
        feature = example.features.feature
        ids.append(feature["id"].bytes_list.value[0].decode())
        classes.append(feature["class"].bytes_list.value[0].decode())
        embeddings.append(np.asarray(feature["embedding"].float_list.value, np.float32))
    dim = len(embeddings[0]) if embeddings else 0
    return (
        np.asarray(ids, dtype=str),
        np.asarray(classes, dtype=str),
        np.asarray(embeddings, np.float32).reshape(-1, dim),
    )


def read_jsonl(path):
    """The records of a JSON-lines file (none when it does not exist)."""
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_json(path, value):
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(value, indent=2) + "\n")


def read_json(path):
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def shard_records(output):
    """The `shards.jsonl` records of an output folder, by shard number."""
    return sorted(read_jsonl(join(output, SHARDS_FILE)), key=lambda record: record["shard"])
