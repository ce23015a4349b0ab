"""Export an embedder as a plain TF Serving SavedModel, with its ScaNN gallery index inside the version.

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

import dataclasses
import datetime
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from tfdml.data.preprocessing import eval_image, eval_settings
from tfdml.models.preprocessing import resolve_preprocessing  # noqa: F401  (part of this module's API)

METADATA_FILE = "tfdml_metadata.json"
SERVING_SIGNATURE = "serving_default"
PREPROCESSED_SIGNATURE = "embed_preprocessed"
IMAGE_INPUT = "images"
PREPROCESSED_INPUT = "preprocessed"
EMBEDDING_OUTPUT = "embedding"
# Inside the version directory: TF Serving ignores `assets.extra/` (it only reads warm-up requests there).
INDEX_DIR = os.path.join("assets.extra", "tfdml_index")
# Gallery pixels kept with an index of in-memory images (no file paths to show), up to this size.
GALLERY_IMAGES_FILE = "gallery_images.npy"
MAX_STORED_GALLERY_BYTES = 64 * 2**20

def _model_preprocessing_config(model):
    config = getattr(model, "preprocessing_config", None)
    if callable(config):
        config = config()
    return dict(config or {})


def _resolve_image_size(model, image_size, config):
    size = image_size or config.get("image_size")
    if size is None:
        shape = getattr(model, "input_shape", None)
        if isinstance(shape, tuple) and len(shape) == 4 and shape[1] and shape[2]:
            size = shape[1:3]
    if size is None:
        raise ValueError(f"cannot tell the input size of model {model.name!r}: pass image_size=(height, "
                         f"width) or give the model a preprocessing_config() with 'image_size'.")
    if isinstance(size, int):
        size = (size, size)
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be (height, width) with positive entries, got {size}.")
    return size


def _resolve_channels(model, config):
    shape = getattr(model, "input_shape", None)
    static = shape[-1] if isinstance(shape, tuple) and len(shape) == 4 else None
    channels = int(config.get("channels") or static or 3)
    if channels not in (1, 3):
        raise ValueError(f"exported models take 1- or 3-channel images, the model wants {channels}.")
    return channels


def input_channels(model):
    """The channel count (1 or 3) the exported model works on (see the module docstring)."""
    return _resolve_channels(model, _model_preprocessing_config(model))


def _named_outputs(model, images):
    if hasattr(model, "export_outputs"):
        outputs = model.export_outputs(images)
    else:
        outputs = model(images, training=False)
    if isinstance(outputs, dict):
        if EMBEDDING_OUTPUT not in outputs:
            raise ValueError(f"the model's dict output must contain {EMBEDDING_OUTPUT!r}, got keys "
                             f"{sorted(outputs)}.")
        outputs = dict(outputs)
    elif isinstance(outputs, (list, tuple)):
        raise ValueError("the model returns a list of outputs; return a dict with an 'embedding' key (or "
                         "define export_outputs(x)) so each output gets a name.")
    else:
        outputs = {EMBEDDING_OUTPUT: outputs}
    outputs = {key: tf.cast(value, tf.float32) for key, value in outputs.items()}
    if not getattr(model, "embedding_normalized", False):
        # Normalising a unit vector again moves it by an ulp, enough to swap near-tied neighbours: a model
        # whose embedding is unit-norm already (tfdml embedders) is served exactly as Keras computes it.
        outputs[EMBEDDING_OUTPUT] = tf.math.l2_normalize(outputs[EMBEDDING_OUTPUT], axis=-1)
    return outputs


def _next_version(model_dir):
    versions = [int(entry) for entry in os.listdir(model_dir) if entry.isdigit()] \
        if os.path.isdir(model_dir) else []
    return max(versions, default=0) + 1


def _json_safe(value):
    """JSON-compatible copy (dataclasses, e.g. a typed job configuration, become dicts; arrays lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else (
        dataclasses.asdict(v) if dataclasses.is_dataclass(v) else str(v))))


def _compile_info(model):
    try:
        config = model.get_compile_config() if getattr(model, "compiled", False) else None
    except (AttributeError, TypeError, ValueError):
        config = None
    return _json_safe(config) if config else None


