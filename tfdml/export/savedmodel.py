"""`export_saved_model`: a Keras embedder -> TF Serving SavedModel (signatures, metadata, atomic write).

Signatures: `serving_default` takes `images`, uint8 `[batch, height, width, channels]` of any size (1-channel
images sent to an RGB model are repeated, RGB sent to a grayscale model converted to luma, ITU-R 601; other
channel counts, an empty batch or empty images fail with an `InvalidArgumentError` that says so), runs
`tfdml.data.eval_image` (resize, centre crop, pixel preprocessing: what the job evaluated with) and returns
`embedding` (L2-normalised) plus the model's other named outputs (`L`, `M`, `H`); `embed_preprocessed` takes
`preprocessed`, float32 `[batch, H, W, channels]` as the model takes it, and returns the same outputs.

Model protocol (any Keras model works; tfdml embedders implement the optional parts):

- outputs: `model.export_outputs(x)` (a dict with `"embedding"`), else `model(x, training=False)`: a tensor
  or a dict with `"embedding"`; L2-normalised in the graph unless `model.embedding_normalized` says it is;
- channels: `model.preprocessing_config()["channels"]`, else a static `model.input_shape[-1]`, else 3; input
  size: `image_size=`, else `preprocessing_config()["image_size"]`, else a static `model.input_shape[1:3]`;
- preprocessing: a model whose `preprocessing_config()` says `"applied_by_model": True` (every tfdml embedder)
  takes raw 0-255 pixels and preprocesses them itself (`preprocess=` may only repeat its spec); for other
  models the graph applies `preprocess=`, else `preprocessing_config()["preprocessing"]`. A spec
  (`tfdml.models.preprocessing`) is `None` / `"none"`, `"unit"` (pixels / 255), `"symmetric"` (to [-1, 1]),
  a dotted function name such as `"keras.applications.resnet50.preprocess_input"`, or a callable. The
  metadata's `preprocessing` names it and `preprocessing_in_model` says where it happens."""

import dataclasses
import datetime
import errno
import json
import math
import os
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from tfdml.data.preprocessing import eval_image, eval_settings
from tfdml.export.client import embed_uint8
from tfdml.export.gallery import _index_summary, embed_gallery, save_index
from tfdml.export.layout import (
    EMBEDDING_OUTPUT,
    IMAGE_INPUT,
    METADATA_FILE,
    PREPROCESSED_INPUT,
    PREPROCESSED_SIGNATURE,
    SEARCH_SIGNATURE,
    SERVING_SIGNATURE,
    _write_json,
)
from tfdml.export.prefix import signature_prefix_record
from tfdml.export.search import (
    DEFAULT_BLOCK_ROWS,
    DEFAULT_TOP_K,
    GALLERY_DTYPES,
    GallerySearch,
    item_strings,
    search_signature_info,
)
from tfdml.models.preprocessing import resolve_preprocessing
from tfdml.retrieval import expansion
from tfdml.retrieval.calibration import MODES as CALIBRATION_MODES
from tfdml.retrieval.calibration import calibrate
from tfdml.retrieval_options import TARGET_RECALL as DEFAULT_TARGET_RECALL


def _model_preprocessing_config(model):
    config = getattr(model, "preprocessing_config", None)
    if callable(config):
        config = config()
    return dict(config or {})


def model_image_size(model):
    """The input size the model states (its `preprocessing_config()['image_size']`, else the static
    height and width of its input), or None when it leaves it open."""
    size = _model_preprocessing_config(model).get("image_size")
    if size is None:
        shape = getattr(model, "input_shape", None)
        if isinstance(shape, tuple) and len(shape) == 4 and shape[1] and shape[2]:
            size = shape[1:3]
    return size


def _resolve_image_size(model, image_size, config):
    size = image_size or config.get("image_size") or model_image_size(model)
    if size is None:
        raise ValueError(
            f"cannot tell the input size of model {model.name!r}: pass image_size=(height, "
            f"width) or give the model a preprocessing_config() with 'image_size'."
        )
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
            raise ValueError(f"the model's dict output must contain {EMBEDDING_OUTPUT!r}, got keys {sorted(outputs)}.")
        outputs = dict(outputs)
    elif isinstance(outputs, (list, tuple)):
        raise ValueError(
            "the model returns a list of outputs; return a dict with an 'embedding' key (or "
            "define export_outputs(x)) so each output gets a name."
        )
    else:
        outputs = {EMBEDDING_OUTPUT: outputs}
    outputs = {key: tf.cast(value, tf.float32) for key, value in outputs.items()}
    if not getattr(model, "embedding_normalized", False):
        # Normalising a unit vector again moves it by an ulp, enough to swap near-tied neighbours: a model
        # whose embedding is unit-norm already (tfdml embedders) is served exactly as Keras computes it.
        outputs[EMBEDDING_OUTPUT] = tf.math.l2_normalize(outputs[EMBEDDING_OUTPUT], axis=-1)
    return outputs


