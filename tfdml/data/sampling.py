"""Class-balanced batches (C classes x K images) and label-disjoint episodes, streamed with `tf.data`.

How a batch is made, all inside `tf.data` and all seeded with stateless ops (same seed, same batches):

1. Class schedule: every epoch is a fresh permutation of the classes, cut into groups of `C`. When the
   number of classes is not a multiple of `C`, the last group of the epoch is completed with classes
   drawn from the rest of that epoch — so every class is visited before any class repeats, and no group
   holds a class twice.
2. Images per class: `K` distinct items drawn uniformly from the class (Floyd's algorithm, so the cost
   does not depend on the class size); a class with fewer than `K` items repeats its items evenly
   (sampling with replacement).
3. Loading: one `map` per batch reads, decodes and preprocesses its `C * K` items; `parallel_batches`
   batches load at once on their own threads (an order-preserving parallel `interleave`). Items that fail
   to decode are skipped, counted (`Source.skipped_count`, `Source.corrupt_items`, a `tfdml.data`
   warning) and replaced by a duplicate of an image of the same class that did load. The batch is
   class-major: items `j*K .. j*K + K - 1` are one class.

Class-major order is what keeps whole classes on each replica under `tf.distribute`: the input pipeline
splits a global batch into contiguous per-replica shares, so with `C` divisible by the number of
replicas each replica gets `C / replicas` complete classes (pass `num_replicas` to have that checked).

Memory is the label index (one int per item plus the source's item locators); images only exist for
the batches in flight.
"""

import dataclasses
import logging
import os

import numpy as np
import tensorflow as tf

from tfdml.data import _keywords
from tfdml.data.preprocessing import as_size, resolve_augment, train_image
from tfdml.data.tracing import dataset_function

logger = logging.getLogger("tfdml.data")

_MAX_SEED = 2**31 - 1


def _base_seed(seed):
    if seed is None:
        seed = int(np.random.default_rng().integers(_MAX_SEED))
    return tf.constant([int(seed), 0x5EED], dtype=tf.int64)


def _schedule_and_sample_seeds(seed):
    """`(schedule seed, sample seed)` of a dataset's `seed` (None: a random one): the class schedule and the
    images drawn for it come from independent streams."""
    return tf.unstack(tf.random.experimental.stateless_split(_base_seed(seed), 2))