def _serving_images(images, channels):
    """uint8 `[N, H, W, c]` -> float32 `[N, H, W, channels]`, with clear errors for what cannot be served."""
    shape = tf.shape(images)
    given = shape[3]
    checks = [
        tf.debugging.assert_positive(shape[0], message="empty batch: send at least one image"),
        tf.debugging.assert_positive(shape[1] * shape[2], message="an image has height or width 0"),
        tf.debugging.Assert(tf.logical_or(tf.equal(given, 1), tf.equal(given, 3)), [
            f"images must have 1 (grayscale) or 3 (RGB) channels; this {channels}-channel model converts "
            "between the two. Got channels:", given]),
    ]
    with tf.control_dependencies(checks):
        pixels = tf.cast(images, tf.float32)
    if channels == 1:
        luma = tf.constant([[0.299], [0.587], [0.114]], tf.float32)
        pixels = tf.cond(tf.equal(given, 3), lambda: tf.tensordot(pixels, luma, axes=[[3], [0]]),
                         lambda: pixels[..., :1])
    else:
        pixels = tf.cond(tf.equal(given, 1), lambda: tf.tile(pixels[..., :1], [1, 1, 1, 3]),
                         lambda: pixels[..., :3])
    return tf.ensure_shape(pixels, [None, None, None, channels])


def _fingerprint(version_dir):
    """The SavedModel's checksum (`fingerprint.pb`), which ties an index to the exact model it embeds."""
    try:
        # Graph, signatures, object graph and checkpoint hashes: other weights give another fingerprint.
        return tf.saved_model.experimental.read_fingerprint(os.fspath(version_dir)).singleprint()
    except Exception:  # older SavedModels have no fingerprint.pb
        return None


