"""Backbones: EfficientNet-Lite (offline ImageNet weights), `keras.applications`, Keras models, the small CNN.

`get_backbone(name_or_model, input_shape, weights)` returns a functional Keras model without its
classification top. `default_taps(backbone)` gives the low / mid / high tap layers used by
`MultiLevelEmbedder`, chosen as the RLL authors' Caffe prototxt taps its GoogLeNet-BN:

L = `inception_3c` (the block that OPENS the stride-16 stage, 14x14 at 224 px), M = `inception_4e` (opens the
stride-32 stage, 7x7) and H = `inception_5b` (the last block). The equivalents are the first, downsampling
block of the stride-16 and stride-32 stages and the last block:

| backbone       | L                  | M                  | H                  | at 224 px       |
|----------------|--------------------|--------------------|--------------------|-----------------|
| resnet50/101/152 | `conv4_block1_out` | `conv5_block1_out` | `conv5_block3_out` | 14x14, 7x7, 7x7 |
| inception_v3   | `mixed3`           | `mixed8`           | `mixed10`          | 12x12, 5x5, 5x5 |
| efficientnet_lite0 | `block5c_out`  | `block7a_out`      | `top_activation`   | 14x14, 7x7, 7x7 |
| small_cnn      | `block1_out`       | `block2_out`       | `block3_out`       | (32 px: 16, 8, 4) |

EfficientNet-Lite is tapped at the ends of stages 5 and 7 and its head; InceptionV3's `mixed3` and `mixed8`
are its grid-reduction blocks (35->17, 17->8 at 299 px). A small CNN
with more blocks (`widths` of length n > 3) is tapped at its last three, `block{n-2}_out` to `block{n}_out`;
any other functional backbone by layer name (`taps={"L": ..., "M": ..., "H": ...}`).

`preprocessing_name(backbone)` is the pixel preprocessing the backbone expects (a `tfdml.models.preprocessing`
spec the embedder's first layer applies to 0-255 pixels): the `keras.applications` function's dotted name,
"symmetric" for EfficientNet-Lite, "unit" (pixels / 255) for the small CNN, None for custom backbones.
"""

import re

import keras

from tfdml.models import efficientnet_lite

# normalised name -> (keras.applications constructor, module holding its preprocess_input)
_APPLICATIONS = {
    "resnet50": ("ResNet50", "resnet50"),
    "resnet101": ("ResNet101", "resnet"),
    "resnet152": ("ResNet152", "resnet"),
    "resnet50v2": ("ResNet50V2", "resnet_v2"),
    "resnet101v2": ("ResNet101V2", "resnet_v2"),
    "inceptionv3": ("InceptionV3", "inception_v3"),
    "inceptionresnetv2": ("InceptionResNetV2", "inception_resnet_v2"),
    "densenet121": ("DenseNet121", "densenet"),
    "densenet169": ("DenseNet169", "densenet"),
    "mobilenetv2": ("MobileNetV2", "mobilenet_v2"),
    "mobilenetv3small": ("MobileNetV3Small", "mobilenet_v3"),
    "mobilenetv3large": ("MobileNetV3Large", "mobilenet_v3"),
    "efficientnetb0": ("EfficientNetB0", "efficientnet"),
    "efficientnetb3": ("EfficientNetB3", "efficientnet"),
    "efficientnetv2b0": ("EfficientNetV2B0", "efficientnet_v2"),
    "efficientnetv2b1": ("EfficientNetV2B1", "efficientnet_v2"),
    "efficientnetv2b2": ("EfficientNetV2B2", "efficientnet_v2"),
    "efficientnetv2b3": ("EfficientNetV2B3", "efficientnet_v2"),
    "efficientnetv2s": ("EfficientNetV2S", "efficientnet_v2"),
    "convnexttiny": ("ConvNeXtTiny", "convnext"),
    "vgg16": ("VGG16", "vgg16"),
}

# normalised name -> EfficientNet-Lite variant: ImageNet weights from an installed package, no network
_LITE = {name.replace("_", ""): name for name in efficientnet_lite.VARIANTS}

# keyed by the Keras model name that keras.applications gives each backbone
_RESNET_TAPS = {"L": "conv4_block1_out", "M": "conv5_block1_out", "H": "conv5_block3_out"}
DEFAULT_TAPS = {
    "resnet50": dict(_RESNET_TAPS),
    "resnet101": dict(_RESNET_TAPS),
    "resnet152": dict(_RESNET_TAPS),
    "inception_v3": {"L": "mixed3", "M": "mixed8", "H": "mixed10"},
    "small_cnn": {"L": "block1_out", "M": "block2_out", "H": "block3_out"},
}

SMALL_CNN = "small_cnn"
DEFAULT_INPUT_SHAPE = (224, 224, 3)
SMALL_CNN_INPUT_SHAPE = (32, 32, 1)


def normalise_name(name):
    """Backbone names compare without case, `_` or `-` ("InceptionV3" == "inception_v3")."""
    return name.lower().replace("_", "").replace("-", "")


