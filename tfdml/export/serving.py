"""The embedding signatures of an exported version, and what they need to know of the model.

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

import keras
import tensorflow as tf

from tfdml.data.preprocessing import as_size, eval_image, eval_settings
from tfdml.data.tracing import autograph_needed
from tfdml.export.layout import (
    EMBEDDING_OUTPUT,
    IMAGE_INPUT,
    PREPROCESSED_INPUT,
    PREPROCESSED_SIGNATURE,
    SERVING_SIGNATURE,
)
from tfdml.models.preprocessing import resolve_preprocessing


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
    size = as_size(image_size or config.get("image_size") or model_image_size(model))
    if size is None:
        raise ValueError(
            f"cannot tell the input size of model {model.name!r}: pass image_size=(height, "
            f"width) or give the model a preprocessing_config() with 'image_size'."
        )
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


class ServingInput:
    """What the serving graph of `model` takes and does before the model, resolved from the model and its
    `ServingOptions`: input `size` and `channels`, the pixel preprocessing (`preprocess_name`, applied by the
    model itself when `in_model`) and the evaluation geometry (`center_crop`, `resize`)."""

    def __init__(self, model, options):
        config = _model_preprocessing_config(model)
        self.size = _resolve_image_size(model, options.image_size, config)
        self.preprocess_fn, self.preprocess_name, self.in_model = _graph_preprocessing(
            model, config, options.preprocess
        )
        self.channels = _resolve_channels(model, config)
        self.center_crop, self.resize = options.center_crop, options.resize

    def evaluation_image(self, pixels):
        """The model's input of float32 `[N, H, W, channels]` pixels, as the job evaluated it."""
        return eval_image(pixels, self.size, self.center_crop, self.resize, self.preprocess_fn)

    def geometry(self):
        """The evaluation geometry as `tfdml.data.eval_settings` describes it."""
        return eval_settings(self.size, self.center_crop, self.resize)


def named_outputs(model, images):
    """The model's outputs on `images` as a dict of float32 tensors with an L2-normalised `embedding`."""
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


def serving_images(images, channels):
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


def image_spec():
    """The input of the signatures that take images: uint8 `[batch, height, width, channels]`, any size."""
    return tf.TensorSpec([None, None, None, None], tf.uint8, name=IMAGE_INPUT)


def embedding_archive(model, serving):
    """An `ExportArchive` of `model` with its two embedding signatures: `serving_default` (uint8 images of
    any size -> channels converted -> `serving.evaluation_image` -> the model) and `embed_preprocessed` (the
    model's input as it takes it). Returns `(archive, serving function, output widths)`."""

    def embed_preprocessed(preprocessed):
        return named_outputs(model, preprocessed)

    def embed_images(images):
        return named_outputs(model, serving.evaluation_image(serving_images(images, serving.channels)))

    float_spec = tf.TensorSpec([None, *serving.size, serving.channels], tf.float32, name=PREPROCESSED_INPUT)
    archive = keras.export.ExportArchive()
    archive.track(model)
    # AutoGraph only for a model's own `export_outputs` or preprocessing (`tfdml.data.tracing`).
    autograph = autograph_needed(getattr(model, "export_outputs", None), serving.preprocess_fn)
    # The argument names (`images`, `preprocessed`) become the signatures' input names.
    serve = tf.function(embed_images, input_signature=[image_spec()], autograph=autograph)
    archive.add_endpoint(SERVING_SIGNATURE, serve)
    embed = tf.function(embed_preprocessed, input_signature=[float_spec], autograph=autograph)
    archive.add_endpoint(PREPROCESSED_SIGNATURE, embed)
    shapes = serve.get_concrete_function().structured_outputs
    outputs = {key: int(value.shape[-1]) if value.shape[-1] is not None else None for key, value in shapes.items()}
    return archive, serve, outputs
