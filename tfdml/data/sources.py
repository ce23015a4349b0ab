"""Image sources: a label index plus a lazy per-item image loader.

A `Source` keeps only what sampling needs in memory — one integer label per item and whatever locates an
item (file paths, a random-access tfds reader, or the caller's own arrays) — and loads pixels on demand,
inside `tf.data`, one item at a time. Every source yields `uint8` (or `[0, 255]` float) images of shape
`[height, width, channels]`; the pipelines in `tfdml.data` turn them into float32 batches.

Sources:

- `image_folder(path)`: one sub-folder per class (sorted names are the classes, labels `0..n-1`); every
  file is checked once when the source is made, and files that cannot be decoded (empty, truncated, not
  an image) are left out and named in one warning.
- `tfds_source(name, split)`: a TensorFlow Datasets builder read through its random-access data source;
  CUB-200-2011 and Cars196 re-split by class (first / last half of the classes), Stanford Online Products
  with its Ebay train/test split (labels from `class_id`).
- `array_source(images, labels)`: in-memory arrays.
- `digits(split)`: scikit-learn's 8x8 digits, classes 0-4 for `"train"`, 5-9 for `"test"` (no network).
"""

import collections
import inspect
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from tfdml.data.image_files import (  # noqa: F401  (ImageReadError, decode_*, read_image_files: re-exported)
    IMAGE_EXTENSIONS,
    MAX_NAMED,
    TF_FORMATS,
    ImageReadError,
    _decode_file,
    _pil_decode,
    check_image_file,
    decode_image_bytes,
    decode_image_file,
    read_image_files,
    report_skipped,
)

logger = logging.getLogger("tfdml.data")


# tfds builders whose official metric-learning protocol splits the classes, not the images.
CLASS_SPLIT_DATASETS = {"caltech_birds2011": 200, "cars196": 196}
LABEL_KEYS = {"stanford_online_products": "class_id"}


class Source:
    """Items addressed by index `0..n-1`: a label per item and a loader `index -> image`.

    Args:
      labels: integer class id per item, `[n]`, every id in `[0, num_classes)`.
      load: function of a scalar int64 tensor returning the item's image tensor `[H, W, C]`
        (`uint8`, or float in `[0, 255]`); traced by `tf.data`, so it must use TensorFlow ops
        (or `tf.numpy_function`). A failing load (undecodable file) is skipped by the pipelines.
      channels: number of image channels `C`.
      image_shape: static `(H, W, C)` when every image has the same shape, else `None`.
      num_classes: size of the label space; defaults to `max(labels) + 1`.
      describe: function `index -> str` naming an item in reports (e.g. its file path).
      name: short description used in messages.

    Attributes:
      class_names: names of the class ids (`class_names[label]`, e.g. the folder names of `image_folder`),
        or None; `class_name(label)` gives a class's name for messages either way.
      class_counts: `{class_id: number_of_items}` for every class that has items.
      corrupt_items: sorted indices of items that failed to load so far (filled during iteration).
      skipped_count: how many load failures were skipped so far (a corrupt item met twice counts twice).
    """

    def __init__(self, labels, load, channels, image_shape=None, num_classes=None, describe=None, name="source"):
        labels = np.asarray(labels)
        if labels.ndim != 1:
            raise ValueError(f"{name}: labels must be a 1-D array of class ids, got shape {labels.shape}.")
        if labels.size and not np.issubdtype(labels.dtype, np.integer):
            if not np.all(np.equal(np.mod(labels, 1), 0)):
                raise ValueError(f"{name}: labels must be integer class ids, got dtype {labels.dtype}.")
        labels = labels.astype(np.int64)
        if labels.size and labels.min() < 0:
            bad = int(labels.min())
            raise ValueError(f"{name}: labels out of range: found {bad}; class ids must be >= 0.")
        if num_classes is None:
            num_classes = int(labels.max()) + 1 if labels.size else 0
        elif labels.size and labels.max() >= num_classes:
            raise ValueError(
                f"{name}: labels out of range: found class id {int(labels.max())} but num_classes="
                f"{num_classes} (ids must be in [0, {num_classes}))."
            )
        self.labels = labels
        self.load = load
        self.channels = int(channels)
        self.image_shape = tuple(image_shape) if image_shape is not None else None
        self.num_classes = int(num_classes)
        self.name = name
        self._describe = describe or (lambda i: f"item {i}")
        self._lock = threading.Lock()
        self._corrupt = set()
        self._skipped = 0

    class_names = None  # set by the sources that know them (image folders, embedded data sets)

    def __len__(self):
        return int(self.labels.size)

    def __repr__(self):
        return (
            f"<tfdml.data.Source {self.name}: {len(self)} items, {len(self.classes)} classes, "
            f"image_shape={self.image_shape}>"
        )

    @property
    def classes(self):
        """Sorted class ids that have at least one item."""
        return np.unique(self.labels)

    @property
    def class_counts(self):
        ids, counts = np.unique(self.labels, return_counts=True)
        return {int(c): int(n) for c, n in zip(ids, counts)}

    @property
    def corrupt_items(self):
        with self._lock:
            return sorted(self._corrupt)

    @property
    def skipped_count(self):
        with self._lock:
            return self._skipped

    def describe(self, index):
        return self._describe(int(index))

    def class_name(self, label):
        """The name of class id `label` for messages: its folder or class name when known, else the id."""
        names = self.class_names
        return str(names[label]) if names is not None and 0 <= label < len(names) else str(label)

    def name_classes(self, labels, limit=10):
        """`"ant, bee, ... (3 more)"`: the names of up to `limit` class ids, then a count of the rest."""
        labels = [int(c) for c in labels]
        shown = ", ".join(self.class_name(c) for c in labels[:limit])
        return shown + (f", ... ({len(labels) - limit} more)" if len(labels) > limit else "")

    def record_skipped(self, indices):
        """Called from the pipelines (through `tf.numpy_function`) with the indices that failed to load."""
        indices = [int(i) for i in np.asarray(indices).ravel()]
        with self._lock:
            new = [i for i in indices if i not in self._corrupt]
            self._corrupt.update(indices)
            self._skipped += len(indices)
            total = self._skipped
        for i in new:
            logger.warning("%s: skipped undecodable image %s (%d skipped so far)", self.name, self.describe(i), total)

    def subset(self, indices, name=None):
        """A source over `indices` of this one (same loader, label space and class names; its own skip
        counts, with items named as in this source; the files of `indices` when this source has `paths`)."""
        indices = np.asarray(indices, dtype=np.int64)
        parent = self
        table = tf.constant(indices)

        def load(i):
            return parent.load(tf.gather(table, i))

        # The parent's loader is what runs: it decides whether the pipelines trace with AutoGraph (`tracing`).
        load.__module__ = getattr(parent.load, "__module__", None)
        subset = Source(
            self.labels[indices],
            load,
            self.channels,
            self.image_shape,
            self.num_classes,
            describe=lambda i: parent.describe(indices[i]),
            name=name or self.name,
        )
        subset.class_names = self.class_names  # the same label space
        paths = getattr(self, "paths", None)
        if paths is not None:
            subset.paths = [paths[i] for i in indices]
        return subset


