"""`export_saved_model`: a Keras embedder -> TF Serving SavedModel (signatures, metadata, atomic write).

The signatures and the model protocol are `tfdml.export.serving`'s, the metadata `tfdml.export.metadata`'s,
the settings `tfdml.export.options`'s; here they are put together and written, the gallery's index with them,
so that a version appears complete or not at all."""

import errno
import math
import os
import shutil

import tensorflow as tf

from tfdml import durable
from tfdml.export.client import embed_uint8
from tfdml.export.gallery import embed_gallery, index_summary, save_index
from tfdml.export.layout import EMBEDDING_OUTPUT, SEARCH_SIGNATURE, seal_version
from tfdml.export.metadata import version_metadata
from tfdml.export.options import split_options
from tfdml.export.prefix import signature_prefix_record
from tfdml.export.search import GallerySearch, item_strings
from tfdml.export.serving import ServingInput, embedding_archive, image_spec
from tfdml.retrieval.calibration import calibrate
from tfdml.retrieval_options import TARGET_RECALL as DEFAULT_TARGET_RECALL


def export_saved_model(
    model,
    base_dir="exported_models",
    name=None,
    version=None,
    *,
    gallery=None,
    training_config=None,
    metrics=None,
    overwrite=False,
    **options,
):
    """Writes `model` as a TF Serving SavedModel at `<base_dir>/<name>/<version>/` and returns that path.

    Args:
      model: a Keras model (see `tfdml.export.serving` for its signatures and the optional protocol).
      base_dir: TF Serving's model base path.
      name: model name (the TF Serving `model_name`); default `model.name`.
      version: positive integer version; default one more than the largest existing version.
      gallery: optional gallery to index inside the version (see `export_index` for the accepted forms,
        e.g. a `tfdml.data.Source`); it is embedded by the serving function that is written, and its index
        is saved before the version appears, so a version never exists without the index it was exported
        with. With it, the `search` signature is written too (`SearchOptions`).
      training_config, metrics: JSON-serialisable dicts copied into the metadata file (loss and training
        settings, evaluation results); omitted from the metadata when not given.
      overwrite: replace an existing version directory instead of raising `FileExistsError`.
      **options: the fields of `ServingOptions` (`image_size`, `preprocess`, `center_crop`, `resize`),
        `IndexOptions` (`gallery_ids`, `gallery_labels`, `class_names`, `index_mode`, `batch_size`,
        `index_settings`) and `SearchOptions` (`search`, `top_k`, `gallery_dtype`, `search_block_rows`,
        `match_precision`, `calibration`, `match_mode`, `search_dims`, `query_expansion`,
        `database_augmentation`, `expansion_alpha`), each documented there and checked before any work.

    Example:
      >>> path = export_saved_model(embedder, "exported_models", name="cub", metrics=results,
      ...                           gallery=tfdml.data.image_folder("cub/test"), top_k=5)
      >>> # tensorflow_model_server --rest_api_port=8501 --model_name=cub --model_base_path=$PWD/exported_models/cub
    """
    name = _checked_name(name or model.name)
    serving_options, index_options, search_options = split_options(options)
    serving = ServingInput(model, serving_options)
    model_dir, chosen_version, target = _version_path(base_dir, name, version, overwrite)
    archive, serve, outputs = embedding_archive(model, serving)
    embedded = None
    if gallery is not None:
        # Embedded by `serve` itself (the function written as serving_default), once, for index and search.
        embed = lambda images, batch_size: embed_uint8(serve, images, batch_size)  # noqa: E731
        items = index_options.gallery_ids, index_options.gallery_labels, index_options.class_names
        embedded = embed_gallery(embed, serving.channels, gallery, *items, index_options.batch_size)
    index_settings = _with_search_dims(index_options.index_settings, search_options.search_dims)
    searcher, calibration = _add_search_signature(archive, serve, embedded, search_options, index_settings)
    metadata = version_metadata(
        model, name, chosen_version, outputs, serving, searcher, calibration, embedded, training_config, metrics
    )
    return _write_version(
        archive, metadata, model_dir, target, embedded, index_options.index_mode, index_settings, version is None
    )


def _checked_name(name):
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(f"name must be a plain directory name, got {name!r}.")
    return name


def _next_version(model_dir):
    versions = [int(entry) for entry in os.listdir(model_dir) if entry.isdigit()] if os.path.isdir(model_dir) else []
    return max(versions, default=0) + 1