def export_saved_model(model, base_dir="exported_models", name=None, version=None, image_size=None,
                       preprocess=None, training_config=None, metrics=None, overwrite=False,
                       center_crop=True, resize=None, gallery=None, gallery_ids=None, gallery_labels=None,
                       class_names=None, index_mode="auto", batch_size=64, index_settings=None):
    """Writes `model` as a TF Serving SavedModel at `<base_dir>/<name>/<version>/` and returns that path.

    Args:
      model: a Keras model (see the module docstring for the optional protocol).
      base_dir: TF Serving's model base path.
      name: model name (the TF Serving `model_name`); default `model.name`.
      version: positive integer version; default one more than the largest existing version.
      image_size: `(height, width)` the model takes; default from the model.
      preprocess: pixel preprocessing spec of the graph, for a model that does not preprocess its raw input
        itself; default from `model.preprocessing_config()`, else `"none"`. A tfdml embedder applies its own
        (a different spec here is refused rather than applied twice).
      training_config, metrics: JSON-serialisable dicts copied into the metadata file (loss and training
        settings, evaluation results); omitted from the metadata when not given.
      overwrite: replace an existing version directory instead of raising `FileExistsError`.
      center_crop, resize: the geometry of `tfdml.data.eval_image` (defaults: resize to
        `image_size * 256 / 224`, centre crop `image_size`, as `tfdml.data.eval_dataset` evaluates). Pass
        what the evaluation used, so that the served function is the evaluated one.
      gallery: optional gallery to index inside the version (see `export_index` for the accepted forms,
        e.g. a `tfdml.data.Source`); the index is built with the written SavedModel before the version
        appears, so a version never exists without the index it was exported with.
      gallery_ids, gallery_labels, class_names, index_mode, batch_size, index_settings: for the index (see
        `export_index`).

    Example:
      >>> path = export_saved_model(embedder, "exported_models", name="cub", metrics=results,
      ...                           gallery=tfdml.data.image_folder("cub/test"))
      >>> # tensorflow_model_server --rest_api_port=8501 --model_name=cub --model_base_path=$PWD/exported_models/cub
    """
    import keras

    name = name or model.name
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(f"name must be a plain directory name, got {name!r}.")
    config = _model_preprocessing_config(model)
    height, width = _resolve_image_size(model, image_size, config)
    in_model = bool(config.get("applied_by_model"))
    preprocess_fn, preprocess_name = resolve_preprocessing(
        preprocess if preprocess is not None else config.get("preprocessing"))
    if in_model:
        # The model preprocesses its raw input itself: the graph must not do it a second time.
        own = resolve_preprocessing(config.get("preprocessing"))[1]
        if preprocess_name != own:
            raise ValueError(f"model {model.name!r} applies its own pixel preprocessing ({own!r}) to raw 0-255 "
                             f"pixels; preprocess={preprocess_name!r} would preprocess them a second time. "
                             "Leave preprocess unset.")
        preprocess_fn = resolve_preprocessing(None)[0]
    channels = _resolve_channels(model, config)
    geometry = eval_settings((height, width), center_crop, resize)

    def embed_preprocessed(preprocessed):
        return _named_outputs(model, preprocessed)

    def embed_images(images):
        pixels = _serving_images(images, channels)
        return _named_outputs(model, eval_image(pixels, (height, width), center_crop, resize, preprocess_fn))

    image_spec = tf.TensorSpec([None, None, None, None], tf.uint8, name=IMAGE_INPUT)
    float_spec = tf.TensorSpec([None, height, width, channels], tf.float32, name=PREPROCESSED_INPUT)
    archive = keras.export.ExportArchive()
    archive.track(model)
    # The argument names (`images`, `preprocessed`) become the signatures' input names.
    serve = tf.function(embed_images, input_signature=[image_spec])
    archive.add_endpoint(SERVING_SIGNATURE, serve)
    archive.add_endpoint(PREPROCESSED_SIGNATURE, tf.function(embed_preprocessed, input_signature=[float_spec]))
    output_shapes = serve.get_concrete_function().structured_outputs
    outputs = {key: int(value.shape[-1]) if value.shape[-1] is not None else None
               for key, value in output_shapes.items()}

    model_dir = os.path.abspath(os.path.join(os.fspath(base_dir), name))
    os.makedirs(model_dir, exist_ok=True)
    version = _next_version(model_dir) if version is None else int(version)
    if version < 1:
        raise ValueError(f"version must be a positive integer, got {version}.")
    target = os.path.join(model_dir, str(version))
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(f"{target} already exists; pass overwrite=True or another version.")

    metadata = {
        "format": "tfdml.export/2",
        "name": name,
        "version": version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "embedding_dim": outputs[EMBEDDING_OUTPUT],
        "outputs": outputs,
        "embedding_normalized": True,
        "distance": "dot_product",
        "input": {"signature": SERVING_SIGNATURE, "name": IMAGE_INPUT, "dtype": "uint8",
                  "shape": [None, None, None, channels], "channels": channels,
                  "channel_conversion": "1 <-> 3 channels converted in the graph (RGB -> luma "
                                        "0.299 R + 0.587 G + 0.114 B; gray -> repeated)"},
        "image_size": [height, width],
        "eval_image": geometry,  # tfdml.data.eval_image(image_size, center_crop, resize)
        "preprocessing": preprocess_name,
        "preprocessing_in_model": in_model,  # else applied by the serving graph before the model
        "signatures": {
            SERVING_SIGNATURE: {"inputs": {IMAGE_INPUT: "uint8 [batch, height, width, 1 or 3]"},
                                "outputs": sorted(outputs)},
            PREPROCESSED_SIGNATURE: {
                "inputs": {PREPROCESSED_INPUT: f"float32 [batch, {height}, {width}, {channels}]"},
                "outputs": sorted(outputs)},
        },
        "model": {"class": type(model).__name__, "name": model.name},
        "compile_config": _compile_info(model),
        "training_config": _json_safe(training_config) if training_config else None,
        "metrics": _json_safe(metrics) if metrics else None,
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    }
    metadata = {key: value for key, value in metadata.items() if value is not None}  # unknown: left out
    staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=model_dir)
    try:
        written = os.path.join(staging, "model")
        archive.write_out(written, verbose=False)
        _write_json(os.path.join(written, METADATA_FILE), metadata)
        if gallery is not None:
            index = _build_index(written, gallery, gallery_ids, gallery_labels, class_names, index_mode,
                                 batch_size, index_settings or {})
            metadata["index"] = _index_summary(index)
            _write_json(os.path.join(written, METADATA_FILE), metadata)
        if os.path.exists(target):  # overwrite=True: swap the old version out of the way first
            os.rename(target, os.path.join(staging, "previous"))
        os.rename(written, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)