def _next_version(model_dir):
    versions = [int(entry) for entry in os.listdir(model_dir) if entry.isdigit()] if os.path.isdir(model_dir) else []
    return max(versions, default=0) + 1


def _json_safe(value):
    """JSON-compatible copy (dataclasses, e.g. a typed job configuration, become dicts; arrays lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(
        json.dumps(
            value,
            default=lambda v: (
                v.tolist()
                if hasattr(v, "tolist")
                else (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else str(v))
            ),
        )
    )


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
        tf.debugging.Assert(
            tf.logical_or(tf.equal(given, 1), tf.equal(given, 3)),
            [
                f"images must have 1 (grayscale) or 3 (RGB) channels; this {channels}-channel model converts "
                "between the two. Got channels:",
                given,
            ],
        ),
    ]
    with tf.control_dependencies(checks):
        pixels = tf.cast(images, tf.float32)
    if channels == 1:
        luma = tf.constant([[0.299], [0.587], [0.114]], tf.float32)
        pixels = tf.cond(
            tf.equal(given, 3), lambda: tf.tensordot(pixels, luma, axes=[[3], [0]]), lambda: pixels[..., :1]
        )
    else:
        pixels = tf.cond(tf.equal(given, 1), lambda: tf.tile(pixels[..., :1], [1, 1, 1, 3]), lambda: pixels[..., :3])
    return tf.ensure_shape(pixels, [None, None, None, channels])


def export_saved_model(
    model,
    base_dir="exported_models",
    name=None,
    version=None,
    image_size=None,
    preprocess=None,
    training_config=None,
    metrics=None,
    overwrite=False,
    center_crop=True,
    resize=None,
    gallery=None,
    gallery_ids=None,
    gallery_labels=None,
    class_names=None,
    index_mode="auto",
    batch_size=64,
    index_settings=None,
    search=True,
    top_k=DEFAULT_TOP_K,
    gallery_dtype="float32",
    match_precision=0.9,
    calibration=None,
    search_block_rows=DEFAULT_BLOCK_ROWS,
    match_mode="auto",
    search_dims=None,
    query_expansion=0,
    database_augmentation=0,
    expansion_alpha=3.0,
):
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
        e.g. a `tfdml.data.Source`); it is embedded by the serving function that is written, and its index
        is saved before the version appears, so a version never exists without the index it was exported
        with.
      gallery_ids, gallery_labels, class_names, index_mode, batch_size, index_settings: for the index (see
        `export_index`).
      search: with a gallery, also write the `search` signature (`tfdml.export.search`): uint8 images in,
        the `top_k` nearest gallery items out (`scores`, `labels`, `ids`, `match`) with the `embedding`,
        the gallery held in variables as `gallery_dtype` (`"float32"`, `"bfloat16"` or `"int8"`), scored
        `search_block_rows` rows at a time.
      match_precision, calibration, match_mode: `match` is `score >= threshold`, the threshold of a
        `tfdml.retrieval.Calibration` (default: `calibrate` on the labelled gallery itself at
        `match_precision`, in `match_mode`: `"auto"` is open set, leave-one-class-out, so that the precision
        holds for queries whose class is absent from the gallery too, whenever the gallery has enough
        classes); without gallery labels, or where the calibration cannot be measured (e.g. one class),
        there is no threshold and nothing is a match. The calibration goes to the metadata.
      search_dims: for nested embeddings (`tfdml.losses.NestedLoss`), index the normalised `search_dims` prefix
        and re-rank its shortlist with the full vector (`tfdml.export.PrefixIndex`), and so does the `search`
        signature; each shortlist is sized to meet the index's target recall against exact full-vector search,
        measured and recorded in the metadata (`index.recall`, `search.prefix`).
      query_expansion, database_augmentation, expansion_alpha: alpha-QE of each query in the `search` signature
        (one more search) and DBA of its gallery (once, at export), as `tfdml.retrieval.expansion` (0: off);
        the ScaNN index is left as embedded. The match threshold is calibrated on the gallery as embedded.

    Example:
      >>> path = export_saved_model(embedder, "exported_models", name="cub", metrics=results,
      ...                           gallery=tfdml.data.image_folder("cub/test"))
      >>> # tensorflow_model_server --rest_api_port=8501 --model_name=cub --model_base_path=$PWD/exported_models/cub
    """
    name = _checked_name(name or model.name)
    serving = _Serving(model, image_size, preprocess, center_crop, resize)
    options = _SearchOptions(
        top_k, gallery_dtype, match_precision, search_block_rows, match_mode, search_dims,
        query_expansion, database_augmentation, expansion_alpha,
    )  # fmt: skip
    if search and gallery is not None:
        options.check()
    model_dir, chosen_version, target = _version_path(base_dir, name, version, overwrite)
    archive, serve, embed_images, outputs = _embedding_archive(
        model, serving.size, serving.channels, serving.evaluation_image
    )
    embedded = searcher = None
    if gallery is not None:
        # Embedded by `serve` itself (the function written as serving_default), once, for index and search.
        embed = lambda images, batch_size: embed_uint8(serve, images, batch_size)  # noqa: E731
        embedded = embed_gallery(embed, serving.channels, gallery, gallery_ids, gallery_labels, class_names, batch_size)
    index_settings = _with_search_dims(index_settings, search_dims)
    if search and embedded is not None:
        calibration = calibration or _default_calibration(embedded, match_precision, match_mode)
        searcher = _add_search_signature(archive, embed_images, embedded, calibration, options, index_settings)
    metadata = _metadata(
        model, name, chosen_version, outputs, serving.metadata(outputs), searcher, calibration, embedded,
        training_config, metrics,
    )  # fmt: skip
    return _write_version(
        archive, metadata, model_dir, target, embedded, index_mode, index_settings, chosen=version is None
    )


