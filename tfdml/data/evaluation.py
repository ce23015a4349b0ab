"""Plain, ordered evaluation batches: every item of a source once, with deterministic centre-crop
preprocessing, for embedding a whole split (retrieval evaluation, index building)."""

import numpy as np
import tensorflow as tf

from tfdml.data.preprocessing import eval_image
from tfdml.data.tracing import dataset_function


def eval_dataset(
    source, batch_size, image_size=None, center_crop=True, resize=None, preprocess=None, with_index=False, prefetch=True
):
    """Batches of `(images, labels)` over all items of `source` in index order.

    Args:
      source: a `tfdml.data.Source`.
      batch_size: items per batch (the last batch may be smaller).
      image_size: output size; images are resized to `resize` (default `image_size * 256 / 224`, i.e.
        256 for 224) and centre-cropped to `image_size` (`center_crop=False`: plain resize).
      preprocess: `None` (default) for raw float32 pixels in `[0, 255]`, what tfdml embedders take (they
        apply their own preprocessing); or a function of float32 images in `[0, 255]`.
      with_index: also yield each item's index in the source, `(images, labels, indices)`, so that
        embeddings can be matched back to items (e.g. file paths) even when a corrupt item was skipped.

    Undecodable items are skipped and counted in `source.skipped_count` / `source.corrupt_items`.

    Example:
      >>> ds = tfdml.data.eval_dataset(tfdml.data.digits("test"), batch_size=256, image_size=32)
      >>> embeddings = model.predict(ds.map(lambda x, y: x))
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if len(source) == 0:
        raise ValueError(f"{source.name} is empty: nothing to evaluate.")
    n = len(source)
    labels = tf.constant(source.labels)

    def load(i):
        image = eval_image(source.load(i), image_size, center_crop, resize, preprocess)
        return image, tf.gather(labels, i), i

    load = dataset_function(load, source.load, preprocess)
    ds = tf.data.Dataset.range(n).map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    spec = ds.element_spec[0]
    if not spec.shape.is_fully_defined():
        raise ValueError(
            f"{source.name}: images have no fixed size (got shape {spec.shape}); pass "
            "image_size=... so that they can be batched."
        )
    ds = _skipped_items_recorded(ds, source, n)
    if not with_index:
        ds = ds.map(dataset_function(lambda image, label, index: (image, label)))
    ds = ds.batch(batch_size)
    return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds


def _skipped_items_recorded(ds, source, n):
    """`ds` of `(image, label, index)` with its undecodable items dropped and recorded in `source` (the gaps
    in the indices)."""
    spec = ds.element_spec[0]
    # A sentinel after the last item lets the gap scan below also see trailing corrupt items.
    sentinel = tf.data.Dataset.from_tensors(
        (tf.zeros(spec.shape, spec.dtype), tf.constant(-1, tf.int64), tf.constant(n, tf.int64))
    )
    ds = ds.ignore_errors().concatenate(sentinel)

    def record(missing):
        source.record_skipped(missing)
        return np.int32(0)

    def find_gaps(expected, element):
        image, label, index = element
        missing = tf.range(expected, index)

        def report():
            return tf.numpy_function(record, [missing], tf.int32, stateful=True)

        tf.cond(tf.size(missing) > 0, report, lambda: tf.constant(0))
        return index + 1, element

    scanned = ds.scan(tf.constant(0, tf.int64), dataset_function(find_gaps))
    return scanned.filter(dataset_function(lambda image, label, index: index < n))