def _version_path(base_dir, name, version, overwrite):
    """`(model folder, version, version folder)`, checked before anything is built or written."""
    model_dir = os.path.abspath(os.path.join(os.fspath(base_dir), name))
    given = version is not None  # a version taken meanwhile moves on to the next free one (_write_version)
    version = int(version) if given else _next_version(model_dir)
    if version < 1:
        raise ValueError(f"version must be a positive integer, got {version}.")
    target = os.path.join(model_dir, str(version))
    if given and os.path.exists(target) and not overwrite:
        raise FileExistsError(f"{target} already exists; pass overwrite=True or another version.")
    return model_dir, version, target


def _with_search_dims(index_settings, search_dims):
    """The index settings, with `search_dims` where a prefix index is asked for."""
    return {**(index_settings or {}), "search_dims": search_dims} if search_dims else index_settings


def _default_calibration(embedded, options):
    """`calibrate` on the labelled gallery itself at the options' precision and mode, or None without labels."""
    if embedded.labels is None or len(embedded.labels) < 2:
        return None
    return calibrate(
        embedded.embeddings, embedded.labels, target_precision=options.match_precision, mode=options.match_mode
    )


def _add_search_signature(archive, serve, embedded, options, index_settings):
    """Adds the `search` endpoint over the embedded gallery to `archive` when the options ask for it and there
    is a gallery; returns `(its GallerySearch or None, the calibration of its match)` (with a prefix search,
    the measured recall in `searcher.prefix_record`)."""
    if not options.search or embedded is None:
        return None, options.calibration
    calibration = options.calibration or _default_calibration(embedded, options)
    ids, labels = item_strings(
        embedded.ids, embedded.labels, embedded.class_names, len(embedded.embeddings), embedded.source
    )
    record = None
    if options.search_dims:
        target = (index_settings or {}).get("target_recall", DEFAULT_TARGET_RECALL)
        record = signature_prefix_record(embedded.embeddings, options.search_dims, options.top_k, target)
    searcher = GallerySearch(
        embedded.embeddings,
        ids,
        labels,
        options.top_k,
        options.gallery_dtype,
        calibration.threshold if calibration is not None else math.inf,
        options.search_block_rows,
        search_dims=options.search_dims,
        shortlist=None if record is None else record["shortlist"],
        query_expansion=options.query_expansion,
        database_augmentation=options.database_augmentation,
        expansion_alpha=options.expansion_alpha,
    )
    searcher.prefix_record = record

    def search_images(images):
        # The serving_default function itself, called (already traced), not traced again as a copy.
        embedding = serve(images)[EMBEDDING_OUTPUT]
        return {**searcher(embedding), EMBEDDING_OUTPUT: embedding}

    # Calls only tfdml's functions and the traced serve: no AutoGraph (`tfdml.data.tracing`).
    archive.add_endpoint(SEARCH_SIGNATURE, tf.function(search_images, input_signature=[image_spec()], autograph=False))
    return searcher, calibration


def _write_version(archive, metadata, model_dir, target, embedded, index_mode, index_settings, chosen=False):
    """Writes the SavedModel, its metadata and index in a temporary folder, flushes them to the disk (their
    checksums in the metadata), then renames it into place, so that a version never exists half-written or
    without the index it was exported with, even after a power cut. A `chosen`
    version (the next free one) that another export took meanwhile moves on to the next free one."""
    os.makedirs(model_dir, exist_ok=True)
    staging = None
    try:
        with durable.storage_errors(target):
            staging = durable.staging_folder(model_dir, ".tmp-export-")
            written = os.path.join(staging, "model")
            archive.write_out(written, verbose=False)
            if embedded is not None:
                _save_index(written, embedded, metadata, index_mode, index_settings)
            seal_version(written, metadata)
            if chosen:
                target = _rename_to_free_version(written, target, metadata, embedded, index_mode, index_settings)
            else:
                if os.path.exists(target):  # overwrite=True: swap the old version out of the way first
                    os.rename(target, os.path.join(staging, "previous"))
                os.rename(written, target)
            durable.sync_folder(model_dir)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _rename_to_free_version(written, target, metadata, embedded, index_mode, index_settings):
    """Renames `written` to `target`, or, when another export wrote that version meanwhile (a rename onto a
    non-empty folder fails), to the next free version, its metadata and index renumbered."""
    model_dir = os.path.dirname(target)
    while True:
        try:
            os.rename(written, target)
            return target
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        metadata["version"] = _next_version(model_dir)
        target = os.path.join(model_dir, str(metadata["version"]))
        if embedded is not None:
            _save_index(written, embedded, metadata, index_mode, index_settings)
        seal_version(written, metadata)


def _save_index(written, embedded, metadata, index_mode, index_settings):
    """Saves the gallery's index in the `written` version, for the name and version of its `metadata`, and
    records its summary there."""
    index = save_index(written, embedded, metadata["name"], metadata["version"], index_mode, index_settings or {})
    metadata["index"] = index_summary(index)
