"""The gallery of an export: reading it (sources, files, arrays, datasets), embedding it with the written
SavedModel, its `ScannIndex` inside the version, and loading an index checked against its version."""

import os

import numpy as np
import tensorflow as tf

from tfdml.data.sources import Source, load_items, read_image_files
from tfdml.export.client import ExportedEmbedder
from tfdml.export.layout import (
    GALLERY_IMAGES_FILE,
    INDEX_DIR,
    MAX_STORED_GALLERY_BYTES,
    _fingerprint,
    resolve_export_dir,
    seal_version,
)
from tfdml.export.prefix import PrefixIndex, load_prefix_or_full_index
from tfdml.retrieval import ScannIndex


class _Gallery:
    """What an index is built from: images to embed (in batches), ids, labels, class names, pixels to keep."""

    def __init__(self, batches, ids=None, labels=None, class_names=None, images=None, source=None, kept=None):
        self.batches, self.ids, self.labels = batches, ids, labels
        self.class_names, self.images, self.source = class_names, images, source
        self.kept = kept  # positions of the given items that could be read (None: all of them)


def _source_gallery(source):

    images, kept = load_items(source)
    paths = getattr(source, "paths", None)
    ids = np.asarray([os.path.abspath(paths[i]) for i in kept]) if paths is not None else kept
    stored = None
    if (
        paths is None
        and images
        and sum(image.nbytes for image in images) <= MAX_STORED_GALLERY_BYTES
        and len({image.shape for image in images}) == 1
    ):
        stored = np.stack(images)
    return _Gallery(
        [images], ids, source.labels[kept], getattr(source, "class_names", None), stored, source=source.name, kept=kept
    )


def _path_gallery(paths, channels):

    images, kept = read_image_files(paths, channels, what="gallery")
    return _Gallery([images], np.asarray([os.path.abspath(os.fspath(paths[i])) for i in kept]), kept=kept)


def _dataset_gallery(dataset):
    def batches():
        for element in dataset.as_numpy_iterator():
            if isinstance(element, dict):
                images, labels = element["image"], element.get("label")
            elif isinstance(element, tuple):
                images, labels = element[0], element[1] if len(element) > 1 else None
            else:
                images, labels = element, None
            images = np.asarray(images)
            yield (images[None] if images.ndim == 3 else images), labels  # unbatched datasets too

    return _Gallery(batches())


def _gallery(gallery, channels):

    if isinstance(gallery, Source):
        return _source_gallery(gallery)
    if isinstance(gallery, tf.data.Dataset):
        return _dataset_gallery(gallery)
    if isinstance(gallery, np.ndarray):
        stored = gallery if gallery.nbytes <= MAX_STORED_GALLERY_BYTES else None
        return _Gallery([gallery], images=stored)
    return _path_gallery(list(gallery), channels)


class EmbeddedGallery:
    """A gallery embedded by a version: `[N, D]` embeddings and, per item, ids, labels (with class names),
    the pixels kept for `tfdml search --grid` (or None) and the name of the source (or None)."""

    def __init__(self, embeddings, ids, labels, class_names, images, source):
        self.embeddings, self.ids, self.labels = embeddings, ids, labels
        self.class_names, self.images, self.source = class_names, images, source


def embed_gallery(embed, channels, gallery, ids=None, labels=None, class_names=None, batch_size=64):
    """Reads `gallery` (the forms of `export_index`) and embeds it with `embed(images, batch_size=...)`
    (`ExportedEmbedder.embed`, or the serving function before it is written); an `EmbeddedGallery`."""
    found = _gallery(gallery, channels)
    embeddings, found_labels = [], []
    for batch in found.batches:
        if isinstance(batch, tuple):
            batch, batch_labels = batch
            if batch_labels is not None:
                found_labels.append(np.asarray(batch_labels).reshape(-1))
        if len(batch):
            embeddings.append(embed(batch, batch_size=batch_size))
    if not embeddings:
        raise ValueError("the gallery holds no readable image: nothing to index.")
    embeddings = np.concatenate(embeddings, axis=0)
    if found.kept is not None:  # ids / labels given for every item: keep those of the readable ones
        ids = None if ids is None else np.asarray(ids)[found.kept]
        labels = None if labels is None else np.asarray(labels)[found.kept]
    if labels is None:
        labels = found.labels if found.labels is not None else (np.concatenate(found_labels) if found_labels else None)
    if ids is None:
        ids = found.ids
    class_names = class_names if class_names is not None else found.class_names
    labels, class_names = _present_classes(labels, class_names)
    return EmbeddedGallery(embeddings, ids, labels, class_names, found.images, found.source)