def resolve_export_dir(path, version=None):
    """The version directory for `path`: a version directory itself, or `<base>/<name>` (latest version,
    or `version`)."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        if version is not None and os.path.basename(os.path.normpath(path)) != str(version):
            raise ValueError(f"{path!r} is a version directory; --version {version} asks for another one "
                             f"(pass <base>/<name> with --version, or the version directory alone).")
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no exported model at {path!r} (not a directory).")
    versions = sorted(int(v) for v in os.listdir(path) if v.isdigit()
                      and os.path.exists(os.path.join(path, v, "saved_model.pb")))
    if version is not None:
        if int(version) not in versions:
            raise FileNotFoundError(f"no exported version {version} in {path!r} (versions: "
                                    f"{', '.join(map(str, versions)) or 'none'}).")
        return os.path.join(path, str(int(version)))
    if not versions:
        raise FileNotFoundError(f"{path!r} holds no exported model (no saved_model.pb and no numeric "
                                f"version directory).")
    return os.path.join(path, str(versions[-1]))


def load_metadata(path, version=None):
    """The metadata dict written beside an exported model."""
    with open(os.path.join(resolve_export_dir(path, version), METADATA_FILE)) as f:
        return json.load(f)


class ExportedEmbedder:
    """Runs an exported SavedModel (no tfdml model code needed): `embed(uint8_images) -> [N, D]`.

    Args:
      path: version directory or `<base>/<name>` (latest version).
      output: which named output to return (`"embedding"` by default, or a level).
    """

    def __init__(self, path, version=None, output=EMBEDDING_OUTPUT):
        self.path = resolve_export_dir(path, version)
        self.metadata = load_metadata(self.path)
        self.version = int(self.metadata["version"])
        self.name = self.metadata["name"]
        self.output = output
        self._loaded = tf.saved_model.load(self.path)
        self._serve = self._loaded.signatures[SERVING_SIGNATURE]
        self.channels = int(self.metadata["input"].get("channels") or self.metadata["input"]["shape"][-1])

    def embed(self, images, batch_size=64):
        """Embeds uint8 images: an array `[N, H, W, C]` or a list of `[H, W, C]` arrays of any sizes
        (consecutive images of one size go in one batch)."""
        if isinstance(images, np.ndarray) and images.ndim == 4:
            batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
        else:
            batches = []
            for image in images:
                image = np.asarray(image)
                if image.ndim == 2:
                    image = image[..., None]
                if batches and batches[-1][-1].shape == image.shape and len(batches[-1]) < batch_size:
                    batches[-1].append(image)
                else:
                    batches.append([image])
        parts = []
        for batch in batches:
            batch = np.asarray(batch) if isinstance(batch, np.ndarray) else np.stack(batch)
            if batch.dtype != np.uint8:
                raise TypeError(f"images must be uint8 pixels, got dtype {batch.dtype}.")
            parts.append(self._serve(**{IMAGE_INPUT: tf.constant(batch)})[self.output].numpy())
        if not parts:
            raise ValueError("no images to embed.")
        return np.concatenate(parts, axis=0)


def rest_request_body(images, signature_name=SERVING_SIGNATURE):
    """JSON body for TF Serving's REST predict API (`POST /v1/models/<name>:predict`), columnar format.

    `images`: uint8 `[N, H, W, channels]`. The response is `{"outputs": {"embedding": [[...], ...], ...}}`.
    """
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"images must be uint8 [batch, height, width, 3 or 1], got {images.dtype} "
                         f"{images.shape}.")
    return {"signature_name": signature_name, "inputs": {IMAGE_INPUT: images.tolist()}}


def read_image(path, channels=3):
    """Decodes an image file (JPEG, PNG, BMP, GIF, WebP; TIFF through Pillow) to uint8 `[H, W, channels]`;
    `tfdml.data.ImageReadError` (a `ValueError` naming the file) when it cannot."""
    from tfdml.data.sources import decode_image_file

    return decode_image_file(path, channels)


class _Gallery:
    """What an index is built from: images to embed (in batches), ids, labels, class names, pixels to keep."""

    def __init__(self, batches, ids=None, labels=None, class_names=None, images=None, source=None, kept=None):
        self.batches, self.ids, self.labels = batches, ids, labels
        self.class_names, self.images, self.source = class_names, images, source
        self.kept = kept  # positions of the given items that could be read (None: all of them)


def _source_gallery(source):
    from tfdml.data.sources import load_items

    images, kept = load_items(source)
    paths = getattr(source, "paths", None)
    ids = np.asarray([os.path.abspath(paths[i]) for i in kept]) if paths is not None else kept
    stored = None
    if paths is None and images and sum(image.nbytes for image in images) <= MAX_STORED_GALLERY_BYTES \
            and len({image.shape for image in images}) == 1:
        stored = np.stack(images)
    return _Gallery([images], ids, source.labels[kept], getattr(source, "class_names", None), stored,
                    source=source.name, kept=kept)


def _path_gallery(paths, channels):
    from tfdml.data.sources import read_image_files

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
    from tfdml.data.sources import Source

    if isinstance(gallery, Source):
        return _source_gallery(gallery)
    if isinstance(gallery, tf.data.Dataset):
        return _dataset_gallery(gallery)
    if isinstance(gallery, np.ndarray):
        stored = gallery if gallery.nbytes <= MAX_STORED_GALLERY_BYTES else None
        return _Gallery([gallery], images=stored)
    return _path_gallery(list(gallery), channels)


def _build_index(version_dir, gallery, ids, labels, class_names, mode, batch_size, settings,
                 distance="dot_product"):
    """Embeds `gallery` with the SavedModel in `version_dir` and saves the index inside it."""
    from tfdml.retrieval import ScannIndex

    embedder = ExportedEmbedder(version_dir)
    found = _gallery(gallery, embedder.channels)
    embeddings, found_labels = [], []
    for batch in found.batches:
        if isinstance(batch, tuple):
            batch, batch_labels = batch
            if batch_labels is not None:
                found_labels.append(np.asarray(batch_labels).reshape(-1))
        if len(batch):
            embeddings.append(embedder.embed(batch, batch_size=batch_size))
    if not embeddings:
        raise ValueError("the gallery holds no readable image: nothing to index.")
    embeddings = np.concatenate(embeddings, axis=0)
    if found.kept is not None:  # ids / labels given for every item: keep those of the readable ones
        ids = None if ids is None else np.asarray(ids)[found.kept]
        labels = None if labels is None else np.asarray(labels)[found.kept]
    if labels is None:
        labels = found.labels if found.labels is not None else (
            np.concatenate(found_labels) if found_labels else None)
    if ids is None:
        ids = found.ids
    class_names = class_names if class_names is not None else found.class_names
    metadata = {"model_name": embedder.name, "model_version": embedder.version,
                "model_fingerprint": _fingerprint(version_dir), "gallery": found.source}
    index = ScannIndex(embeddings, ids=ids, labels=labels, distance=distance, mode=mode,
                       class_names=class_names, metadata={k: v for k, v in metadata.items() if v is not None},
                       **settings)
    arrays = {GALLERY_IMAGES_FILE: found.images} if found.images is not None else None
    index.save(os.path.join(version_dir, INDEX_DIR), arrays=arrays)
    return index


def _index_summary(index):
    return {"path": INDEX_DIR, "size": int(index.size), "distance": index.distance, "mode": index.mode,
            "ids": "none" if index.ids is None else ("paths" if index.ids.dtype.kind == "U" else "indices"),
            "has_labels": index.labels is not None,
            "classes": 0 if index.labels is None else int(len(np.unique(index.labels)))}


def export_index(gallery, base_dir="exported_models", name=None, version=None, ids=None, labels=None,
                 class_names=None, mode="auto", batch_size=64, **index_settings):
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
      mode, index_settings: passed to `ScannIndex` (dot products: the embeddings are L2-normalised).

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
    from tfdml.retrieval import ScannIndex

    embedder = ExportedEmbedder(model_path, version)
    directory = index_dir or os.path.join(embedder.path, INDEX_DIR)
    if not os.path.isdir(directory):
        shared = os.path.join(os.path.dirname(os.path.abspath(embedder.path)), "index")
        hint = (f" (the index at {shared} is of the old layout, shared by every version and possibly built "
                f"with another one: it is not used)") if os.path.isdir(shared) else ""
        raise FileNotFoundError(
            f"{embedder.path} (model {embedder.name!r} version {embedder.version}) has no gallery index{hint}: "
            f"build one with 'tfdml export --model MODEL.keras --name {embedder.name} --version "
            f"{embedder.version} --gallery-dir DIR' or tfdml.export.export_index(...).")
    index = ScannIndex.load(directory)
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
            f"export_index) or use the version it belongs to.")
    return embedder, index
