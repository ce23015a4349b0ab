"""Per-image preprocessing of the papers, as stateless (seeded, reproducible) TensorFlow ops.

Training (RLL TPAMI, Group Loss, margin loss): resize to 256 x 256, random crop covering 50-100 % of the
area with aspect ratio 3/4-4/3, resized to 224 (or 227), random horizontal flip.
Evaluation: resize to 256 x 256, centre crop 224.

The random crop is `tf.image.stateless_sample_distorted_bounding_box`, the same operation as keras-cv's
`RandomCropAndResize`, but driven by an explicit per-image seed so that a pipeline is bit-for-bit
reproducible for a given seed (keras-cv layers draw from their own stateful generator).

Output pixels are float32 in `[0, 255]`, resized, cropped and augmented but with their values left alone:
every tfdml embedder applies its own pixel preprocessing as its first layer
(`tfdml.models.preprocessing`), so the same raw pixels go to training, evaluation and the served model.
For a model that does not preprocess itself, `preprocess` is applied to the float32 `[0, 255]` images
(e.g. `lambda x: x / 255`, or `keras.applications.resnet.preprocess_input` for a bare ResNet).
"""

import dataclasses

import tensorflow as tf

# The papers resize to 256 before cropping 224: other crop sizes keep that ratio.
RESIZE_RATIO = 256.0 / 224.0


@dataclasses.dataclass(frozen=True)
class Augment:
    """Training augmentation settings (defaults: RLL TPAMI).

    Args:
      resize: side of the square resize before cropping; `None` means `round(image_size * 256 / 224)`
        (256 for 224 crops, 260 for 227).
      random_crop: random-resized crop; `False` takes a centre crop instead.
      scale: range of the crop's area as a fraction of the resized image.
      aspect_ratio: range of the crop's width / height.
      flip: random horizontal flip.
    """

    resize: int = None
    random_crop: bool = True
    scale: tuple = (0.5, 1.0)
    aspect_ratio: tuple = (3.0 / 4.0, 4.0 / 3.0)
    flip: bool = True

    def __post_init__(self):
        low, high = self.scale
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"Augment.scale must satisfy 0 < low <= high <= 1, got {self.scale}.")
        low, high = self.aspect_ratio
        if not 0.0 < low <= high:
            raise ValueError(f"Augment.aspect_ratio must satisfy 0 < low <= high, got {self.aspect_ratio}.")
        if self.resize is not None and int(self.resize) < 1:
            raise ValueError(f"Augment.resize must be a positive size, got {self.resize}.")


def as_size(image_size):
    """`None`, an int or a `(height, width)` pair -> `None` or a `(height, width)` tuple of ints."""
    if image_size is None:
        return None
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    size = tuple(int(s) for s in image_size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be a positive int or (height, width), got {image_size!r}.")
    return size


def resolve_augment(augment):
    """`augment` argument -> an `Augment` or `None` (`True` gives the paper defaults)."""
    if augment is None or augment is False:
        return None
    if augment is True:
        return Augment()
    if isinstance(augment, Augment):
        return augment
    raise TypeError(f"augment must be True, False or a tfdml.data.Augment, got {augment!r}.")


def _resize_side(size, resize):
    if resize is None:
        return tuple(int(round(s * RESIZE_RATIO)) for s in size)
    if int(resize) < max(size):
        raise ValueError(
            f"resize={resize} is smaller than the crop image_size={size}; it must be at least "
            "as large (the papers resize to 256 and crop 224)."
        )
    return (int(resize), int(resize))


def _finish(image, preprocess):
    if preprocess is None:
        return image  # raw pixels: tfdml embedders preprocess them themselves
    return tf.cast(preprocess(image), tf.float32)


def _center_crop(image, size):
    """Centre crop of `[H, W, C]` or `[batch, H, W, C]` images."""
    shape = tf.shape(image)
    top = (shape[-3] - size[0]) // 2
    left = (shape[-2] - size[1]) // 2
    if image.shape.rank == 4:
        return tf.slice(image, [0, top, left, 0], [-1, size[0], size[1], -1])
    return tf.slice(image, [top, left, 0], [size[0], size[1], -1])


def train_image(image, seed, image_size=None, augment=None, preprocess=None):
    """One training image (`[H, W, C]`, uint8 or [0, 255]) -> float32 `[h, w, C]` (in [0, 255] without
    `preprocess`).

    `seed` is a stateless seed (int tensor `[2]`); `augment` an `Augment` or `None` (plain resize to
    `image_size`, or nothing when `image_size` is `None`).
    """
    image = tf.cast(image, tf.float32)
    channels = image.shape[-1]
    size = as_size(image_size)
    if augment is None:
        if size is not None:
            image = tf.image.resize(image, size)
        return _finish(image, preprocess)
    if size is None:
        raise ValueError("augmentation crops to image_size: pass image_size (e.g. 224).")
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.image.resize(image, _resize_side(size, augment.resize))
    if augment.random_crop:
        begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            seed=crop_seed,
            min_object_covered=0.0,
            aspect_ratio_range=augment.aspect_ratio,
            area_range=augment.scale,
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        image = tf.image.resize(tf.slice(image, begin, crop), size)
    else:
        image = _center_crop(image, size)
    if augment.flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    image.set_shape([size[0], size[1], channels])
    return _finish(image, preprocess)


def eval_image(image, image_size=None, center_crop=True, resize=None, preprocess=None):
    """An evaluation image `[H, W, C]` (or a batch `[N, H, W, C]`) -> float32: resize to `resize` (default
    `image_size * 256 / 224`), centre crop `image_size`; with `center_crop=False` a plain resize to
    `image_size`. Deterministic. Values stay in [0, 255] without `preprocess`.

    This is THE inference preprocessing: `tfdml.data.eval_dataset` applies it to every evaluated image and
    `tfdml.export` puts the same function in the serving graph, so a job's metrics describe the model that
    is served (`tfdml evaluate` on the export reproduces them).
    """
    image = tf.cast(image, tf.float32)
    size = as_size(image_size)
    if size is not None:
        if center_crop:
            image = _center_crop(tf.image.resize(image, _resize_side(size, resize)), size)
        else:
            image = tf.image.resize(image, size)
        image.set_shape(image.shape[:-3].concatenate([size[0], size[1], image.shape[-1]]))
    return _finish(image, preprocess)


def eval_settings(image_size, center_crop=True, resize=None):
    """JSON description of `eval_image`'s geometry (recorded in export metadata)."""
    size = as_size(image_size)
    return {
        "image_size": list(size),
        "center_crop": bool(center_crop),
        "resize": list(_resize_side(size, resize)) if center_crop else list(size),
    }


def evaluation_center_crop(augment):
    """Whether evaluation (and so the served graph) takes the papers' centre crop for a model trained with
    `augment` (as `train_image` takes it, or a mapping of `Augment` fields as `data.augment` in a
    configuration). Every augmentation trains on crops of the `256/224` resize, random or central, so the
    model is evaluated on the centre crop; a model trained on whole images (`augment` false or None) is
    evaluated on whole images."""
    return augment is not None and augment is not False