def _fold(seed, value):
    return tf.random.experimental.stateless_fold_in(seed, tf.cast(value, tf.int64))


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    """How `class_balanced_dataset` and `episode_dataset` draw and load their batches: the settings both take
    as keyword arguments of the same names, checked when made (`image_size` becomes `(height, width)` and
    `augment` an `Augment` or None).

    Args:
      image_size: output size (int or `(height, width)`); required unless all images share one size
        (default None).
      augment: `False` (default: resize only), `True` (paper augmentation: resize 256, random crop of 50-100 %
        area and aspect 3/4-4/3 to `image_size`, horizontal flip) or a `tfdml.data.Augment`.
      preprocess: `None` (default) for raw float32 pixels in `[0, 255]`, what tfdml embedders take (they
        apply their own preprocessing); or a function of float32 images in `[0, 255]` for a model that does
        not preprocess itself (e.g. `lambda x: x / 255`).
      seed: int; the same seed gives the same batches (classes, images and augmentation). Default None: a
        random one.
      epochs: number of class epochs (`steps_per_epoch(source, C)` batches each); `None` (default) repeats
        forever.
      drop_small_classes: leave out the classes with fewer items than a batch takes of one class (default
        False: sample them with replacement, reported once through the `tfdml.data` logger).
      parallel_batches: batches loading concurrently, one thread each (default None: `min(8, max(4, cpus))`);
        more uses more memory (that many batches in flight) for more parallelism.
      prefetch: add `prefetch(AUTOTUNE)` (default True).

    Example:
      >>> StreamOptions(image_size=32, seed=0).image_size
      (32, 32)
      >>> StreamOptions(epochs=0)
      Traceback (most recent call last):
      ValueError: epochs must be a positive integer, got 0.
    """

    image_size: object = None
    augment: object = False
    preprocess: object = None
    seed: int = None
    epochs: int = None
    drop_small_classes: bool = False
    parallel_batches: int = None
    prefetch: bool = True

    def __post_init__(self):
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))):
            raise TypeError(f"seed must be an int or None, got {self.seed!r}.")
        for name in ("epochs", "parallel_batches"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        # frozen: the resolved values replace the given ones once, here
        object.__setattr__(self, "image_size", as_size(self.image_size))
        object.__setattr__(self, "augment", resolve_augment(self.augment))

    def finish(self, dataset):
        """`dataset`, prefetched if `prefetch`; without `epochs` its cardinality is declared infinite (what
        `tf.data` cannot tell through the sampler's filter), so that `fit` and `take` know the stream never
        ends."""
        if self.epochs is None:
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
        return dataset.prefetch(tf.data.AUTOTUNE) if self.prefetch else dataset


def usable_classes(source, samples_per_class, drop_small_classes=False):
    """Class ids the samplers draw from, after reporting (or dropping) classes with fewer than K items."""
    if len(source) == 0:
        raise ValueError(f"{source.name} is empty: no items to sample from.")
    counts = source.class_counts
    small = {c: n for c, n in counts.items() if n < samples_per_class}
    if small:
        shown = ", ".join(f"{source.class_name(c)} ({n})" for c, n in list(sorted(small.items()))[:10])
        more = "" if len(small) <= 10 else f", ... ({len(small) - 10} more)"
        action = "dropped" if drop_small_classes else "sampled with replacement"
        logger.warning(
            "%s: %d %s fewer than samples_per_class=%d images and %s %s (images per class in brackets): %s%s",
            source.name,
            len(small),
            "class has" if len(small) == 1 else "classes have",
            samples_per_class,
            "is" if len(small) == 1 else "are",
            action,
            shown,
            more,
        )
    classes = [c for c in sorted(counts) if not (drop_small_classes and c in small)]
    return np.asarray(classes, dtype=np.int64)


def steps_per_epoch(source, classes_per_batch, samples_per_class=1, drop_small_classes=False):
    """Batches per epoch of `class_balanced_dataset`: every class once, the last batch completed."""
    counts = source.class_counts
    n = sum(1 for c in counts.values() if not (drop_small_classes and c < samples_per_class))
    return -(-n // classes_per_batch)


def _slot_schedule(num_classes, group, seed, epochs):
    """Dataset of `(class_position, slot_id)`: per epoch a permutation of all classes, padded to a
    multiple of `group` with distinct classes from the same epoch; every `group` consecutive slots
    (aligned to `slot_id % group == 0`) hold distinct classes."""
    remainder = num_classes % group
    fill = group - remainder if remainder else 0
    per_epoch = num_classes + fill

    def epoch_slots(epoch):
        order_seed, fill_seed = tf.unstack(tf.random.experimental.stateless_split(_fold(seed, epoch), 2))
        perm = tf.random.experimental.stateless_shuffle(tf.range(num_classes, dtype=tf.int64), order_seed)
        if fill:
            # The last group holds perm[-remainder:]; complete it with classes not among them.
            extra = tf.random.experimental.stateless_shuffle(perm[: num_classes - remainder], fill_seed)
            perm = tf.concat([perm, extra[:fill]], axis=0)
        slot_ids = epoch * per_epoch + tf.range(per_epoch, dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices((perm, slot_ids))

    epochs_ds = tf.data.Dataset.range(epochs) if epochs is not None else tf.data.Dataset.counter()
    return epochs_ds.flat_map(dataset_function(epoch_slots))


def sample_without_replacement(counts, k_max, seed):
    """Per row `j`, `min(k_max, counts[j])` distinct offsets in `[0, counts[j])` (Floyd's algorithm,
    vectorised over rows; cost independent of the class sizes), tiled to `k_max` columns when a class
    has fewer items (sampling with replacement, every item used equally often)."""
    rows = tf.shape(counts)[0]
    take = tf.minimum(counts, k_max)
    uniforms = tf.random.stateless_uniform([rows, k_max], seed, dtype=tf.float64)
    chosen = tf.zeros([rows, 0], tf.int64)
    for step in range(k_max):
        top = counts - take + step  # draw from [0, top]
        draw = tf.minimum(tf.cast(uniforms[:, step] * tf.cast(top + 1, tf.float64), tf.int64), top)
        seen = tf.reduce_any(tf.equal(chosen, draw[:, None]), axis=1)
        chosen = tf.concat([chosen, tf.where(seen, top, draw)[:, None]], axis=1)
    columns = tf.range(k_max, dtype=tf.int64)[None, :] % tf.maximum(take, 1)[:, None]
    return tf.gather(chosen, columns, batch_dims=1)


class _BatchSampler:
    """Turns a group of `(class_position, slot_id)` slots into one batch of images, class-major.

    `ks` is the static number of images per slot position (`[K] * C` for balanced batches; train then
    validation sizes for episodes). All items of a batch are loaded by one parallel, order-preserving
    map; items that fail to load are skipped, reported, and replaced by a duplicate of an image of the
    same class that did load (as for classes smaller than `K`).
    """

    def __init__(self, source, classes, ks, seed, options):
        self.source = source
        labels = source.labels
        order = np.argsort(labels, kind="stable")
        sorted_labels = labels[order]
        starts = np.searchsorted(sorted_labels, classes, side="left")
        ends = np.searchsorted(sorted_labels, classes, side="right")
        self.order = tf.constant(order.astype(np.int64))
        self.starts = tf.constant(starts.astype(np.int64))
        self.counts = tf.constant((ends - starts).astype(np.int64))
        self.class_ids = tf.constant(classes.astype(np.int64))
        self.ks = list(ks)
        self.k_max = max(self.ks)
        self.total = sum(self.ks)
        # Static layout: flat position -> (slot, column within the slot).
        self.slot_of = tf.constant(np.repeat(np.arange(len(ks)), ks), tf.int64)
        self.column_of = tf.constant(np.concatenate([np.arange(k) for k in ks]), tf.int64)
        self.sample_seed, self.augment_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        self.image_size, self.augment, self.preprocess = options.image_size, options.augment, options.preprocess
        self.image_spec = self._image_spec()

    def _image(self, index, image_seed):
        return train_image(self.source.load(index), image_seed, self.image_size, self.augment, self.preprocess)

    def _image_spec(self):
        probe = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).map(
            dataset_function(lambda i: self._image(i, tf.stack([i, i])))
        )
        spec = probe.element_spec
        if not spec.shape.is_fully_defined():
            raise ValueError(
                f"{self.source.name}: images have no fixed size (got shape {spec.shape}); pass "
                "image_size=... so that they can be batched."
            )
        return spec

    def items(self, class_positions, slot_ids):
        """Flat `[total]` item indices of a batch, class-major."""
        counts = tf.gather(self.counts, class_positions)
        offsets = sample_without_replacement(counts, self.k_max, _fold(self.sample_seed, slot_ids[0]))
        flat = tf.gather_nd(offsets, tf.stack([self.slot_of, self.column_of], axis=1))
        return tf.gather(self.order, tf.gather(tf.gather(self.starts, class_positions), self.slot_of) + flat)

    def batch(self, class_positions, slot_ids):
        """Dataset with one element `(images [total, ...], labels [total], complete)`."""
        items = self.items(class_positions, slot_ids)
        seeds = _fold(self.augment_seed, slot_ids[0])
        labels = tf.gather(tf.gather(self.class_ids, class_positions), self.slot_of)
        spec = self.image_spec
        loaded = (
            tf.data.Dataset.from_tensor_slices((items, tf.range(self.total, dtype=tf.int64)))
            .map(dataset_function(lambda i, p: (self._image(i, _fold(seeds, p)), p)))
            .ignore_errors()
            .batch(self.total)
        )
        # When every item fails, `loaded` is empty: the empty sentinel still yields one (incomplete) batch.
        sentinel = tf.data.Dataset.from_tensors(
            (tf.zeros([0] + spec.shape.as_list(), spec.dtype), tf.zeros([0], tf.int64))
        )
        return (
            loaded.concatenate(sentinel)
            .take(1)
            .map(dataset_function(lambda images, positions: self._repair(images, positions, items, labels)))
        )

    def _repair(self, images, positions, items, labels):
        total = self.total
        present = tf.scatter_nd(positions[:, None], tf.ones_like(positions, tf.bool), [total])
        missing = tf.boolean_mask(items, tf.logical_not(present))
        tf.cond(
            tf.size(missing) > 0,
            lambda: tf.numpy_function(self._record, [missing], tf.int32, stateful=True),
            lambda: tf.constant(0),
        )
        flat = tf.range(total, dtype=tf.int64)
        # Each missing item is replaced by the first loaded item of its slot.
        first_loaded = tf.math.unsorted_segment_min(tf.where(present, flat, total), self.slot_of, len(self.ks))
        complete = tf.reduce_all(first_loaded < total)
        replacement = tf.gather(tf.minimum(first_loaded, total - 1), self.slot_of)
        source_position = tf.where(present, flat, replacement)
        row = tf.math.cumsum(tf.cast(present, tf.int64)) - 1  # row of a loaded position in `images`
        rows = tf.gather(row, source_position)
        shape = [total] + self.image_spec.shape.as_list()
        everything_loaded = tf.equal(tf.size(positions), total)
        # Copy the batch only when something has to be replaced (a copy costs as much as a decode).
        images = tf.cond(
            everything_loaded,
            lambda: images,
            lambda: tf.cond(complete, lambda: tf.gather(images, rows), lambda: tf.zeros(shape, self.image_spec.dtype)),
        )
        images = tf.ensure_shape(images, shape)
        return images, tf.ensure_shape(labels, [total]), complete

    def _record(self, missing):
        self.source.record_skipped(missing)
        return np.int32(0)


def _default_parallel_batches():
    return min(8, max(4, os.cpu_count() or 1))


def _batches(sampler, schedule, group, parallel_batches):
    """Deterministic stream of `(images, labels)` batches, `parallel_batches` of them loading at once
    (each on one thread: measured cheaper than a parallel map per batch, whose thread pool is rebuilt
    for every batch); a batch in which a class had no loadable image at all is dropped with a warning."""
    if parallel_batches is None:
        parallel_batches = _default_parallel_batches()
    ds = schedule.batch(group, drop_remainder=True).interleave(
        dataset_function(sampler.batch),
        cycle_length=parallel_batches,
        num_parallel_calls=parallel_batches,
        deterministic=True,
    )

    def keep(images, labels, complete):
        def warn():
            return tf.numpy_function(_warn_dropped, [labels], tf.int32, stateful=True)

        tf.cond(complete, lambda: tf.constant(0), warn)
        return complete

    return ds.filter(dataset_function(keep)).map(dataset_function(lambda images, labels, complete: (images, labels)))


def _warn_dropped(labels):
    logger.warning("dropped a batch: one of its classes %s has no loadable image left", sorted(set(labels.tolist())))
    return np.int32(0)


class _UniformOrderBatchSampler(_BatchSampler):
    """`_BatchSampler` whose K items of each class come in a uniform random order.

    Floyd's draw gives a uniform random SET but not a uniform order (drawing 3 of 10, items 8 and 9 never
    come first), and Group Loss takes "the first k samples of each class" as its randomly chosen anchors:
    each class's items are therefore permuted (independent uniform permutation per class and batch).
    """

    def items(self, class_positions, slot_ids):
        items = super().items(class_positions, slot_ids)
        keys = tf.random.stateless_uniform(
            [self.total], _fold(_fold(self.sample_seed, slot_ids[0]), 1), dtype=tf.float64
        )
        # slot + key (key in [0, 1)) sorts by slot first, then in random order within each slot.
        return tf.gather(items, tf.argsort(tf.cast(self.slot_of, tf.float64) + keys))


@_keywords.takes_fields(StreamOptions)
def class_balanced_dataset(source, classes_per_batch, samples_per_class, *, num_replicas=None, **stream):
    """Batches of exactly `classes_per_batch` distinct classes x `samples_per_class` images each.

    Args:
      source: a `tfdml.data.Source` (`image_folder`, `tfds_source`, `array_source`, `digits`).
      classes_per_batch: `C`, distinct classes per batch.
      samples_per_class: `K`, images per class per batch. Classes with fewer items are sampled with
        replacement (reported once through the `tfdml.data` logger) or, with `drop_small_classes=True`,
        left out.
      num_replicas: when set, checks that `C` divides evenly so each replica's contiguous share of a batch
        holds whole classes.
      image_size, augment, preprocess, seed, epochs, drop_small_classes,
        parallel_batches, prefetch: as in `StreamOptions`.

    Returns:
      `tf.data.Dataset` of `(images [C*K, h, w, c] float32, labels [C*K] int64)`, class-major: items
      `j*K .. j*K + K - 1` share one label, and within a class the K images are a uniform random choice in
      a uniform random order (so "the first n of each class", e.g. Group Loss's anchors, are a uniform
      random choice too). Undecodable images are skipped and replaced by other images of their class; see
      `source.skipped_count` / `source.corrupt_items`. Without `epochs` the stream never ends (its
      cardinality is `tf.data.INFINITE_CARDINALITY`): `fit` needs `steps_per_epoch`, which a tfdml model
      asks for at once (a plain `keras.Model` would run its first epoch forever).

    Example:
      >>> source = tfdml.data.digits("train")
      >>> ds = tfdml.data.class_balanced_dataset(source, 4, 8, image_size=32, seed=0)
      >>> images, labels = next(iter(ds))   # images [32, 32, 32, 1], labels [32]: 4 digits x 8
    """
    options = StreamOptions(**stream)
    classes = _batch_classes(source, classes_per_batch, samples_per_class, num_replicas, options.drop_small_classes)
    schedule_seed, sample_seed = _schedule_and_sample_seeds(options.seed)
    sampler = _UniformOrderBatchSampler(source, classes, [samples_per_class] * classes_per_batch, sample_seed, options)
    schedule = _slot_schedule(len(classes), classes_per_batch, schedule_seed, options.epochs)
    return options.finish(_batches(sampler, schedule, classes_per_batch, options.parallel_batches))


def _batch_classes(source, classes_per_batch, samples_per_class, num_replicas, drop_small_classes):
    """The classes `class_balanced_dataset` draws from, after checking its settings (`ValueError`)."""
    _check_positive("classes_per_batch", classes_per_batch)
    _check_positive("samples_per_class", samples_per_class)
    if num_replicas is not None:
        _check_positive("num_replicas", num_replicas)
        if classes_per_batch % num_replicas:
            raise ValueError(
                f"classes_per_batch={classes_per_batch} is not divisible by num_replicas={num_replicas}: "
                "each replica's share of the batch would split a class."
            )
    classes = usable_classes(source, samples_per_class, drop_small_classes)
    if len(classes) < classes_per_batch:
        raise ValueError(
            f"{source.name} has {len(classes)} usable classes, fewer than classes_per_batch="
            f"{classes_per_batch}" + (" after dropping small classes" if drop_small_classes else "") + "."
        )
    return classes


@_keywords.takes_fields(StreamOptions)
def episode_dataset(
    source,
    train_size=100,
    val_size=20,
    samples_per_class=5,
    train_classes=None,
    val_classes=None,
    *,
    disjoint_labels=True,
    val_source=None,
    **stream,
):
    """DML-ALA episodes: per step a training subset and a validation subset with disjoint label sets.

    Each step draws `train_classes + val_classes` distinct classes (from the same epoch schedule as
    `class_balanced_dataset`); the first `train_classes` fill the training subset with
    `train_size / train_classes` images each (class-balanced), the others the validation subset.
    `train_classes` defaults to `train_size // samples_per_class`, `val_classes` to
    `val_size // samples_per_class`; the sizes must divide evenly. With `drop_small_classes`, a class is left
    out when it has fewer items than the larger of the two subsets takes of one class.

    `disjoint_labels=False` gives the "random episodes" of the paper's Table 1 ablation: the validation
    classes are drawn independently of the training classes (their own epoch schedule), so the two subsets
    may share labels (and, for a shared class, images).

    `val_source` draws the validation subsets from another source instead: a small set whose labels were
    verified, for training under label noise (the assessor then learns what lowers the loss on labels that
    can be trusted; with noisy validation labels its signal is mostly noise). Its label ids must mean the same
    classes as `source`'s; its classes are scheduled on their own, so a validation class may also be in the
    step's training subset (`disjoint_labels` must stay True: it does not apply).

    Args:
      source: a `tfdml.data.Source` of the training classes.
      train_size, val_size: images of the training and the validation subset of a step (defaults 100, 20).
      samples_per_class: images per class when the class counts are not given (default 5).
      train_classes, val_classes: classes of each subset (defaults: the sizes // `samples_per_class`).
      disjoint_labels: draw both subsets from one batch of distinct classes (default True); False gives the
        random episodes above.
      val_source: the `tfdml.data.Source` of the validation subsets (default None: `source`).
      image_size, augment, preprocess, seed, epochs, drop_small_classes,
        parallel_batches, prefetch: as in `StreamOptions`.

    Returns:
      `tf.data.Dataset` whose elements are 4-tuples
      `(train_images [train_size, h, w, c], train_labels [train_size],
        val_images [val_size, h, w, c], val_labels [val_size])`, each subset class-major.

    Example:
      >>> ds = tfdml.data.episode_dataset(tfdml.data.digits("train"), train_size=60, val_size=20,
      ...                                 train_classes=3, val_classes=1, image_size=16, seed=0)
      >>> train_x, train_y, val_x, val_y = next(iter(ds))
    """
    options = StreamOptions(**stream)
    train_classes, val_classes = _episode_classes(train_size, val_size, samples_per_class, train_classes, val_classes)
    sizes = ((train_classes, train_size // train_classes), (val_classes, val_size // val_classes))
    _check_val_source(val_source, disjoint_labels)
    if val_source is not None or not disjoint_labels:
        val_source = source if val_source is None else val_source
        return options.finish(_independent_episodes(source, val_source, sizes, options))
    return options.finish(_disjoint_episodes(source, sizes, options))


def _check_val_source(val_source, disjoint_labels):
    if val_source is not None and not disjoint_labels:
        raise ValueError(
            "disjoint_labels=False draws the validation subsets from source; with val_source they come from "
            "val_source and the option does not apply."
        )


def _disjoint_episodes(source, sizes, options):
    """Episodes of `source` whose training and validation subsets (`(classes, k)` of `sizes`) are one batch of
    distinct classes, split after the training images (`episode_dataset`'s default)."""
    (train_classes, k_train), (val_classes, k_val) = sizes
    train_size, group = train_classes * k_train, train_classes + val_classes
    classes = usable_classes(source, max(k_train, k_val), options.drop_small_classes)
    if len(classes) < group:
        raise ValueError(
            f"{source.name} has {len(classes)} usable classes, fewer than train_classes + val_classes = "
            f"{train_classes} + {val_classes}: the two subsets need disjoint label sets."
        )
    schedule_seed, sample_seed = _schedule_and_sample_seeds(options.seed)
    ks = [k_train] * train_classes + [k_val] * val_classes
    sampler = _BatchSampler(source, classes, ks, sample_seed, options)
    schedule = _slot_schedule(len(classes), group, schedule_seed, options.epochs)

    def split(images, labels):
        return images[:train_size], labels[:train_size], images[train_size:], labels[train_size:]

    return _batches(sampler, schedule, group, options.parallel_batches).map(dataset_function(split))


def _independent_episodes(source, val_source, sizes, options):
    """Episodes whose training subsets come from `source` and validation subsets from `val_source`, each
    `(classes, k)` of `sizes` on its own class schedule, so the two may share labels (`episode_dataset`'s
    `disjoint_labels=False` and `val_source`)."""
    schedule_seed, sample_seed = _schedule_and_sample_seeds(options.seed)
    subsets = []
    for index, (subset, (n, k)) in enumerate(zip((source, val_source), sizes)):
        classes = usable_classes(subset, k, options.drop_small_classes)
        if len(classes) < n:
            role = "training" if index == 0 else "validation"
            raise ValueError(
                f"{subset.name} has {len(classes)} usable classes, fewer than the {n} classes of one {role} subset."
            )
        sampler = _BatchSampler(subset, classes, [k] * n, _fold(sample_seed, index), options)
        schedule = _slot_schedule(len(classes), n, _fold(schedule_seed, index), options.epochs)
        subsets.append(_batches(sampler, schedule, n, options.parallel_batches))
    return tf.data.Dataset.zip(tuple(subsets)).map(dataset_function(lambda train, val: (*train, *val)))


def _episode_classes(train_size, val_size, samples_per_class, train_classes, val_classes):
    """The checked `(train_classes, val_classes)` of an episode (defaults: size // samples_per_class)."""
    for name, value in (("train_size", train_size), ("val_size", val_size), ("samples_per_class", samples_per_class)):
        _check_positive(name, value)
    train_classes = train_classes or max(1, train_size // samples_per_class)
    val_classes = val_classes or max(1, val_size // samples_per_class)
    _check_positive("train_classes", train_classes)
    _check_positive("val_classes", val_classes)
    for subset, size, n in (("train", train_size, train_classes), ("val", val_size, val_classes)):
        if size % n:
            raise ValueError(
                f"{subset}_size={size} is not divisible by {subset}_classes={n}; pick sizes "
                "that split evenly over the classes."
            )
    return train_classes, val_classes