def _checked_name(name):
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(f"name must be a plain directory name, got {name!r}.")
    return name


class _Serving:
    """What the serving graph takes and does before the model: input size, channels, pixel preprocessing and
    the evaluation geometry (resize, centre crop)."""

    def __init__(self, model, image_size, preprocess, center_crop, resize):
        config = _model_preprocessing_config(model)
        self.size = _resolve_image_size(model, image_size, config)
        self.preprocess_fn, self.preprocess_name, self.in_model = _graph_preprocessing(model, config, preprocess)
        self.channels = _resolve_channels(model, config)
        self.center_crop, self.resize = center_crop, resize

    def evaluation_image(self, pixels):
        return eval_image(pixels, self.size, self.center_crop, self.resize, self.preprocess_fn)

    def metadata(self, outputs):
        geometry = eval_settings(self.size, self.center_crop, self.resize)
        return _input_metadata(self.channels, self.size, geometry, self.preprocess_name, self.in_model, outputs)


@dataclasses.dataclass
class _SearchOptions:
    """The `search` signature's settings (see `export_saved_model`)."""

    top_k: int
    gallery_dtype: str
    match_precision: float
    block_rows: int
    match_mode: str
    search_dims: int = None
    query_expansion: int = 0
    database_augmentation: int = 0
    expansion_alpha: float = 3.0

    def __post_init__(self):
        # Refused on any export (as the re-ranking arguments always were), before any work.
        self.query_expansion, self.expansion_alpha = expansion.check_expansion(
            self.query_expansion, self.expansion_alpha
        )
        self.database_augmentation, _ = expansion.check_expansion(
            self.database_augmentation, self.expansion_alpha, "database_augmentation"
        )

    def check(self):
        _check_search_settings(self.top_k, self.gallery_dtype, self.match_precision, self.block_rows, self.match_mode)


def _with_search_dims(index_settings, search_dims):
    """The index settings, with `search_dims` where a prefix index is asked for."""
    return {**(index_settings or {}), "search_dims": search_dims} if search_dims else index_settings


def _default_calibration(embedded, match_precision, match_mode):
    """`calibrate` on the labelled gallery itself, or None without labels."""
    if embedded.labels is None or len(embedded.labels) < 2:
        return None
    return calibrate(embedded.embeddings, embedded.labels, target_precision=match_precision, mode=match_mode)


def _image_spec():
    return tf.TensorSpec([None, None, None, None], tf.uint8, name=IMAGE_INPUT)


