"""Export an embedder as a plain TF Serving SavedModel, with its ScaNN gallery index inside the version.

Modules: `savedmodel` (the SavedModel, its signatures and metadata), `gallery` (reading a gallery, building
and loading its index), `layout` (names and paths inside a version), `client` (using an export from outside).
Everything public is re-exported here: `tfdml.export.export_saved_model`, ...

Stock TF Serving cannot load ScaNN's custom ops, so the index is a separate artifact; it lives inside the
version it was built with, in the `assets.extra/` folder that TF Serving ignores (it is where TF Serving
looks for warm-up requests only), so a version and its index are written, copied and deleted together:

    <base_dir>/<name>/<version>/                              SavedModel (TF Serving layout)
    <base_dir>/<name>/<version>/tfdml_metadata.json           what the model takes and returns, how it was trained
    <base_dir>/<name>/<version>/assets.extra/tfdml_index/     ScannIndex of the gallery, embedded by this version

Signatures of the SavedModel:

- `serving_default`: input `images`, uint8 `[batch, height, width, channels]` of any size; 1-channel images
  sent to an RGB model are repeated to 3 channels and RGB images sent to a grayscale model are converted
  to luma (ITU-R 601: 0.299 R + 0.587 G + 0.114 B); other channel counts, an empty batch or empty images
  fail with an `InvalidArgumentError` that says so. The images go through `tfdml.data.eval_image` (the
  preprocessing the job evaluated with: resize to `resize`, centre crop `image_size`, pixel
  preprocessing) -> outputs `embedding` (L2-normalised) plus any other named outputs of the model (e.g.
  `L`, `M`, `H`).
- `embed_preprocessed`: input `preprocessed`, float32 `[batch, H, W, channels]` as the model takes it (for
  a tfdml embedder, which preprocesses itself: 0-255 pixels at its input size; for other models, already
  preprocessed) -> the same outputs.

Model protocol (any Keras model works; tfdml embedders implement the optional parts):

- outputs: `model.export_outputs(x)` -> dict of named tensors containing `"embedding"` if defined, else
  `model(x, training=False)`: a tensor (becomes `embedding`) or a dict containing `"embedding"`; the
  embedding is L2-normalised in the graph unless `model.embedding_normalized` says it is already;
- channels: `model.preprocessing_config()["channels"]`, else a static `model.input_shape[-1]`, else 3;
- input size: `image_size=` argument, else `model.preprocessing_config()["image_size"]`, else a static
  `model.input_shape[1:3]`;
- preprocessing: a model whose `preprocessing_config()` says `"applied_by_model": True` (every tfdml
  embedder: its first layer, `tfdml.models.preprocessing.PixelPreprocessing`) takes raw 0-255 pixels and
  preprocesses them itself, so the graph only converts channels, resizes and crops (`preprocess=` may only
  repeat the model's own spec). For other models the graph applies `preprocess=`, else
  `model.preprocessing_config()["preprocessing"]`. A spec (`tfdml.models.preprocessing`) is `None` /
  `"none"` (pixels 0-255 as floats), `"unit"` (pixels / 255), `"symmetric"` (pixels / 127.5 - 1), a dotted
  function name such as `"keras.applications.resnet50.preprocess_input"` (applied to 0-255 floats), or a
  callable (recorded by its qualified name). Either way the metadata's `preprocessing` names the pixel
  preprocessing of the served function and `preprocessing_in_model` says where it happens.

The export is atomic: the SavedModel, its metadata and (with `gallery=`) its index are written to a hidden
temporary directory under `<base_dir>/<name>/` (TF Serving only loads numeric version directories) and
renamed to `<version>` when complete, so a failed or interrupted export leaves nothing behind.
"""

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
from tfdml.export.savedmodel import export_saved_model, input_channels, model_image_size, resolve_preprocessing
from tfdml.export.search import DEFAULT_TOP_K, GALLERY_DTYPES

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
