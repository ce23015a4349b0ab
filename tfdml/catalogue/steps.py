"""The steps of `tfdml embed`, written once and run by either engine's driver (`tfdml.beam`, `tfdml.ray`).

read -> decode -> embed -> shard -> index -> merge:

- `file_item` / `parse_example`: an input item `(id, class, encoded bytes or None)`;
- `decode_item`: the bytes (read from the id's path when None) -> uint8 pixels with the export's channel
  count, by `tfdml.export.read_image`'s decoder; what cannot be read or decoded raises `Skipped` with its id
  and reason, which a driver writes to `skipped.jsonl` (never a failed run);
- `ServingEmbedder` / `serve_images`: the export's `serving_default` signature on a batch, one image size per
  call (the signature resizes, crops and preprocesses in its graph: the embeddings are the served ones);
- `shard_of`: `crc32(id) % num_shards`, the same on every worker and every run;
- `write_shard`: one shard's rows sorted by id, its embedding file and its `ScannIndex`, and its
  `shards.jsonl` record (with the size and sha256 of each of its files in a local output, which
  `evaluation_inputs` checks before anything is read);
- `query_shard_sums`: the retrieval sums of one query shard against every shard's index, added over query
  shards by the driver (`tfdml.retrieval.sharded`).

`run_into_output` holds the output-folder rules every driver keeps: refuse a folder that holds files unless
`overwrite`, write a local folder in a staging folder renamed into place at the end, write `manifest.json`
and name the skipped images.
"""

import dataclasses
import datetime
import hashlib
import os
import shutil
import tempfile
import zlib
from collections import Counter

import numpy as np
import tensorflow as tf

from tfdml import durable
from tfdml.catalogue import files as F
from tfdml.data.sources import IMAGE_EXTENSIONS, ImageReadError, decode_image_bytes
from tfdml.export import EMBEDDING_OUTPUT, IMAGE_INPUT, METADATA_FILE, SERVING_SIGNATURE, resolve_export_dir
from tfdml.retrieval.index import ScannIndex, replace_directory
from tfdml.retrieval.sharded import RETRIEVAL_METRICS, ShardedIndex, needed_neighbours, retrieval_sums


class Skipped(Exception):
    """An item that cannot be read or decoded: its id and the reason, a line of `skipped.jsonl`."""

    def __init__(self, item_id, reason):
        super().__init__(f"{item_id}: {reason}")
        self.item_id, self.reason = item_id, reason

    def record(self):
        return {"id": self.item_id, "reason": self.reason}


def model_version_dir(model):
    """The version folder of an export (local: `<base>/<name>` resolves to its latest version; a URL must
    name the version folder itself)."""
    return model if "://" in model else os.path.abspath(resolve_export_dir(model))


def model_metadata(version_dir):
    """`tfdml_metadata.json` of an export (any filesystem TensorFlow reads)."""
    return F.read_json(F.join(version_dir, METADATA_FILE))


def model_channels(version_dir):
    return int(model_metadata(version_dir)["input"]["channels"])


def file_item(path):
    """An image file's `(id, class, None)`: the id is the path, the class its parent folder's name."""
    return path, os.path.basename(os.path.dirname(path.rstrip("/"))), None


def is_image_file(path):
    return path.lower().endswith(tuple(IMAGE_EXTENSIONS))


def parse_example(record):
    """A TFRecord record -> `(id, class, image bytes)`; `Skipped` when it is no `tf.train.Example` with an
    `image` bytes feature. Without `id` the id is the image's SHA-1."""
    try:
        feature = tf.train.Example.FromString(record).features.feature
        data = feature["image"].bytes_list.value[0]
    except Exception as error:  # a damaged record or another schema: skipped and named
        digest = hashlib.sha1(record).hexdigest()
        raise Skipped(
            f"sha1:{digest}", f"not a tf.train.Example with an 'image' bytes feature ({type(error).__name__})"
        ) from None

    def text(key):
        values = feature[key].bytes_list.value if key in feature else []
        return values[0].decode() if values else None

    return text("id") or f"sha1:{hashlib.sha1(data).hexdigest()}", text("class") or "", data


def _read_gfile(path):
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def decode_item(item_id, data, channels, read=_read_gfile):
    """uint8 `[H, W, channels]` pixels of an item's bytes (`None`: `read(item_id)`, a path; default
    `tf.io.gfile`); `Skipped` with the reason when the file cannot be read or the image decoded."""
    if data is None:
        try:
            data = read(item_id)
        except Exception as error:  # any filesystem's read error: skipped and named, the run goes on
            raise Skipped(item_id, f"cannot be read: {type(error).__name__}: {error}") from None
    try:
        return decode_image_bytes(data, item_id, channels)
    except ImageReadError as error:
        raise Skipped(item_id, str(error)[len(item_id) + 2 :]) from None


def serve_images(model, images):
    """The `embedding` output of the `serving_default` signature of a loaded SavedModel for each image of
    `images` (uint8 `[H, W, C]` arrays, sizes may differ: one size per call), as a list of float32 vectors in
    the order given."""
    serve = model.signatures[SERVING_SIGNATURE]
    by_shape = {}
    for position, image in enumerate(images):
        by_shape.setdefault(np.shape(image), []).append(position)
    embeddings = [None] * len(images)
    for positions in by_shape.values():
        batch = tf.constant(np.stack([images[i] for i in positions]))
        for position, vector in zip(positions, serve(**{IMAGE_INPUT: batch})[EMBEDDING_OUTPUT].numpy()):
            embeddings[position] = np.asarray(vector, np.float32)
    return embeddings


