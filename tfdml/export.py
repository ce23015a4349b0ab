"""Export an embedder as a plain TF Serving SavedModel, and its ScaNN gallery index beside it.

Stock TF Serving cannot load ScaNN's custom ops, so the model and the index are separate artifacts:

    <base_dir>/<name>/<version>/          SavedModel (TF Serving layout) + tfdml_metadata.json
    <base_dir>/<name>/index/              ScannIndex of the exported model's gallery embeddings

Signatures of the SavedModel:

- `serving_default`: input `images`, uint8 `[batch, height, width, channels]` (3, or 1 for grayscale models)
  of any size -> resized in the graph to
  the model's input size (bilinear), cast to float32 (0-255), preprocessed -> outputs `embedding`
  (L2-normalised) plus any other named outputs of the model (e.g. `level_L`, `level_M`, `level_H`).
- `embed_preprocessed`: input `preprocessed`, float32 `[batch, H, W, channels]` already resized and preprocessed ->
  the same outputs.

Model protocol (any Keras model works; tfdml embedders implement the optional parts):

- outputs: `model.export_outputs(x)` -> dict of named tensors containing `"embedding"` if defined, else
  `model(x, training=False)`: a tensor (becomes `embedding`) or a dict containing `"embedding"`;
- channels: `model.preprocessing_config()["channels"]`, else a static `model.input_shape[-1]`, else 3;
- input size: `image_size=` argument, else `model.preprocessing_config()["image_size"]`, else a static
  `model.input_shape[1:3]`;
- preprocessing: `preprocess=` argument, else `model.preprocessing_config()["preprocessing"]`. A spec is
  `None` / `"none"` (pixels 0-255 as floats), `"unit"` (pixels / 255), `"symmetric"` (pixels / 127.5 - 1),
  a dotted function name such as `"keras.applications.resnet50.preprocess_input"` (applied to 0-255
  floats), or a callable (recorded by its qualified name).

The export is atomic: it is written to a hidden temporary directory under `<base_dir>/<name>/` (TF Serving
only loads numeric version directories) and renamed to `<version>` when complete, so an interrupted export
never leaves a half-written version.
"""

import datetime
import importlib
import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

METADATA_FILE = "tfdml_metadata.json"
SERVING_SIGNATURE = "serving_default"
PREPROCESSED_SIGNATURE = "embed_preprocessed"
IMAGE_INPUT = "images"
PREPROCESSED_INPUT = "preprocessed"
EMBEDDING_OUTPUT = "embedding"
INDEX_DIR = "index"

_NAMED_PREPROCESSING = {
    "none": lambda x: x,
    "unit": lambda x: x / 255.0,
    "symmetric": lambda x: x / 127.5 - 1.0,
}


def resolve_preprocessing(spec):
    """`(function, json_name)` for a preprocessing spec (see the module docstring)."""
    if spec is None:
        spec = "none"
    if callable(spec):
        return spec, f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"
    if not isinstance(spec, str):
        raise TypeError(f"preprocess must be None, a string or a callable, got {type(spec).__name__}.")
    if spec in _NAMED_PREPROCESSING:
        return _NAMED_PREPROCESSING[spec], spec
    module_name, _, function_name = spec.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), function_name), spec
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"unknown preprocessing {spec!r}: use one of {sorted(_NAMED_PREPROCESSING)}, a "
                         f"dotted function name such as 'keras.applications.resnet50.preprocess_input', "
                         f"or a callable.") from error


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
    outputs[EMBEDDING_OUTPUT] = tf.math.l2_normalize(outputs[EMBEDDING_OUTPUT], axis=-1)
    return outputs


def _next_version(model_dir):
    versions = [int(entry) for entry in os.listdir(model_dir) if entry.isdigit()] \
        if os.path.isdir(model_dir) else []
    return max(versions, default=0) + 1


def _json_safe(value):
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))


def _compile_info(model):
    try:
        config = model.get_compile_config() if getattr(model, "compiled", False) else None
    except (AttributeError, TypeError, ValueError):
        config = None
    return _json_safe(config) if config else None


