"""Embeddings for TensorBoard's embedding projector: look at the evaluation embeddings (PCA, t-SNE, UMAP) with
their class names and images.

`write_projector(log_dir, embeddings, labels, class_names, images)` writes a run `projector` into a TensorBoard
log directory, in the layout of TensorBoard's projector plugin (`tensorboard.plugins.projector`):

    <log_dir>/projector/projector_config.pbtxt   ProjectorConfig: the tensor, metadata.tsv and sprite.png
    <log_dir>/projector/checkpoint, embeddings.ckpt-1.*   the embeddings, a variable of a TF checkpoint
    <log_dir>/projector/metadata.tsv             one row per point: class name and label (with a header row)
    <log_dir>/projector/sprite.png               the images as thumbnails in a square grid, row after row
    <log_dir>/projector/events.out.tfevents.*    a text summary, so that TensorBoard lists the run

`tensorboard --logdir <log_dir>` then shows them under PROJECTOR (run "projector"). The run has its own
directory so that the plugin does not also attach the checkpoint to the training runs beside it (it looks for
checkpoints in a run's parent directory too). The directory is rewritten on every call.
"""

import math
import os
import shutil

import numpy as np
import tensorflow as tf
from PIL import Image  # Pillow, installed with matplotlib
from tensorboard.plugins import projector  # tensorboard, installed with TensorFlow

RUN = "projector"
TENSOR = "embeddings"
METADATA_FILE = "metadata.tsv"
SPRITE_FILE = "sprite.png"
MAX_SPRITE_SIDE = 8192  # the projector's limit on the sprite image
DEFAULT_MAX_POINTS = 10_000  # the browser's t-SNE stays usable


def _subset(count, max_points):
    """Evenly spaced indices (every class of a class-ordered set keeps points), all if few enough."""
    if max_points is None or count <= max_points:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, int(max_points)).round().astype(np.int64))


def _cell(text):
    """A metadata cell: tabs and line breaks would split rows and columns."""
    return " ".join(str(text).split()) or "-"


def _as_uint8_rgb(image, scale):
    image = np.asarray(image)
    if image.dtype != np.uint8:
        image = np.clip(np.round(image.astype(np.float64) * scale), 0, 255).astype(np.uint8)
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
        raise ValueError(f"images must be [H, W], [H, W, 1], [H, W, 3] or [H, W, 4], got shape {image.shape}.")
    if image.shape[-1] == 1:
        image = np.repeat(image, 3, axis=-1)
    return image[..., :3]


def sprite_image(images, max_side=MAX_SPRITE_SIDE):
    """`(sprite [S, S, 3] uint8, thumbnail side)`: the images resized to one square side (at most their own
    largest side, small enough for `ceil(sqrt(n))^2` of them to fit in `max_side`), row after row."""
    count = len(images)
    # Float images in [0, 1] (the whole set decides) are scaled to 0-255; other images are taken as 0-255.
    floats = [np.asarray(image) for image in images if np.asarray(image).dtype != np.uint8]
    scale = 255.0 if floats and max(float(np.max(image, initial=0.0)) for image in floats) <= 1.0 else 1.0
    columns = math.ceil(math.sqrt(count))
    largest = max(max(np.shape(image)[:2]) for image in images)
    side = max(1, min(largest, max_side // columns))
    sprite = np.zeros((columns * side, columns * side, 3), np.uint8)
    for i, image in enumerate(images):
        thumbnail = Image.fromarray(_as_uint8_rgb(image, scale)).resize((side, side), Image.BILINEAR)
        row, column = divmod(i, columns)
        sprite[row * side : (row + 1) * side, column * side : (column + 1) * side] = np.asarray(thumbnail)
    return sprite, side


def write_projector(log_dir, embeddings, labels, class_names=None, images=None, max_points=DEFAULT_MAX_POINTS):
    """Writes embeddings, their class names and (optionally) a sprite of their images for TensorBoard's projector.

    Args:
        log_dir: a TensorBoard log directory (e.g. `reports/<job>/tensorboard`); the run `projector` is
            (re)written inside it.
        embeddings: float `[N, D]`.
        labels: integer class ids `[N]`.
        class_names: names indexed by class id (optional; the id is shown otherwise).
        images: `[N, H, W(, C)]` images, or a list of images of any sizes, in `[0, 1]` or 0-255 (optional).
        max_points: keep at most this many points, evenly spaced over the set (None: all).

    Returns:
        `{"run_dir", "points", "tensor_name", "sprite_side"}` (`sprite_side` None without images).

    Example:
        >>> write_projector("reports/glyphs_rll/tensorboard", embeddings, labels, class_names, images)
        >>> # then: tensorboard --logdir reports/glyphs_rll/tensorboard   (tab PROJECTOR)
    """
    embeddings, labels = _checked_inputs(embeddings, labels, images)
    keep = _subset(len(embeddings), max_points)

    run_dir = os.path.join(os.fspath(log_dir), RUN)
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir)  # stale checkpoints, sprite and events of an earlier evaluation
    os.makedirs(run_dir)

    _write_metadata(os.path.join(run_dir, METADATA_FILE), labels[keep], class_names)

    variable = tf.Variable(embeddings[keep].astype(np.float32), trainable=False, name=TENSOR)
    tf.train.Checkpoint(**{TENSOR: variable}).save(os.path.join(run_dir, f"{TENSOR}.ckpt"))

    config = projector.ProjectorConfig()
    entry = config.embeddings.add()
    entry.tensor_name = f"{TENSOR}/.ATTRIBUTES/VARIABLE_VALUE"  # the variable's key in the checkpoint
    entry.metadata_path = METADATA_FILE  # relative to the config file
    side = None
    if images is not None:
        sprite, side = sprite_image([images[i] for i in keep])
        Image.fromarray(sprite).save(os.path.join(run_dir, SPRITE_FILE))
        entry.sprite.image_path = SPRITE_FILE
        entry.sprite.single_image_dim.extend([side, side])
    projector.visualize_embeddings(run_dir, config)

    writer = tf.summary.create_file_writer(run_dir)
    with writer.as_default():
        tf.summary.text(
            "projector",
            f"{len(keep)} evaluation embeddings of {len(np.unique(labels[keep]))} classes "
            f"(of {len(embeddings)}): open the PROJECTOR tab.",
            step=0,
        )
    writer.close()
    return {"run_dir": run_dir, "points": len(keep), "tensor_name": entry.tensor_name, "sprite_side": side}


def _checked_inputs(embeddings, labels, images):
    embeddings = np.asarray(embeddings)
    labels = np.asarray(labels).reshape(-1)
    if embeddings.ndim != 2 or len(embeddings) == 0:
        raise ValueError(f"embeddings must be a non-empty [N, D] array, got shape {embeddings.shape}.")
    if not np.all(np.isfinite(embeddings)):
        raise ValueError("embeddings contain NaN or Inf values.")
    if len(labels) != len(embeddings):
        raise ValueError(f"{len(labels)} labels for {len(embeddings)} embeddings; they must match.")
    if images is not None and len(images) != len(embeddings):
        raise ValueError(f"{len(images)} images for {len(embeddings)} embeddings; they must match.")
    return embeddings, labels


def _write_metadata(path, labels, class_names):
    """The projector's metadata: each point's class name (its id without names) and id."""

    def name(label):
        label = int(label)
        return class_names[label] if class_names is not None and 0 <= label < len(class_names) else label

    with open(path, "w", encoding="utf-8") as f:
        f.write("class\tlabel\n")  # two columns: the projector then reads the first row as the header
        f.writelines(f"{_cell(name(label))}\t{int(label)}\n" for label in labels)