def _present_classes(labels, class_names):
    """`(labels, class_names)` naming only the classes that have gallery items: a gallery that leaves
    classes out (a subset such as the evaluation half of a folder, a class folder without a readable image)
    keeps the names of its own classes, in their order, and its labels are renumbered to match
    (`class_names[label]` still names each item's class). Labels that `class_names` does not cover are
    left for the index to refuse."""
    if labels is None or class_names is None:
        return labels, class_names
    labels = np.asarray(labels)
    if not labels.size or not np.issubdtype(labels.dtype, np.integer):
        return labels, class_names
    present = np.unique(labels)
    if present[0] < 0 or present[-1] >= len(class_names) or len(present) == len(class_names):
        return labels, class_names
    return np.searchsorted(present, labels).astype(labels.dtype), [class_names[c] for c in present.tolist()]


def save_index(version_dir, embedded, model_name, model_version, mode, settings, distance="dot_product"):
    """Builds the `ScannIndex` of an `EmbeddedGallery` (a `PrefixIndex` with `settings["search_dims"]`) and saves
    it inside the (written) version directory, recording the model name, version and SavedModel fingerprint it
    belongs to."""

    metadata = {
        "model_name": model_name,
        "model_version": model_version,
        "model_fingerprint": _fingerprint(version_dir),
        "gallery": embedded.source,
    }
    settings = dict(settings)
    search_dims = settings.pop("search_dims", None)
    common = dict(
        ids=embedded.ids,
        labels=embedded.labels,
        mode=mode,
        class_names=embedded.class_names,
        metadata={k: v for k, v in metadata.items() if v is not None},
        **settings,
    )
    if search_dims:  # the prefix of nested embeddings, re-ranked with the full vectors (dot products only)
        index = PrefixIndex(embedded.embeddings, search_dims, **common)
    else:
        index = ScannIndex(embedded.embeddings, distance=distance, **common)
    arrays = {GALLERY_IMAGES_FILE: embedded.images} if embedded.images is not None else None
    index.save(os.path.join(version_dir, INDEX_DIR), arrays=arrays)
    return index


def _build_index(version_dir, gallery, ids, labels, class_names, mode, batch_size, settings, distance="dot_product"):
    """Embeds `gallery` with the SavedModel in `version_dir` and saves the index inside it."""
    embedder = ExportedEmbedder(version_dir, check_index=False)  # the index is the part replaced
    embedded = embed_gallery(embedder.embed, embedder.channels, gallery, ids, labels, class_names, batch_size)
    index = save_index(version_dir, embedded, embedder.name, embedder.version, mode, settings, distance)
    seal_version(version_dir, dict(embedder.metadata))  # the new index's checksums (the others just checked)
    return index


def index_summary(index):
    """The metadata's `index` entry; the approximate settings and the measured recall only where they exist
    (a field that is not known is left out)."""
    summary = {
        "path": INDEX_DIR,
        "size": int(index.size),
        "distance": index.distance,
        "mode": index.mode,
        "ids": "none" if index.ids is None else ("paths" if index.ids.dtype.kind == "U" else "indices"),
        "has_labels": index.labels is not None,
        "classes": 0 if index.labels is None else int(len(np.unique(index.labels))),
        "settings": index.settings or None,
        "recall": index.recall,
        "search_dims": getattr(index, "search_dims", None),
        "prefix_index_recall": index.index.recall if isinstance(index, PrefixIndex) else None,
    }
    return {key: value for key, value in summary.items() if value is not None}


