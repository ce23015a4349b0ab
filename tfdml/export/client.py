"""Using an export from outside: `ExportedEmbedder` (no tfdml model code needed), the REST request body,
image files to pixels."""

import numpy as np
import tensorflow as tf

from tfdml.data.sources import decode_image_file
from tfdml.export.layout import (
    EMBEDDING_OUTPUT,
    IMAGE_INPUT,
    SEARCH_SIGNATURE,
    SERVING_SIGNATURE,
    load_metadata,
    resolve_export_dir,
    verify_version,
)


class ExportedEmbedder:
    """Runs an exported SavedModel (no tfdml model code needed): `embed(uint8_images) -> [N, D]`.

    Args:
      path: version directory or `<base>/<name>` (latest version). Its files are checked against the sizes
        and checksums its metadata records first: a damaged file raises `tfdml.durable.DamagedFileError`
        (a `ValueError`) naming it.
      check_index: also check the files of the version's gallery index (False: only the SavedModel's, for an
        index about to be replaced).
      output: which named output to return (`"embedding"` by default, or a level).
    """

    def __init__(self, path, version=None, output=EMBEDDING_OUTPUT, check_index=True):
        self.path = resolve_export_dir(path, version)
        self.metadata = load_metadata(self.path)
        verify_version(self.path, self.metadata, check_index)  # a damaged file is named before TensorFlow reads it
        self.version = int(self.metadata["version"])
        self.name = self.metadata["name"]
        self.output = output
        self._loaded = tf.saved_model.load(self.path)
        self._serve = self._loaded.signatures[SERVING_SIGNATURE]
        self.channels = int(self.metadata["input"].get("channels") or self.metadata["input"]["shape"][-1])

    def embed(self, images, batch_size=64):
        """Embeds uint8 images: an array `[N, H, W, C]` or a list of `[H, W, C]` arrays of any sizes
        (consecutive images of one size go in one batch)."""
        return embed_uint8(self._serve, images, batch_size, self.output)

    @property
    def has_search(self):
        return SEARCH_SIGNATURE in self._loaded.signatures

    def search(self, images, batch_size=64):
        """Runs the version's `search` signature on uint8 images (as `embed` takes them): a dict of arrays,
        `scores` / `labels` / `ids` / `match` `[N, k]` (labels and ids as str) and `embedding` `[N, D]`."""
        if not self.has_search:
            raise ValueError(
                f"{self.path} (model {self.name!r} version {self.version}) has no "
                f"{SEARCH_SIGNATURE!r} signature: it was exported without a gallery or with "
                f"--no-search. Export it again with a gallery (tfdml export --gallery-dir DIR)."
            )
        signature = self._loaded.signatures[SEARCH_SIGNATURE]
        parts = [
            {key: value.numpy() for key, value in signature(**{IMAGE_INPUT: tf.constant(batch)}).items()}
            for batch in uint8_batches(images, batch_size)
        ]
        if not parts:
            raise ValueError("no images to search with.")
        found = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        for key in ("labels", "ids"):
            found[key] = np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(found[key])
        return found


def uint8_batches(images, batch_size=64):
    """uint8 batches `[n, H, W, C]` of an array `[N, H, W, C]` or a list of `[H, W, C]` / `[H, W]` arrays of
    any sizes (consecutive images of one size go in one batch)."""
    if isinstance(images, np.ndarray) and images.ndim == 4:
        batches = [images[i : i + batch_size] for i in range(0, len(images), batch_size)]
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
    for batch in batches:
        batch = np.asarray(batch) if isinstance(batch, np.ndarray) else np.stack(batch)
        if batch.dtype != np.uint8:
            raise TypeError(f"images must be uint8 pixels, got dtype {batch.dtype}.")
        yield batch


def embed_uint8(signature, images, batch_size=64, output=EMBEDDING_OUTPUT):
    """`signature(images=batch)[output]` over `uint8_batches(images)`, concatenated: `[N, D]`. `signature`
    is `serving_default` of a loaded SavedModel, or the function that becomes it."""
    parts = [
        signature(**{IMAGE_INPUT: tf.constant(batch)})[output].numpy() for batch in uint8_batches(images, batch_size)
    ]
    if not parts:
        raise ValueError("no images to embed.")
    return np.concatenate(parts, axis=0)


def rest_request_body(images, signature_name=SERVING_SIGNATURE):
    """JSON body for TF Serving's REST predict API (`POST /v1/models/<name>:predict`), columnar format.

    `images`: uint8 `[N, H, W, channels]`. The response is `{"outputs": {"embedding": [[...], ...], ...}}`;
    with `signature_name="search"`, `{"outputs": {"scores": ..., "labels": ..., "ids": ..., "match": ...,
    "embedding": ...}}` (see the README).
    """
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"images must be uint8 [batch, height, width, 3 or 1], got {images.dtype} {images.shape}.")
    return {"signature_name": signature_name, "inputs": {IMAGE_INPUT: images.tolist()}}


def read_image(path, channels=3):
    """Decodes an image file (JPEG, PNG, BMP, GIF, WebP; TIFF through Pillow) to uint8 `[H, W, channels]`;
    `tfdml.data.ImageReadError` (a `ValueError` naming the file) when it cannot."""

    return decode_image_file(path, channels)
