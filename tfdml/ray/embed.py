"""`tfdml embed` on Ray Data: the steps of `tfdml.catalogue.steps`, each in a Ray Data operator.

1. read: the input's files are listed by the driver (`tf.io.gfile.glob`); image files become items
   `(id = path, class = parent folder)` read by the actor that decodes them, TFRecord files are read one file
   per task and their records parsed (`steps.parse_example`);
2. decode and embed: `map_batches` with a pool of `RayCluster.actors` actors (`compute=ActorPoolStrategy`),
   each loading the SavedModel once (`steps.ServingEmbedder`) and running `steps.decode_item` and the serving
   signature on its batches; an item that cannot be read or decoded leaves the actor as a row with its reason;
3. shard and index: rows are grouped by `steps.shard_of` (one group per shard, and one of the skipped rows)
   and each group is written by one task (`steps.write_shard`: the embedding file and the shard's
   `ScannIndex`), so a task holds one shard; the driver writes `shards.jsonl` and `skipped.jsonl` from the
   groups' one-line records.

Every actor and task asks Ray for `RayCluster.cpus` CPUs, a fraction by default: a task asking a whole CPU on a
node whose one CPU is partly held by an actor waits without an error. The output folder must be one every node
writes and the driver reads (a shared file system or a URL), as the shards are written on the nodes.

Example (an export and a folder of your own; `tests/ray/test_ray_embed.py` runs the same calls on a two-node
cluster):

    job = EmbedJob(model="exported_models/cub", output="/shared/embeddings/cub", image_dir="/shared/cub")
    manifest = run_embed(job, RayCluster(address="head-node:6379", actors=8))
"""

import json

import numpy as np
import ray
import tensorflow as tf

from tfdml.catalogue import files as F
from tfdml.catalogue import steps
from tfdml.embed_job import RayCluster
from tfdml.ray.cluster import connect, quiet_data
from tfdml.retrieval.sharded import RETRIEVAL_METRICS, add_sums, metrics_from_sums

_SKIPPED_GROUP = -1  # the shard key of the rows that could not be read or decoded


def input_files(job):
    """The files of the job's input (images: those with an image extension), sorted."""
    paths = sorted(tf.io.gfile.glob(job.pattern))
    return paths if job.tfrecords else [path for path in paths if steps.is_image_file(path)]


def _tfrecord_items(row):
    """The records of one TFRecord file as items `{id, class, data}`, a damaged record as a skipped row."""
    for record in tf.data.TFRecordDataset(row["path"]).as_numpy_iterator():
        try:
            item_id, name, data = steps.parse_example(record)
        except steps.Skipped as skipped:
            yield {"id": skipped.item_id, "class": "", "data": b"", "reason": skipped.reason}
            continue
        yield {"id": item_id, "class": name, "data": data, "reason": ""}


class EmbedBatch:
    """A Ray Data actor: the SavedModel loaded once; a batch of items -> rows `{id, class, shard, reason,
    embedding}` (a skipped item: shard -1, its reason, a zero embedding)."""

    def __init__(self, version_dir, num_shards):
        self.embedder = steps.ServingEmbedder(version_dir)
        self.channels = steps.model_channels(version_dir)
        self.num_shards = num_shards

    def __call__(self, batch):
        ids, names = [str(i) for i in batch["id"]], [str(c) for c in batch["class"]]
        data = batch.get("data")
        reasons = [str(r) for r in batch["reason"]] if "reason" in batch else [""] * len(ids)
        images, kept = [], []
        for position, item_id in enumerate(ids):
            if reasons[position]:
                continue
            item = None if data is None else bytes(data[position])
            try:
                images.append(steps.decode_item(item_id, item, self.channels))
            except steps.Skipped as skipped:
                reasons[position] = skipped.reason
                continue
            kept.append(position)
        vectors = self.embedder(images) if images else []
        embeddings = np.zeros((len(ids), self.embedder.dim), np.float32)
        for position, vector in zip(kept, vectors):
            embeddings[position] = vector
        shards = [steps.shard_of(i, self.num_shards) if not r else _SKIPPED_GROUP for i, r in zip(ids, reasons)]
        return {
            "id": np.asarray(ids, dtype=object),
            "class": np.asarray(names, dtype=object),
            "shard": np.asarray(shards, np.int64),
            "reason": np.asarray(reasons, dtype=object),
            "embedding": embeddings,
        }