class ServingEmbedder:
    """An export's SavedModel, loaded once (`tf.saved_model.load`), embedding batches with `serve_images`."""

    def __init__(self, version_dir):
        self.model = tf.saved_model.load(version_dir)
        outputs = self.model.signatures[SERVING_SIGNATURE].structured_outputs
        self.dim = int(outputs[EMBEDDING_OUTPUT].shape[-1])

    def __call__(self, images):
        return serve_images(self.model, images)


def shard_of(item_id, num_shards):
    """The shard of an id (CRC-32: the same on every worker and every run)."""
    return zlib.crc32(item_id.encode()) % num_shards


def write_shard(output, shard, items, job):
    """Writes one shard `[(id, class, embedding)]` (any order) under `output`: its embedding file (rows sorted
    by id) and, unless `job.index_mode` is none, its `ScannIndex`; returns its `shards.jsonl` record (rows,
    class counts, index mode and measured recall)."""
    items = sorted(items, key=lambda item: item[0])
    ids = [item[0] for item in items]
    classes = [item[1] for item in items]
    embeddings = np.stack([item[2] for item in items]).astype(np.float32)
    path = F.write_shard(
        F.shard_file(output, shard, job.num_shards, job.file_format), ids, classes, embeddings, job.file_format
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
        save_index(index, F.shard_index_dir(output, shard))
        record["index"] = {"dir": f"{F.INDEXES_DIR}/shard-{shard:05d}", "mode": index.mode}
        if index.recall:
            record["index"]["recall"] = index.recall
    if "://" not in output:  # a remote store keeps its own checksums (GCS's CRC32C, S3's ETag)
        record["files"] = {record["file"]: durable.file_record(path)}
        if "index" in record:
            index_files = durable.folder_records(F.shard_index_dir(output, shard))
            record["files"].update({f"{record['index']['dir']}/{name}": rec for name, rec in index_files.items()})
    return record


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


def output_problem(output, overwrite):
    """Why `output` cannot be written (an existing, non-empty folder without `overwrite`), or None."""
    if tf.io.gfile.exists(output):
        if not tf.io.gfile.isdir(output):
            return f"{output} exists and is not a folder."
        if tf.io.gfile.listdir(output) and not overwrite:
            return f"{output} already holds files (an earlier run?); pass --overwrite to replace it, or another folder."
    return None


def run_into_output(job, write, engine, say=print):
    """Runs `write(folder)` (an engine writing the shards, `shards.jsonl` and `skipped.jsonl` into `folder`)
    and writes `manifest.json`; returns the manifest (a dict).

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
        staging = durable.staging_folder(os.path.dirname(target), f".tmp-embed-{os.path.basename(target)}-")
    else:
        if tf.io.gfile.exists(job.output):
            tf.io.gfile.rmtree(job.output)
        target = staging = job.output
    try:
        started = datetime.datetime.now(datetime.timezone.utc)
        write(staging)
        manifest = _manifest(job, staging, started, engine)
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


def _manifest(job, folder, started, engine):
    shards = F.shard_records(folder)
    version_dir = model_version_dir(job.model)
    return {
        "format": "tfdml.embed/1",
        "engine": engine,
        "model": version_dir,
        "model_name": model_metadata(version_dir).get("name"),
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


def gallery_counts(records):
    """`{class name: items}` over every shard (from `shards.jsonl`: no embedding is read)."""
    counts = Counter()
    for record in records:
        counts.update(record["classes"])
    return dict(counts)


def evaluation_inputs(output, metrics):
    """`(shard records, class counts)` of an output folder to evaluate; `ValueError` naming what is missing,
    `tfdml.durable.DamagedFileError` (a `ValueError`) naming a shard file that fails its recorded checksum."""
    records = F.shard_records(output)
    if not records:
        raise ValueError(f"{output} holds no embedding shard (no {F.SHARDS_FILE}): run tfdml embed first.")
    if any("index" not in record for record in records):
        raise ValueError(f"{output} was embedded with --index-mode none: its shards have no index to search.")
    unknown = set(metrics) - set(RETRIEVAL_METRICS)
    if unknown:
        raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {RETRIEVAL_METRICS}.")
    if "://" not in output:
        for record in records:  # a damaged shard or index is named before any is read
            durable.check_files(output, record.get("files", {}))
    counts = gallery_counts(records)
    if set(counts) == {""}:
        raise ValueError(f"{output} has no classes (its input gave none): retrieval metrics need them.")
    return records, counts


def query_shard_sums(record, output, records, counts, ks, metrics):
    """`retrieval_sums` of one query shard against every shard of `output`: the shard's embeddings search
    every shard's index in turn (`ShardedIndex`, one index loaded at a time), their own item excluded."""
    ids, classes, embeddings = F.read_shard(F.join(output, record["file"]))
    if not len(ids):
        return {"queries": 0}
    index = ShardedIndex.load([F.join(output, *shard["index"]["dir"].split("/")) for shard in records])
    k = needed_neighbours(counts, ks, metrics)
    _, _, labels = index.search(embeddings, k, exclude_ids=ids, labels=True)
    return retrieval_sums(labels, classes, counts, ks, metrics)