def export_index(
    gallery,
    base_dir="exported_models",
    name=None,
    version=None,
    ids=None,
    labels=None,
    class_names=None,
    mode="auto",
    batch_size=64,
    **index_settings,
):
    """Embeds a gallery with an exported version and writes its `ScannIndex` inside that version
    (`<base_dir>/<name>/<version>/assets.extra/tfdml_index/`, replacing any index there atomically).

    Args:
      gallery: a `tfdml.data.Source` (ids are its file paths for `image_folder`, else item indices; its
        labels and `class_names` are stored; undecodable items are skipped and named), a list of image
        file paths (ids are the paths; unreadable files are skipped and named), uint8 images
        `[N, H, W, C]` (ids `0..N-1`), or a `tf.data.Dataset` of image batches, `(images, labels)`
        batches or `{"image", "label"}` dicts. In-memory pixels (up to 64 MiB) are kept with the index so
        that `tfdml search --grid` can show neighbours that have no file.
      name, version: the exported model (default: the latest version under `<base_dir>/<name>`).
      ids, labels, class_names: override what the gallery provides (`class_names[label]` names a class).
        The index names only the classes that have gallery items (a subset of a source's classes, class
        folders left out): their labels are renumbered `0..` in the order of their names.
      mode, index_settings: passed to `ScannIndex` (dot products: the embeddings are L2-normalised);
        `search_dims=d` builds a `tfdml.export.PrefixIndex` on the `d`-d prefix of nested embeddings instead,
        its shortlist re-ranked with the full vectors.

    Returns the `ScannIndex` (already saved).
    """
    if not name:
        raise ValueError("name is required: the exported model lives at <base_dir>/<name>/<version>.")
    version_dir = resolve_export_dir(os.path.join(os.fspath(base_dir), name), version)
    return _build_index(version_dir, gallery, ids, labels, class_names, mode, batch_size, index_settings)


class IndexMismatchError(ValueError):
    """An index that was built with another model than the one it is used with."""


def load_index(model_path, version=None, index_dir=None):
    """`(ExportedEmbedder, ScannIndex)` of an exported version and its gallery index, checked to belong
    together (model name, version and SavedModel fingerprint recorded in the index)."""

    embedder = ExportedEmbedder(model_path, version)
    directory = index_dir or os.path.join(embedder.path, INDEX_DIR)
    if not os.path.isdir(directory):
        shared = os.path.join(os.path.dirname(os.path.abspath(embedder.path)), "index")
        hint = (
            (
                f" (the index at {shared} is of the old layout, shared by every version and possibly built "
                f"with another one: it is not used)"
            )
            if os.path.isdir(shared)
            else ""
        )
        raise FileNotFoundError(
            f"{embedder.path} (model {embedder.name!r} version {embedder.version}) has no gallery index{hint}: "
            f"build one with 'tfdml export --model MODEL.keras --name {embedder.name} --version "
            f"{embedder.version} --gallery-dir DIR' or tfdml.export.export_index(...)."
        )
    index = load_prefix_or_full_index(directory)
    built = index.metadata
    fingerprint = _fingerprint(embedder.path)
    problems = []
    if built.get("model_name") not in (None, embedder.name):
        problems.append(f"model {built['model_name']!r}, not {embedder.name!r}")
    if built.get("model_version") not in (None, embedder.version):
        problems.append(f"version {built['model_version']}, not {embedder.version}")
    if built.get("model_fingerprint") and fingerprint and built["model_fingerprint"] != fingerprint:
        problems.append("another SavedModel (fingerprint differs: the version was re-exported)")
    if problems:
        raise IndexMismatchError(
            f"the index at {directory} was built with {'; '.join(problems)} at {embedder.path}: its "
            f"neighbours would be wrong. Rebuild it for this version (tfdml export --gallery-dir, or "
            f"export_index) or use the version it belongs to."
        )
    return embedder, index
