"""Retrieval metrics of the trained embedder beside raw pixels, the calibration of its served match decision,
and the export with the evaluation items' index."""

import dataclasses
import json
import os

import numpy as np

from tfdml import data as data_lib
from tfdml import durable, interrupts, retrieval
from tfdml import export as export_lib

# In the checkpoint folder: the export written before a stop (not written twice).
EXPORT_RECORD = "tfdml_export.json"


def _pixels(dataset):
    images, labels = [], []
    for batch_images, batch_labels in stoppable_batches(dataset):
        images.append(np.asarray(batch_images))
        labels.append(np.asarray(batch_labels).reshape(-1))
    return np.concatenate(images), np.concatenate(labels)


def stoppable_batches(dataset):
    """The batches of `dataset`, a held stop raised between them (`interrupts.between_steps`)."""
    for batch in dataset:
        interrupts.stop_point()
        yield batch


def _keeping_images(dataset, kept):
    """The `(images, labels)` batches of `dataset`, each batch's images appended to `kept` as it goes by."""
    for images, labels in stoppable_batches(dataset):
        kept.append(np.asarray(images))
        yield images, labels


def _l2_normalise(x):
    x = x.reshape(len(x), -1).astype(np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclasses.dataclass
class Evaluation:
    results: dict  # the model's metrics
    baseline: dict  # raw pixels' metrics
    embeddings: np.ndarray
    labels: np.ndarray
    pixels: np.ndarray  # evaluation images in [0, 1]
    pixel_labels: np.ndarray
    calibration: object = None  # tfdml.retrieval.Calibration of the served `match` decision


def evaluate(config, embedder, datasets):
    """Retrieval metrics of the embedder and of raw pixels on the evaluation images."""

    ks, metrics = config.evaluation.ks, config.evaluation.metrics
    if datasets.pixels is datasets.eval:  # one pass over the images: embedded and kept as they go by
        kept = []
        embeddings, labels = retrieval.embed_batches(embedder, _keeping_images(datasets.eval, kept))
        pixels, pixel_labels = np.concatenate(kept), labels
    else:
        embeddings, labels = retrieval.embed_batches(embedder, stoppable_batches(datasets.eval))
        pixels, pixel_labels = _pixels(datasets.pixels)
    results = retrieval.evaluate(embeddings, labels, ks=ks, metrics=metrics, exact=config.evaluation.exact)
    pixels = pixels / np.float32(255.0)  # [0, 1] for the grid; the baseline normalises anyway
    baseline = retrieval.evaluate(_l2_normalise(pixels), pixel_labels, ks=ks, metrics=metrics, exact=True)
    # The score threshold of a correct top-1 match at the export's precision, on the held-out items.
    calibration = (
        retrieval.calibrate(
            embeddings, labels, target_precision=config.export.match_precision, mode=config.export.match_mode
        )
        if len(labels) > 1
        else None
    )
    return Evaluation(results, baseline, embeddings, labels, pixels, pixel_labels, calibration)


def export(config, embedder, evaluation, eval_source):
    """Exports the SavedModel with the index of the evaluation items inside its version (and, with it, the
    `search` signature over the same items, `match` calibrated on them), in one atomic step; returns the
    summary entries it adds."""

    settings, size = config.export, config.data.image_size
    # The index stores the evaluation items' ids (item numbers or file paths), labels and class names,
    # embedded by the written SavedModel from the raw images.
    path = export_lib.export_saved_model(
        embedder,
        base_dir=settings.base_dir,
        name=settings.name,
        version=settings.version,
        image_size=(size, size),
        center_crop=data_lib.evaluation_center_crop(config.data.augment),
        training_config=config.to_dict(),
        metrics=evaluation.results,
        overwrite=settings.version is not None,
        gallery=eval_source if settings.index else None,
        index_mode="exact",
        search=settings.search,
        top_k=settings.top_k,
        gallery_dtype=settings.gallery_dtype,
        match_precision=settings.match_precision,
        match_mode=settings.match_mode,
        calibration=evaluation.calibration,
        index_settings={"target_recall": settings.target_recall},
        search_dims=settings.search_dims,
    )
    added = {"export_dir": path}
    if settings.index:
        metadata = export_lib.load_metadata(path)
        added["index_size"] = int(metadata["index"]["size"])
        if "search" in metadata:
            added["search"] = {
                key: metadata["search"][key] for key in ("top_k", "gallery_dtype", "match_threshold", "match_precision")
            }
    return added


def export_once(config, embedder, evaluation, eval_source):
    """The export, or the one a stopped run of this job wrote before its report; `(added, error)`."""
    record = os.path.join(config.training.checkpoint_dir, EXPORT_RECORD)
    if os.path.exists(record):
        with open(record) as f:
            added = json.load(f)
        if os.path.isdir(added.get("export_dir", "")):
            return added, None
    try:
        added = export(config, embedder, evaluation, eval_source)
    except (OSError, ValueError) as error:
        return {}, error
    with durable.storage_errors(record):
        durable.write_json(record, added)
    return added, None