def _embedding_archive(model, image_size, channels, evaluation_image):
    """An `ExportArchive` of `model` with its two embedding signatures: `serving_default` (uint8 images of
    any size -> channels converted -> `evaluation_image` -> the model) and `embed_preprocessed` (the
    model's input as it takes it). Returns `(archive, serving function, its Python function, output
    widths)`."""

    def embed_preprocessed(preprocessed):
        return _named_outputs(model, preprocessed)

    def embed_images(images):
        return _named_outputs(model, evaluation_image(_serving_images(images, channels)))

    float_spec = tf.TensorSpec([None, *image_size, channels], tf.float32, name=PREPROCESSED_INPUT)
    archive = keras.export.ExportArchive()
    archive.track(model)
    # The argument names (`images`, `preprocessed`) become the signatures' input names.
    serve = tf.function(embed_images, input_signature=[_image_spec()])
    archive.add_endpoint(SERVING_SIGNATURE, serve)
    archive.add_endpoint(PREPROCESSED_SIGNATURE, tf.function(embed_preprocessed, input_signature=[float_spec]))
    shapes = serve.get_concrete_function().structured_outputs
    outputs = {key: int(value.shape[-1]) if value.shape[-1] is not None else None for key, value in shapes.items()}
    return archive, serve, embed_images, outputs


def _metadata(model, name, version, outputs, inputs, searcher, calibration, embedded, training_config, metrics):
    """`tfdml_metadata.json` of a version (the index summary is added when the index is written); a field
    that is not known is left out."""
    metadata = {
        "format": "tfdml.export/2",
        "name": name,
        "version": version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "embedding_dim": outputs[EMBEDDING_OUTPUT],
        "outputs": outputs,
        "embedding_normalized": True,
        "distance": "dot_product",
        **inputs,
        "search": None if searcher is None else _search_info(searcher, calibration, embedded),
        "calibration": None if searcher is None or calibration is None else calibration.to_dict(),
        "model": {"class": type(model).__name__, "name": model.name},
        "compile_config": _compile_info(model),
        "training_config": _json_safe(training_config) if training_config else None,
        "metrics": _json_safe(metrics) if metrics else None,
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    }
    metadata = {key: value for key, value in metadata.items() if value is not None}
    if searcher is not None:
        metadata["signatures"][SEARCH_SIGNATURE] = search_signature_info(searcher.k, outputs[EMBEDDING_OUTPUT])
    return metadata


def _graph_preprocessing(model, config, preprocess):
    """`(function, spec name, applied by the model)` of the pixel preprocessing the serving graph applies:
    none for a model that preprocesses its raw input itself (a different `preprocess` is refused)."""
    preprocess_fn, preprocess_name = resolve_preprocessing(
        preprocess if preprocess is not None else config.get("preprocessing")
    )
    in_model = bool(config.get("applied_by_model"))
    if in_model:
        own = resolve_preprocessing(config.get("preprocessing"))[1]
        if preprocess_name != own:
            raise ValueError(
                f"model {model.name!r} applies its own pixel preprocessing ({own!r}) to raw 0-255 "
                f"pixels; preprocess={preprocess_name!r} would preprocess them a second time. "
                "Leave preprocess unset."
            )
        preprocess_fn = resolve_preprocessing(None)[0]
    return preprocess_fn, preprocess_name, in_model


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


def _add_search_signature(archive, embed_images, embedded, calibration, options, index_settings):
    """Adds the `search` endpoint over the embedded gallery to `archive`; returns its `GallerySearch` (with a
    prefix search, its measured recall in `searcher.prefix_record`)."""
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
        options.block_rows,
        search_dims=options.search_dims,
        shortlist=None if record is None else record["shortlist"],
        query_expansion=options.query_expansion,
        database_augmentation=options.database_augmentation,
        expansion_alpha=options.expansion_alpha,
    )
    searcher.prefix_record = record

    def search_images(images):
        embedding = embed_images(images)[EMBEDDING_OUTPUT]  # the serving_default function, not a copy
        return {**searcher(embedding), EMBEDDING_OUTPUT: embedding}

    archive.add_endpoint(SEARCH_SIGNATURE, tf.function(search_images, input_signature=[_image_spec()]))
    return searcher


