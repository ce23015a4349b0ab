"""Export an embedder as a plain TF Serving SavedModel, with its ScaNN gallery index inside the version.

Modules: `savedmodel` (putting a version together and writing it), `serving` (its embedding signatures and
the model protocol), `options` (the export's settings), `metadata` (`tfdml_metadata.json`), `gallery`
(reading a gallery, building and loading its index), `search` (the `search` signature), `prefix` (nested
embeddings: an index on a short prefix, re-ranked with the full vector), `layout` (names and paths inside a
version), `client` (using an export from outside). Everything public is re-exported here:
`tfdml.export.export_saved_model`, ...

Stock TF Serving cannot load ScaNN's custom ops, so the index is a separate artifact; it lives inside the
version it was built with, in the `assets.extra/` folder that TF Serving ignores (it looks there for warm-up
requests only), so a version and its index are written, copied and deleted together:

    <base_dir>/<name>/<version>/                              SavedModel (TF Serving layout)
    <base_dir>/<name>/<version>/tfdml_metadata.json           what the model takes and returns, how it was trained
    <base_dir>/<name>/<version>/assets.extra/tfdml_index/     ScannIndex of the gallery, embedded by this version

The export is atomic: the SavedModel, its metadata and (with `gallery=`) its index are written to a hidden
temporary directory under `<base_dir>/<name>/` (TF Serving only loads numeric version directories) and
renamed to `<version>` when complete, so a failed or interrupted export leaves nothing behind."""

from tfdml.export.client import ExportedEmbedder, read_image, rest_request_body
from tfdml.export.gallery import IndexMismatchError, export_index, load_index
from tfdml.export.layout import (
    EMBEDDING_OUTPUT,
    GALLERY_IMAGES_FILE,
    IMAGE_INPUT,
    INDEX_DIR,
    MAX_STORED_GALLERY_BYTES,
    METADATA_FILE,
    PREPROCESSED_INPUT,
    PREPROCESSED_SIGNATURE,
    SEARCH_SIGNATURE,
    SERVING_SIGNATURE,
    load_metadata,
    resolve_export_dir,
)
from tfdml.export.options import IndexOptions, SearchOptions, ServingOptions
from tfdml.export.prefix import PrefixIndex
from tfdml.export.savedmodel import export_saved_model
from tfdml.export.search import DEFAULT_TOP_K, GALLERY_DTYPES
from tfdml.export.serving import input_channels, model_image_size
from tfdml.models.preprocessing import resolve_preprocessing

__all__ = [
    "DEFAULT_TOP_K",
    "GALLERY_DTYPES",
    "SEARCH_SIGNATURE",
    "EMBEDDING_OUTPUT",
    "GALLERY_IMAGES_FILE",
    "IMAGE_INPUT",
    "INDEX_DIR",
    "MAX_STORED_GALLERY_BYTES",
    "METADATA_FILE",
    "PREPROCESSED_INPUT",
    "PREPROCESSED_SIGNATURE",
    "SERVING_SIGNATURE",
    "ExportedEmbedder",
    "IndexMismatchError",
    "IndexOptions",
    "PrefixIndex",
    "SearchOptions",
    "ServingOptions",
    "export_index",
    "export_saved_model",
    "input_channels",
    "load_index",
    "load_metadata",
    "model_image_size",
    "read_image",
    "resolve_export_dir",
    "resolve_preprocessing",
    "rest_request_body",
]