def _write_group(group, output, job):
    """One group of rows (a shard, or the skipped rows) -> its files; returns its one-line record."""
    shard = int(group["shard"][0])
    if shard == _SKIPPED_GROUP:
        lines = [json.dumps({"id": str(i), "reason": str(r)}) for i, r in zip(group["id"], group["reason"])]
    else:
        items = list(zip((str(i) for i in group["id"]), (str(c) for c in group["class"]), group["embedding"]))
        lines = [json.dumps(steps.write_shard(output, shard, items, job))]
    return {"shard": np.asarray([shard]), "lines": np.asarray(["\n".join(lines)], dtype=object)}


def embed_dataset(job, cluster, output):
    """The Ray Dataset (lazy: nothing runs until it is consumed) whose rows are the groups' records
    `{shard, lines}` once every shard of `job` is written under `output`."""
    quiet_data()
    version_dir = steps.model_version_dir(job.model)
    paths = input_files(job)
    if job.tfrecords:
        items = ray.data.from_items([{"path": path} for path in paths]).flat_map(_tfrecord_items, num_cpus=cluster.cpus)
    else:
        items = ray.data.from_items([{"id": path, "class": steps.file_item(path)[1]} for path in paths])
    embedded = items.map_batches(
        EmbedBatch,
        fn_constructor_args=(version_dir, job.num_shards),
        compute=ray.data.ActorPoolStrategy(size=cluster.actors),
        num_cpus=cluster.cpus,
        batch_size=job.batch_size,
        batch_format="numpy",
    )
    return embedded.groupby("shard", num_partitions=job.num_shards + 1).map_groups(
        _write_group, fn_args=(output, job), num_cpus=cluster.cpus, batch_format="numpy"
    )


def _write_records(dataset, output):
    rows = sorted(dataset.take_all(), key=lambda row: int(row["shard"]))
    skipped = [row["lines"] for row in rows if int(row["shard"]) == _SKIPPED_GROUP]
    shards = [row["lines"] for row in rows if int(row["shard"]) != _SKIPPED_GROUP]
    for name, lines in ((F.SHARDS_FILE, shards), (F.SKIPPED_FILE, skipped)):
        with tf.io.gfile.GFile(F.join(output, name), "w") as f:
            f.write("".join(line + "\n" for line in lines))


def run_embed(job, cluster=None, say=print):
    """Runs `job` (an `EmbedJob`) on the Ray cluster `cluster` (a `RayCluster`; default a local one-node Ray)
    with the output-folder rules of `steps.run_into_output` and writes `manifest.json`; returns the manifest
    (a dict). `FileExistsError` for an existing output without `overwrite`."""
    cluster = cluster or RayCluster()

    def write(folder):
        _write_records(embed_dataset(job, cluster, folder), folder)

    with connect(cluster.address):
        return steps.run_into_output(job, write, engine="ray", say=say)


def evaluate_output(output, ks=(1, 2, 4, 8), metrics=RETRIEVAL_METRICS, cluster=None):
    """Recall@K, MAP@R and R-precision of a `tfdml embed` output, one Ray task per query shard
    (`steps.query_shard_sums`, as the Beam evaluation), the sums added on the driver; returns the metrics (a
    dict, also written to `evaluation.json`)."""
    cluster = cluster or RayCluster()
    ks, metrics = tuple(int(k) for k in ks), tuple(metrics)
    records, counts = steps.evaluation_inputs(output, metrics)
    with connect(cluster.address):
        task = ray.remote(num_cpus=cluster.cpus)(steps.query_shard_sums)
        parts = ray.get([task.remote(record, output, records, counts, ks, metrics) for record in records])
    total = {}
    for part in parts:
        total = add_sums(total, part)
    results = {**metrics_from_sums(total), "queries": total["queries"]}
    F.write_json(F.join(output, F.EVALUATION_FILE), results)
    return results