def load_items(source):
    """`(images, kept)`: every item of `source` as a uint8 array (loaded eagerly, in order) and the indices
    that loaded; items that fail are skipped, recorded on the source and named in one warning."""

    def as_uint8(image):
        image = np.asarray(image)
        return image if image.dtype == np.uint8 else np.clip(np.round(image), 0, 255).astype(np.uint8)

    stored = getattr(source, "images", None)
    if stored is not None:
        return [as_uint8(image) for image in stored], np.arange(len(source), dtype=np.int64)
    images, kept, problems = [], [], []
    for i in range(len(source)):
        try:
            image = source.load(tf.constant(i, tf.int64))
        except (tf.errors.OpError, ValueError) as error:
            problems.append((source.describe(i), str(error).splitlines()[0][:200]))
            continue
        images.append(as_uint8(image))
        kept.append(i)
    if problems:
        source.record_skipped([i for i in range(len(source)) if i not in set(kept)])
    report_skipped(source.name, problems, len(source))
    if not images:
        raise ValueError(f"{source.name}: no item can be loaded.")
    return images, np.asarray(kept, np.int64)


def list_class_folders(path, class_names=None, extensions=IMAGE_EXTENSIONS):
    """`(paths, labels, class_names)` of the images in `path/<class_name>/<image files>`.

    Class ids follow the sorted sub-folder names, or the order of `class_names` when given (e.g. to match
    query classes to gallery classes; missing class folders are then skipped). Files are sorted; the files
    whose names do not end in one of `extensions` (hidden ones aside) are left out and named in one warning.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"image folder {path!r} is not a directory.")
    if class_names is None:
        class_names = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
        if not class_names:
            raise ValueError(f"image folder {path!r} has no class sub-folders (expected path/<class>/<image>).")
    paths, labels, others = [], [], []
    extensions = tuple(e.lower() for e in extensions)
    for label, name in enumerate(class_names):
        folder = os.path.join(path, name)
        if not os.path.isdir(folder):
            continue
        for file in sorted(os.listdir(folder)):
            if file.lower().endswith(extensions):
                paths.append(os.path.join(folder, file))
                labels.append(label)
            elif not file.startswith(".") and os.path.isfile(os.path.join(folder, file)):
                others.append(os.path.join(name, file))
    if not paths:
        raise ValueError(
            f"image folder {path!r}: no image files ({', '.join(extensions)}) in its class sub-folders"
            + (f"; they hold {_named(others)} with other names" if others else "")
            + "."
        )
    if others:
        logger.warning(
            "image_folder(%s): %s not read: their names do not end in an image extension (%s); an image among "
            "them is read once its name ends in one",
            path,
            _named(others),
            ", ".join(extensions),
        )
    return paths, np.asarray(labels, np.int64), list(class_names)


def _named(files):
    """`3 files (a/x, a/y, b/z)`: a count and the first `MAX_NAMED` names."""
    more = f", ... ({len(files) - MAX_NAMED} more)" if len(files) > MAX_NAMED else ""
    return f"{len(files)} file{'s' if len(files) != 1 else ''} ({', '.join(files[:MAX_NAMED])}{more})"


def scan_image_files(paths):
    """`(formats, problems)`: the image format of each file (None when it cannot be decoded) and the
    `(path, reason)` of the undecodable ones (see `check_image_file`)."""
    # Pillow releases the GIL while it decodes: threads scale the JPEG check over the cores.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        checked = list(pool.map(check_image_file, paths, chunksize=64))
    formats = [image_format for image_format, _ in checked]
    problems = [(path, problem) for path, (_, problem) in zip(paths, checked) if problem]
    return formats, problems


def image_folder(path, channels=3, extensions=IMAGE_EXTENSIONS, class_names=None, validate=True):
    """A source over `path/<class_name>/<image files>`; class ids follow the sorted class folder names
    (or the order of `class_names`, e.g. to match a query folder to a gallery folder).

    Only the file list and labels are held in memory; images are read and decoded lazily (TensorFlow's
    decoders; Pillow for TIFF). With `validate=True` every file is checked once here (about half the cost
    of a full decode; see `check_image_file`): undecodable
    files (empty, truncated, not an image) are left out and
    named in one warning, and listed in `source.skipped_files` as `(path, reason)`. The class names are
    in `source.class_names`, the files in `source.paths`.
    """
    paths, labels, class_names = list_class_folders(path, class_names=class_names, extensions=extensions)
    skipped = []
    uses_pil = [False] * len(paths)
    if validate:
        formats, skipped = scan_image_files(paths)
        report_skipped(f"image_folder({path})", skipped, len(paths))
        keep = [i for i, f in enumerate(formats) if f is not None]
        if not keep:
            raise ValueError(
                f"image folder {path!r}: none of its {len(paths)} image files can be decoded: "
                + "; ".join(f"{p} ({r})" for p, r in skipped[:MAX_NAMED])
            )
        uses_pil = [formats[i] not in TF_FORMATS for i in keep]
        paths, labels = [paths[i] for i in keep], labels[keep]
    _report_empty_classes(path, class_names, labels, skipped)
    table = tf.constant(paths)
    pil_table = tf.constant(uses_pil)

    def load(i):
        file = tf.gather(table, i)
        if not any(uses_pil):
            return _decode_file(file, channels)
        return tf.cond(
            tf.gather(pil_table, i), lambda: _pil_decode(file, channels), lambda: _decode_file(file, channels)
        )

    source = Source(
        labels, load, channels, num_classes=len(class_names), describe=lambda i: paths[i], name=f"image_folder({path})"
    )
    source.class_names = class_names
    source.paths = paths
    source.skipped_files = skipped
    return source


def _report_empty_classes(path, class_names, labels, skipped):
    """One warning naming the class folders left without an image: no image files, or none decodable."""
    present = set(np.unique(labels).tolist())
    unreadable = collections.Counter(os.path.basename(os.path.dirname(file)) for file, _ in skipped)
    empty = [name for label, name in enumerate(class_names) if label not in present]
    if empty:
        why = [
            f"{name} ({unreadable[name]} file{'s' if unreadable[name] > 1 else ''}, none decodable)"
            if name in unreadable
            else f"{name} (no image files)"
            for name in empty
        ]
        logger.warning(
            "image_folder(%s): %d of %d class folders %s no readable image and %s left out: %s%s",
            path,
            len(empty),
            len(class_names),
            "has" if len(empty) == 1 else "have",
            "is" if len(empty) == 1 else "are",
            ", ".join(why[:MAX_NAMED]),
            f", ... ({len(why) - MAX_NAMED} more)" if len(why) > MAX_NAMED else "",
        )


def class_halves(source):
    """`(first half, second half)` of the classes of `source` that have items, by class id (for an image
    folder: by sorted class-folder name). The zero-shot protocol: train on one half, evaluate on the
    unseen other half. `ValueError` for fewer than 2 classes."""
    classes = source.classes
    if len(classes) < 2:
        raise ValueError(
            f"{source.name} has {len(classes)} class(es) with images; the split into a training "
            "and an evaluation half of the classes needs at least 2"
        )
    cut = classes[len(classes) // 2]
    return tuple(
        source.subset(np.flatnonzero(keep), name=f"{source.name}, {part} half of the classes")
        for keep, part in ((source.labels < cut, "first"), (source.labels >= cut, "second"))
    )


def single_image_classes(source):
    """Class ids of `source` with exactly one item: in a retrieval evaluation over the same set such an
    item is a gallery item only (no other image of its class to find), so it asks no query."""
    return [c for c, n in source.class_counts.items() if n == 1]


def array_source(images, labels, num_classes=None, name="array_source"):
    """A source over in-memory `images [n, H, W]` or `[n, H, W, C]` (uint8 or floats in [0, 255]).

    The arrays are the caller's; items are gathered one at a time inside `tf.data`.
    """
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4:
        raise ValueError(f"{name}: images must have shape [n, H, W] or [n, H, W, C], got {images.shape}.")
    if labels.shape != (images.shape[0],):
        raise ValueError(
            f"{name}: {images.shape[0]} images but labels has shape {labels.shape}; expected one label per image."
        )
    if not (images.dtype == np.uint8 or np.issubdtype(images.dtype, np.floating)):
        raise TypeError(f"{name}: images must be uint8 or float, got {images.dtype}.")
    table = tf.constant(images)

    def load(i):
        return tf.gather(table, i)

    source = Source(labels, load, images.shape[-1], images.shape[1:], num_classes, name=name)
    source.images = images  # in memory: read directly by `load_items` (export, evaluation of exports)
    return source


def digits(split="train"):
    """scikit-learn's 1,797 handwritten digits as a source of `uint8 [8, 8, 1]` images (0-255).

    Split by class: `"train"` holds digits 0-4, `"test"` digits 5-9 (labels keep their digit value),
    `"all"` every digit. Pass `image_size=32` (or any size) to the dataset functions to upscale.
    """
    data = load_digits()
    images = np.round(data.images * (255.0 / 16.0)).astype(np.uint8)
    labels = data.target.astype(np.int64)
    if split == "train":
        keep = labels < 5
    elif split == "test":
        keep = labels >= 5
    elif split == "all":
        keep = np.ones_like(labels, dtype=bool)
    else:
        raise ValueError(f"digits: split must be 'train', 'test' or 'all', got {split!r}.")
    source = array_source(images[keep], labels[keep], num_classes=10, name=f"digits({split})")
    source.class_names = [str(digit) for digit in range(10)]
    return source


# Data sets that ship with tfdml (no network): `name -> function(split) -> Source` with "train" / "test"
# splits. Other modules add theirs (`tfdml.data` adds `EMBEDDED_SOURCES["glyphs"] = glyphs`; a user's own
# function can be added the same way).
EMBEDDED_SOURCES = {"digits": digits}


def embedded_source(name, split="test", **options):
    """The `split` of the embedded data set `name` (see `EMBEDDED_SOURCES`). `options` (e.g. `image_size`
    for data sets rendered at a size) are passed on to the functions that take them and ignored by the others."""

    function = EMBEDDED_SOURCES.get(name)
    if function is None:
        raise ValueError(
            f"unknown embedded data set {name!r}; embedded data sets: {', '.join(sorted(EMBEDDED_SOURCES))}."
        )
    accepted = inspect.signature(function).parameters
    source = function(split, **{k: v for k, v in options.items() if k in accepted and v is not None})
    if not isinstance(source, Source):
        raise ValueError(f"tfdml.data.{name}({split!r}) is not a tfdml.data.Source.")
    return source


def _class_split(num_classes, split):
    half = num_classes // 2
    if split == "train":
        return 0, half
    if split == "test":
        return half, num_classes
    raise ValueError(
        f"split must be 'train' (first {half} classes) or 'test' (last {num_classes - half}) "
        f"for a class-split dataset, got {split!r}."
    )


class DatasetUnavailable(RuntimeError):
    """A tfds data set that cannot be opened for random access (not prepared, or not in ArrayRecord format).

    `name`, `split` and `reason` let a caller say what to do in its own words (the CLI names
    `--set data.download=true`); the message says it for a Python caller."""

    def __init__(self, name, split, tfds_split, reason):
        self.name, self.split, self.reason = name, tfds_split, reason
        manual = ", manual_dir=<folder with the archives>" if name == "cars196" else ""
        super().__init__(
            f"tfds_source: cannot open {name!r} split {tfds_split!r} for random access ({reason}). Prepare it in "
            f"ArrayRecord format, e.g. tfds_source({name!r}, {split!r}, download=True{manual}), or "
            "`tfds build --file_format=array_record`."
        )


def tfds_source(
    name, split, data_dir=None, manual_dir=None, download=False, label_key=None, image_key="image", class_split=None
):
    """A source over a TensorFlow Datasets split, read by random access (tfds `data_source`).

    `caltech_birds2011` and `cars196` follow the metric-learning protocol: `split="train"` is the first
    half of the classes (100 / 98) of all their images, `split="test"` the second half; pass
    `class_split=False` to use the tfds splits as they are. `stanford_online_products` uses its own Ebay
    train/test split with labels from `class_id`. Labels keep their dataset ids.

    Random access needs the dataset prepared in ArrayRecord format: with `download=True` it is prepared
    that way under `data_dir`; Cars196's upstream URL is dead, so put its archives in `manual_dir`.
    Only the labels are read up front (one pass, images not decoded); images load lazily.
    """
    import tensorflow_datasets as tfds  # only for tfds data sets: its import takes seconds

    label_key = label_key or LABEL_KEYS.get(name, "label")
    if class_split is None:
        class_split = name in CLASS_SPLIT_DATASETS
    prepare_kwargs = {}
    if manual_dir is not None:
        prepare_kwargs["download_config"] = tfds.download.DownloadConfig(manual_dir=manual_dir)
    tfds_split = "train+test" if class_split else split

    def open_source(decoders=None):
        try:
            return tfds.data_source(
                name,
                split=tfds_split,
                data_dir=data_dir,
                download=download,
                decoders=decoders,
                builder_kwargs={"file_format": "array_record"},
                download_and_prepare_kwargs=prepare_kwargs or None,
            )
        except Exception as err:  # tfds raises several types; all mean "not readable by random access"
            raise DatasetUnavailable(name, split, tfds_split, err) from err

    label_reader = open_source(tfds.decode.PartialDecoding({label_key: True}))
    labels = np.fromiter(
        (int(label_reader[i][label_key]) for i in range(len(label_reader))), dtype=np.int64, count=len(label_reader)
    )
    builder = tfds.builder(name, data_dir=data_dir)
    num_classes = builder.info.features[label_key].num_classes
    reader = open_source()
    channels = builder.info.features[image_key].shape[-1]
    describe = lambda i: f"{name}[{tfds_split}] record {i}"  # noqa: E731
    source = Source(
        labels,
        _tfds_loader(reader, image_key, channels),
        channels,
        num_classes=num_classes,
        describe=describe,
        name=f"tfds({name}, {split})",
    )
    if class_split:
        low, high = _class_split(num_classes, split)
        keep = np.flatnonzero((labels >= low) & (labels < high))
        source = source.subset(keep, name=f"tfds({name}, {split}: classes {low}-{high - 1})")
    return source


def _tfds_loader(reader, image_key, channels):
    def read(i):
        return np.asarray(reader[int(i)][image_key], dtype=np.uint8)

    def load(i):
        image = tf.numpy_function(read, [i], tf.uint8, stateful=False)
        image.set_shape([None, None, channels])
        return image

    return load


def job_evaluation_source(training_config, channels=3):
    """The evaluation data of a `tfdml train` job from its configuration's `data` section (as recorded in
    export metadata and report `config.yaml`): an embedded data set, the evaluation image folder, or the
    second half of the classes of the training folder (the job's split without `eval_path`); None
    for tfds jobs (their data may not be on this machine) or without a configuration."""
    data = (training_config or {}).get("data") or {}
    kind = data.get("source")
    if kind == "folder" and data.get("eval_path"):
        return image_folder(data["eval_path"], channels=channels)
    if kind == "folder" and data.get("path"):  # no evaluation folder: the job evaluated the second half
        return class_halves(image_folder(data["path"], channels=channels))[1]
    if kind and kind not in ("tfds", "folder"):
        # The data section's settings that the data set's function takes (image_size, images_per_class, ...).
        options = {k: v for k, v in data.items() if k not in ("source", "name", "train_split", "eval_split")}
        return embedded_source(kind, data.get("eval_split") or "test", **options)
    return None