def is_small_cnn(backbone):
    return isinstance(backbone, str) and normalise_name(backbone) == normalise_name(SMALL_CNN)


def backbone_names():
    """Names accepted by `get_backbone` (besides any functional Keras model)."""
    return [SMALL_CNN] + sorted(efficientnet_lite.VARIANTS) + sorted(_APPLICATIONS)


def is_efficientnet_lite(backbone):
    return isinstance(backbone, str) and normalise_name(backbone) in _LITE


def small_cnn(input_shape=SMALL_CNN_INPUT_SHAPE, widths=(8, 16, 32), name=SMALL_CNN):
    """A tiny convolutional backbone (about 6k parameters with the default widths).

    Each block is Conv3x3 (no bias) -> BatchNorm -> ReLU -> MaxPool 2x2; block `i`'s output layer is named
    `block{i}_out`, so every block is a tap for `MultiLevelEmbedder`. Meant for tests, the embedded digits
    job and CPU smoke runs, not for measuring a method.
    """
    inputs = keras.Input(shape=tuple(input_shape), name="images")
    x = inputs
    for i, width in enumerate(widths, start=1):
        x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"block{i}_conv")(x)
        x = keras.layers.BatchNormalization(name=f"block{i}_bn")(x)
        x = keras.layers.ReLU(name=f"block{i}_relu")(x)
        x = keras.layers.MaxPooling2D(2, padding="same", name=f"block{i}_out")(x)
    return keras.Model(inputs, x, name=name)


class PretrainedWeightsError(RuntimeError):
    """ImageNet weights that could not be fetched; `reason` says why in one line."""

    def __init__(self, message, reason):
        super().__init__(message)
        self.reason = reason


def _imagenet_error(name, cause):
    first_line = (str(cause).strip().splitlines() or [""])[0][:200]
    reason = (
        f"cannot load the ImageNet weights of backbone {name!r} ({type(cause).__name__}: {first_line}); "
        "keras.applications downloads them on first use, which needs network access"
    )
    return PretrainedWeightsError(
        f"Could not load the ImageNet weights of backbone {name!r}: {type(cause).__name__}: {cause}. "
        "keras.applications downloads them on first use, which needs network access (they are then "
        "cached in ~/.keras/models). Offline, download the weights file elsewhere and pass its path, "
        "e.g. weights='/path/to/resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5' (a `notop` file), "
        "or pass weights=None for a randomly initialised backbone.",
        reason,
    )


def get_backbone(backbone, input_shape=None, weights="imagenet", widths=None):
    """Resolves `backbone` to a functional Keras model without a classification top.

    Args:
      backbone: "efficientnet_lite0/1/2" (ImageNet weights from an installed package, offline), a
        `keras.applications` name ("resnet50", "inception_v3", "efficientnetv2b0", "mobilenetv3small", ...;
        case, `_` and `-` are ignored), "small_cnn", or a Keras model (returned as is; it must be functional or
        sequential so that its layers can be tapped).
      input_shape: `(height, width, channels)`; defaults to (224, 224, 3) for `keras.applications`, the
        variant's own resolution for EfficientNet-Lite and (32, 32, 1) for the small CNN. Ignored for a Keras
        model.
      weights: "imagenet" (EfficientNet-Lite: converted from its installed package; `keras.applications`:
        downloaded by Keras), None (random initialisation) or a path to a `keras.applications` weights file.
        Must be None for "small_cnn". Ignored for a Keras model.
      widths: the small CNN's block widths (default (8, 16, 32)); only for "small_cnn".
    """
    if isinstance(backbone, keras.Model):
        try:
            inputs = backbone.inputs
        except (AttributeError, ValueError):
            inputs = None
        if not inputs:
            raise ValueError(
                f"Backbone {backbone.name!r} has no symbolic inputs (a subclassed or unbuilt model): its "
                "layers cannot be tapped. Pass a functional or built sequential model, or a "
                "keras.applications name."
            )
        return backbone
    if not isinstance(backbone, str):
        raise TypeError(f"backbone must be a keras.applications name or a keras.Model, got {backbone!r}.")
    key = normalise_name(backbone)
    if is_small_cnn(backbone):
        if weights not in (None, "none"):
            raise ValueError(f"The small CNN has no pretrained weights; pass weights=None (got {weights!r}).")
        return small_cnn(input_shape or SMALL_CNN_INPUT_SHAPE, **({} if widths is None else {"widths": widths}))
    if widths is not None:
        raise ValueError(f"widths sets the small CNN's block widths; backbone {backbone!r} does not take it.")
    if key in _LITE:
        if weights not in ("imagenet", None, "none"):
            raise ValueError(
                f"Backbone {backbone!r} takes weights='imagenet' (from its installed package) or None, got {weights!r}."
            )
        try:
            return efficientnet_lite.efficientnet_lite(
                _LITE[key], input_shape, None if weights == "none" else weights, include_top=False
            )
        except efficientnet_lite.MissingWeightsPackage as error:
            raise PretrainedWeightsError(str(error), str(error)) from None
    if key not in _APPLICATIONS:
        raise ValueError(
            f"Unknown backbone {backbone!r}. Known names: {', '.join(backbone_names())}; or pass a Keras model."
        )
    constructor = getattr(keras.applications, _APPLICATIONS[key][0])
    input_shape = tuple(input_shape or DEFAULT_INPUT_SHAPE)
    if weights == "imagenet" and input_shape[-1] != 3:  # keras' own error would read as a failed download
        raise ValueError(
            f"ImageNet weights of {backbone!r} take 3-channel (RGB) images, got input_shape "
            f"{input_shape}; pass weights=None or RGB images."
        )
    try:
        return constructor(include_top=False, weights=weights, input_shape=input_shape)
    except Exception as cause:  # keras raises bare Exception / URLError / OSError on a failed fetch
        if weights == "imagenet":
            raise _imagenet_error(backbone, cause) from cause
        raise