def export_saved_model(model, base_dir="exported_models", name=None, version=None, image_size=None,
                       preprocess=None, training_config=None, metrics=None, overwrite=False,
                       resize_method="bilinear"):
    """Writes `model` as a TF Serving SavedModel at `<base_dir>/<name>/<version>/` and returns that path.

    Args:
      model: a Keras model (see the module docstring for the optional protocol).
      base_dir: TF Serving's model base path.
      name: model name (the TF Serving `model_name`); default `model.name`.
      version: positive integer version; default one more than the largest existing version.
      image_size: `(height, width)` the graph resizes images to; default from the model.
      preprocess: pixel preprocessing spec; default from `model.preprocessing_config()`, else `"none"`.
      training_config, metrics: JSON-serialisable dicts copied into the metadata file (loss and training
        settings, evaluation results).
      overwrite: replace an existing version directory instead of raising `FileExistsError`.
      resize_method: `tf.image.resize` method used in the graph.

    Example:
      >>> path = export_saved_model(embedder, "exported_models", name="cub", metrics=results)
      >>> # tensorflow_model_server --rest_api_port=8501 --model_name=cub --model_base_path=$PWD/exported_models/cub
    """
    import keras

    name = name or model.name
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(f"name must be a plain directory name, got {name!r}.")
    config = _model_preprocessing_config(model)
    height, width = _resolve_image_size(model, image_size, config)
    preprocess_fn, preprocess_name = resolve_preprocessing(
        preprocess if preprocess is not None else config.get("preprocessing"))
    channels = _resolve_channels(model, config)

    def embed_preprocessed(preprocessed):
        return _named_outputs(model, preprocessed)

    def embed_images(images):
        pixels = tf.image.resize(tf.cast(images, tf.float32), (height, width), method=resize_method)
        return _named_outputs(model, preprocess_fn(pixels))

    image_spec = tf.TensorSpec([None, None, None, channels], tf.uint8, name=IMAGE_INPUT)
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
        "format": "tfdml.export/1",
        "name": name,
        "version": version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "embedding_dim": outputs[EMBEDDING_OUTPUT],
        "outputs": outputs,
        "embedding_normalized": True,
        "distance": "dot_product",
        "input": {"signature": SERVING_SIGNATURE, "name": IMAGE_INPUT, "dtype": "uint8",
                  "shape": [None, None, None, channels]},
        "image_size": [height, width],
        "resize_method": resize_method,
        "preprocessing": preprocess_name,
        "signatures": {
            SERVING_SIGNATURE: {"inputs": {IMAGE_INPUT: f"uint8 [batch, height, width, {channels}]"},
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
    staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=model_dir)
    try:
        written = os.path.join(staging, "model")
        archive.write_out(written, verbose=False)
        with open(os.path.join(written, METADATA_FILE), "w") as f:
            json.dump(metadata, f, indent=2)
        if os.path.exists(target):  # overwrite=True: swap the old version out of the way first
            os.rename(target, os.path.join(staging, "previous"))
        os.rename(written, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_export_dir(path, version=None):
    """The version directory for `path`: a version directory itself, or `<base>/<name>` (latest version)."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    if version is not None:
        candidate = os.path.join(path, str(version))
        if not os.path.exists(os.path.join(candidate, "saved_model.pb")):
            raise FileNotFoundError(f"no exported version {version} in {path!r}.")
        return candidate
    versions = sorted(int(v) for v in os.listdir(path) if v.isdigit()) if os.path.isdir(path) else []
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
        self.output = output
        self._loaded = tf.saved_model.load(self.path)
        self._serve = self._loaded.signatures[SERVING_SIGNATURE]
        self.channels = int(self.metadata["input"]["shape"][-1])

    def embed(self, images, batch_size=64):
        """Embeds uint8 images: an array `[N, H, W, C]` or a list of `[H, W, C]` arrays of any sizes."""
        if isinstance(images, np.ndarray) and images.ndim == 4:
            batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
        else:
            batches = [np.asarray(image)[None] for image in images]  # sizes may differ: one at a time
        parts = []
        for batch in batches:
            batch = np.asarray(batch)
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
    """Decodes a JPEG / PNG / BMP / GIF file to uint8 `[H, W, channels]`."""
    data = tf.io.read_file(os.fspath(path))
    return tf.io.decode_image(data, channels=channels, expand_animations=False).numpy()


def _gallery_batches(gallery, channels=3):
    """Yields `(uint8 images or list of images, labels or None)` from the supported gallery inputs."""
    if isinstance(gallery, tf.data.Dataset):
        for element in gallery.as_numpy_iterator():
            if isinstance(element, dict):
                images, labels = element["image"], element.get("label")
            elif isinstance(element, tuple):
                images, labels = element[0], element[1] if len(element) > 1 else None
            else:
                images, labels = element, None
            images = np.asarray(images)
            yield (images[None] if images.ndim == 3 else images), labels  # unbatched datasets too
    elif isinstance(gallery, np.ndarray):
        yield gallery, None
    else:
        yield [read_image(p, channels) for p in gallery], None


def export_index(gallery, base_dir="exported_models", name=None, version=None, ids=None, labels=None,
                 distance="dot_product", mode="auto", batch_size=64, **index_settings):
    """Embeds a gallery with the exported model and writes a `ScannIndex` to `<base_dir>/<name>/index/`.

    Args:
      gallery: uint8 images `[N, H, W, 3]`, a list of image file paths (then the default `ids` are the
        paths, so `tfdml search` can show the neighbours), or a `tf.data.Dataset` of image batches,
        `(images, labels)` batches or `{"image", "label"}` dicts.
      name, version: the exported model (default: the latest version under `<base_dir>/<name>`).
      ids, labels: optional per-image ids and class labels stored with the index.
      distance, mode, index_settings: passed to `ScannIndex` (`dot_product` suits the L2-normalised output).

    Returns the `ScannIndex` (already saved).
    """
    from tfdml.retrieval import ScannIndex

    if not name:
        raise ValueError("name is required: the exported model lives at <base_dir>/<name>/<version>.")
    model_dir = os.path.join(os.fspath(base_dir), name)
    embedder = ExportedEmbedder(model_dir, version)
    embeddings, found_labels = [], []
    for images, batch_labels in _gallery_batches(gallery, embedder.channels):
        embeddings.append(embedder.embed(images, batch_size=batch_size))
        if batch_labels is not None:
            found_labels.append(np.asarray(batch_labels).reshape(-1))
    embeddings = np.concatenate(embeddings, axis=0)
    if labels is None and found_labels:
        labels = np.concatenate(found_labels)
    if ids is None and not isinstance(gallery, (np.ndarray, tf.data.Dataset)):
        ids = np.asarray([os.path.abspath(os.fspath(p)) for p in gallery])
    index = ScannIndex(embeddings, ids=ids, labels=labels, distance=distance, mode=mode,
                       metadata={"model_version": embedder.metadata["version"], "model_name": name},
                       **index_settings)
    index.save(os.path.join(model_dir, INDEX_DIR))
    return index