def _input_metadata(channels, image_size, geometry, preprocess_name, in_model, outputs):
    """The metadata of what the version takes: input, geometry, preprocessing and the two embedding
    signatures."""
    height, width = image_size
    return {
        "input": {
            "signature": SERVING_SIGNATURE,
            "name": IMAGE_INPUT,
            "dtype": "uint8",
            "shape": [None, None, None, channels],
            "channels": channels,
            "channel_conversion": "1 <-> 3 channels converted in the graph (RGB -> luma "
            "0.299 R + 0.587 G + 0.114 B; gray -> repeated)",
        },
        "image_size": [height, width],
        "eval_image": geometry,  # tfdml.data.eval_image(image_size, center_crop, resize)
        "preprocessing": preprocess_name,
        "preprocessing_in_model": in_model,  # else applied by the serving graph before the model
        "signatures": {
            SERVING_SIGNATURE: {
                "inputs": {IMAGE_INPUT: "uint8 [batch, height, width, 1 or 3]"},
                "outputs": sorted(outputs),
            },
            PREPROCESSED_SIGNATURE: {
                "inputs": {PREPROCESSED_INPUT: f"float32 [batch, {height}, {width}, {channels}]"},
                "outputs": sorted(outputs),
            },
        },
    }


def _write_version(archive, metadata, model_dir, target, embedded, index_mode, index_settings, chosen=False):
    """Writes the SavedModel, its metadata and index in a temporary folder, then renames it into place, so
    that a version never exists half-written or without the index it was exported with. A `chosen`
    version (the next free one) that another export took meanwhile moves on to the next free one."""
    os.makedirs(model_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".tmp-export-", dir=model_dir)
    try:
        written = os.path.join(staging, "model")
        archive.write_out(written, verbose=False)
        _write_json(os.path.join(written, METADATA_FILE), metadata)
        if embedded is not None:
            index = save_index(
                written, embedded, metadata["name"], metadata["version"], index_mode, index_settings or {}
            )
            metadata["index"] = _index_summary(index)
            _write_json(os.path.join(written, METADATA_FILE), metadata)
        if chosen:
            target = _rename_to_free_version(written, target, metadata, embedded, index_mode, index_settings)
        else:
            if os.path.exists(target):  # overwrite=True: swap the old version out of the way first
                os.rename(target, os.path.join(staging, "previous"))
            os.rename(written, target)
    finally:
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
            index = save_index(
                written, embedded, metadata["name"], metadata["version"], index_mode, index_settings or {}
            )
            metadata["index"] = _index_summary(index)
        _write_json(os.path.join(written, METADATA_FILE), metadata)


def _check_search_settings(top_k, gallery_dtype, match_precision, block_rows, match_mode="auto"):
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}.")
    if gallery_dtype not in GALLERY_DTYPES:
        raise ValueError(f"gallery_dtype must be one of {', '.join(GALLERY_DTYPES)}, got {gallery_dtype!r}.")
    if not 0.0 < float(match_precision) <= 1.0:
        raise ValueError(f"match_precision must be in (0, 1], got {match_precision}.")
    if int(block_rows) < 1:
        raise ValueError(f"search_block_rows must be at least 1, got {block_rows}.")
    if match_mode not in CALIBRATION_MODES:
        raise ValueError(f"match_mode must be one of {', '.join(CALIBRATION_MODES)}, got {match_mode!r}.")


def _search_info(searcher, calibration, embedded):
    """The metadata's `search` entry: what the signature returns and how `match` is decided."""
    if calibration is None:
        match = "uncalibrated: the gallery has no labels, so match is always false"
    else:
        match = calibration.promise()
    return {
        "signature": SEARCH_SIGNATURE,
        "top_k": searcher.k,
        "gallery_size": searcher.size,
        "gallery_dtype": searcher.gallery_dtype,
        "gallery_bytes": searcher.memory_bytes(),
        "block_rows": searcher.block_rows,
        "prefix": searcher.prefix_record,
        "query_expansion": searcher.query_expansion,
        "database_augmentation": searcher.database_augmentation,
        "expansion_alpha": searcher.expansion_alpha,
        "score": "cosine similarity, descending",
        "match_threshold": calibration.threshold if calibration is not None and calibration.reached else None,
        "match_precision": None if calibration is None else calibration.target_precision,
        "match_mode": None if calibration is None else calibration.mode,
        "match": match,
        "ids": "file paths"
        if embedded.ids is not None and np.asarray(embedded.ids).dtype.kind in "UO"
        else "<source>:<item number>"
        if embedded.source
        else "item numbers",
    }
