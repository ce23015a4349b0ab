"""Image files: checked and decoded once (TensorFlow's decoders, Pillow for the formats it lacks), read in
parallel, and the files that cannot be decoded named in one warning."""

import io
import logging
import os

import numpy as np
import tensorflow as tf
from PIL import Image, UnidentifiedImageError

logger = logging.getLogger("tfdml.data")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# Formats `tf.io.decode_image` reads; other formats Pillow recognises (TIFF, ...) are decoded by Pillow.
TF_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP")
# Skipped files named in a warning; more are counted.
MAX_NAMED = 20


class ImageReadError(ValueError):
    """An image file that cannot be decoded; the message names the file and the reason."""


def check_image_file(path):
    """`(format, None)` for a decodable image file (a path, or its bytes in an `io.BytesIO`), `(None,
    reason)` otherwise.

    Cheap: a JPEG is decoded at 1/8 scale (Pillow's draft mode still reads the whole compressed stream, so
    truncated files are caught); other formats are checked with Pillow's `verify` (structure and PNG
    checksums, no decoding).
    """
    try:
        if (len(path.getbuffer()) if isinstance(path, io.BytesIO) else os.path.getsize(path)) == 0:
            return None, "empty file"
        with Image.open(path) as image:
            image_format = image.format
            if image_format == "JPEG":
                image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
                image.load()
            else:
                image.verify()
    except UnidentifiedImageError:
        return None, "not an image file: format not recognised"
    except FileNotFoundError:
        return None, "file not found"
    except OSError as error:  # truncated or damaged data
        return None, f"corrupt or truncated: {error}"
    except Exception as error:  # malformed headers raise ValueError, SyntaxError, struct.error, ...
        return None, f"corrupt: {type(error).__name__}: {error}"
    return image_format, None


def _pil_pixels(path, channels):
    if isinstance(path, bytes):
        path = io.BytesIO(path)
    with Image.open(path) as image:
        image = image.convert("L" if channels == 1 else "RGB")  # L: ITU-R 601 luma, as TF's decoders
        pixels = np.asarray(image, np.uint8)
    return pixels[..., None] if channels == 1 else pixels


def decode_image_file(path, channels=3):
    """uint8 `[H, W, channels]` pixels of an image file (TensorFlow's decoders; Pillow for TIFF and other
    formats TensorFlow cannot read); `ImageReadError` naming the file when it cannot be decoded."""
    path = os.fspath(path)
    return _decode_checked(path, check_image_file(path), lambda: tf.io.read_file(path), channels)


def decode_image_bytes(data, name, channels=3):
    """`decode_image_file` of an image file's bytes (a TFRecord's encoded image, a file read from remote
    storage); `name` (its path or id) names it in the `ImageReadError`."""
    data = bytes(data)
    return _decode_checked(name, check_image_file(io.BytesIO(data)), lambda: data, channels, pil_input=data)


def _decode_checked(name, checked, read, channels, pil_input=None):
    image_format, problem = checked
    if problem:
        raise ImageReadError(f"{name}: {problem}")
    try:
        if image_format in TF_FORMATS:
            return tf.io.decode_image(read(), channels=channels, expand_animations=False).numpy()
        return _pil_pixels(name if pil_input is None else pil_input, channels)
    except Exception as error:
        raise ImageReadError(f"{name}: cannot be decoded ({str(error).splitlines()[0][:200]})") from None


def report_skipped(what, problems, total):
    """One warning naming the skipped items: `problems` is a list of `(name, reason)`."""
    if not problems:
        return
    named = "; ".join(f"{name} ({reason})" for name, reason in problems[:MAX_NAMED])
    more = f"; and {len(problems) - MAX_NAMED} more" if len(problems) > MAX_NAMED else ""
    logger.warning("%s: skipped %d of %d images that cannot be decoded: %s%s", what, len(problems), total, named, more)


def read_image_files(paths, channels=3, what="images"):
    """`(images, kept)`: the decodable files of `paths` as uint8 arrays and their positions in `paths`;
    the others are skipped and named in one warning. `ValueError` when none can be read."""
    images, kept, problems = [], [], []
    for position, path in enumerate(paths):
        try:
            images.append(decode_image_file(path, channels))
            kept.append(position)
        except ImageReadError as error:
            problems.append((os.fspath(path), str(error)[len(os.fspath(path)) + 2 :]))
    if not images:  # one error line instead of a warning and an error
        raise ValueError(
            f"{what}: none of the {len(paths)} image files can be decoded: "
            + "; ".join(f"{name} ({reason})" for name, reason in problems[:MAX_NAMED])
        )
    report_skipped(what, problems, len(paths))
    return images, np.asarray(kept, np.int64)


def _decode_file(path, channels):
    data = tf.io.read_file(path)
    image = tf.io.decode_image(data, channels=channels, expand_animations=False)
    image.set_shape([None, None, channels])
    return image


def _pil_decode(path, channels):
    image = tf.numpy_function(lambda p: _pil_pixels(p.decode(), channels), [path], tf.uint8, stateful=False)
    image.set_shape([None, None, channels])
    return image