def preprocessing_name(backbone):
    """Preprocessing spec of the backbone (`tfdml.models.preprocessing`), applied to 0-255 pixels.

    A dotted function name for `keras.applications` backbones, "unit" (pixels / 255) for the small CNN,
    None (pixels used as they come) for other models.
    """
    name = backbone if isinstance(backbone, str) else getattr(backbone, "name", "")
    key = normalise_name(name)
    if key in _APPLICATIONS:
        return f"keras.applications.{_APPLICATIONS[key][1]}.preprocess_input"
    if key in _LITE:
        return efficientnet_lite.PREPROCESSING
    if key == normalise_name(SMALL_CNN):
        return "unit"
    return None


def default_taps(backbone):
    """`{"L": layer, "M": layer, "H": layer}` for backbones with known taps, else None."""
    if backbone.name == SMALL_CNN:
        # H reads the last block, the backbone's output (as the paper's H reads inception_5b): a small CNN with
        # more than three blocks (the main job's has four) is tapped at its last three, so no block is left
        # without a gradient.
        blocks = sum(1 for layer in backbone.layers if re.fullmatch(r"block\d+_out", layer.name))
        if blocks > 3:
            return {level: f"block{blocks - 2 + i}_out" for i, level in enumerate("LMH")}
    if backbone.name in efficientnet_lite.VARIANTS:
        return efficientnet_lite.default_taps(backbone.name)
    return dict(DEFAULT_TAPS[backbone.name]) if backbone.name in DEFAULT_TAPS else None


def _all_layers(layer):
    for sub in getattr(layer, "layers", None) or getattr(layer, "_layers", []):
        yield sub
        yield from _all_layers(sub)


def stage_end(backbone, stages):
    """The layer that ends the first `stages` stages of a named backbone: EfficientNet-Lite's stage `stages`
    (1-7), the small CNN's block `stages`; `ValueError` for other backbones (pass a layer name instead)."""
    name = backbone.name
    if name in efficientnet_lite.VARIANTS:
        if not 1 <= stages <= len(efficientnet_lite.B0_STAGES):
            raise ValueError(f"{name} has stages 1-{len(efficientnet_lite.B0_STAGES)}; got frozen_stages={stages}.")
        return efficientnet_lite.stage_output(efficientnet_lite.VARIANTS[name], stages)
    if name == SMALL_CNN:
        blocks = sum(1 for layer in backbone.layers if re.fullmatch(r"block\d+_out", layer.name))
        if not 1 <= stages <= blocks:
            raise ValueError(f"the small CNN has blocks 1-{blocks}; got frozen_stages={stages}.")
        return f"block{stages}_out"
    raise ValueError(
        f"frozen_stages knows the stages of EfficientNet-Lite and the small CNN, not of {name!r}: freeze its "
        "first layers with tfdml.models.backbones.freeze_layers(backbone, up_to=layer_name)."
    )


def freeze_layers(backbone, up_to=None):
    """Freezes the layers of `backbone` from its input up to and including the layer `up_to` (every layer when
    None) and returns how many layers hold weights among them.

    A frozen layer's weights are not trained and its BatchNormalization runs in inference mode (moving
    statistics, not updated). Recompile a compiled model afterwards.
    """
    names = [layer.name for layer in backbone.layers]
    if up_to is not None and up_to not in names:
        raise ValueError(f"Backbone {backbone.name!r} has no layer named {up_to!r} to freeze up to.")
    last = len(names) - 1 if up_to is None else names.index(up_to)
    frozen = 0
    for layer in backbone.layers[: last + 1]:
        layer.trainable = False
        frozen += bool(layer.weights)
    return frozen


def freeze_batchnorm(model):
    """Freezes every BatchNormalization layer in `model` (recursively) and returns their number.

    A frozen Keras BatchNormalization runs in inference mode (moving statistics, which are not updated) and
    its scale and offset are not trained, Caffe's `use_global_stats` plus zero learning rate (the RLL
    paper's frozen BatchNorm on CUB and Cars). Recompile the model afterwards if it was already compiled.
    """
    count = 0
    for layer in _all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
            count += 1
    return count
