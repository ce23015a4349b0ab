"""The job's data: its sources, the configuration checked against them, and the training and evaluation
batches."""

import dataclasses
import logging

import numpy as np

from tfdml import data as data_lib
from tfdml import losses, recipes
from tfdml.config import LOSSES, ConfigError, DataConfig
from tfdml.data.sources import DatasetUnavailable, class_halves, single_image_classes

logger = logging.getLogger(__name__)


def augment_setting(augment):
    """`data.augment` (true, false, an `Augment` or a mapping of its fields) -> what `tfdml.data` takes."""

    return DataConfig.from_dict({"augment": augment}).augment


def load_sources(data):
    """`(train source, evaluation source)` from a `DataConfig`."""

    if data.source in data_lib.EMBEDDED_SOURCES:
        # The same path as `tfdml evaluate` / `tfdml export` take to a job's embedded data: each data set's
        # function gets the settings it takes (glyphs: image_size, images_per_class).
        options = dict(image_size=data.image_size, images_per_class=data.images_per_class)
        return tuple(data_lib.embedded_source(data.source, split, **options) for split in ("train", "test"))
    if data.source == "tfds":
        common = dict(data_dir=data.data_dir, manual_dir=data.manual_dir, download=data.download)
        try:
            return (
                data_lib.tfds_source(data.name, data.train_split, **common),
                data_lib.tfds_source(data.name, data.eval_split, **common),
            )
        except DatasetUnavailable as error:
            raise ConfigError(_unavailable_message(data, error)) from None
    train = _open_image_folder(data.path, "data.path")
    if data.eval_path is None:
        try:
            return class_halves(train)
        except ValueError as error:
            raise ConfigError(f"data.path: {error} (or give data.eval_path, --eval-image-dir)") from None
    return train, _open_image_folder(data.eval_path, "data.eval_path")


def _open_image_folder(path, key, channels=3):
    """`tfdml.data.image_folder(path)`; an image folder without images is the user's input, so its error is
    a `ConfigError` naming the configuration `key`."""
    try:
        return data_lib.image_folder(path, channels=channels)
    except (ValueError, FileNotFoundError) as error:
        raise ConfigError(f"{key}: {error}") from None


def _unavailable_message(data, error):
    """A tfds data set that is not prepared, said with the configuration keys that fix it."""
    reason = str(error.reason).strip().splitlines()[0] if str(error.reason).strip() else type(error.reason).__name__
    how = (
        "let tfds download and prepare it with --set data.download=true (needs the network)"
        if not data.download
        else "check the network, or prepare it elsewhere"
    )
    if data.name.split("/")[0] == "cars196":
        how += " and put its archives in --set data.manual_dir=DIR"
    where = f"data.data_dir={data.data_dir}" if data.data_dir else "the default data.data_dir (~/tensorflow_datasets)"
    return (
        f"data.name: the tfds data set {data.name!r} (split {error.split!r}) is not prepared for random access "
        f"in {where} ({reason}); {how}, or point --set data.data_dir=DIR at a copy prepared in ArrayRecord "
        "format (tfds build --file_format=array_record)"
    )


def _available_classes(config, train_source):
    """Classes the class-balanced sampler can draw from (all, or those with samples_per_class images when
    small classes are dropped)."""
    counts = train_source.class_counts.values()
    if config.data.small_class_policy == "drop":
        return sum(1 for n in counts if n >= config.data.samples_per_class)
    return len(counts)


def fit_to_data(config, train_source, fit_classes_per_batch=False, say=print):
    """`config` checked against the training data; `ConfigError` naming the key when they do not fit.

    With `fit_classes_per_batch` (what `tfdml train` passes when the user did not set
    `data.classes_per_batch`), training data with fewer classes than `data.classes_per_batch` trains on
    batches of all its classes instead, said in one line; the returned config records that number."""
    num_classes, top_label = config.model.num_classes, int(np.max(train_source.labels, initial=-1))
    if num_classes is not None and top_label >= num_classes:
        raise ConfigError(
            f"model.num_classes={num_classes} but the training labels go up to {top_label}: the "
            "classifier head needs every class id below it"
        )
    config = _proxies_for_the_classes(config, top_label)
    if config.ala.enabled:
        return config
    available, wanted = _available_classes(config, train_source), config.data.classes_per_batch
    if wanted <= available:
        return config
    names = train_source.name_classes(train_source.classes, limit=5)
    if fit_classes_per_batch and available >= 2:
        say(
            f"data.classes_per_batch: the training data ({train_source.name}) has {available} classes, fewer "
            f"than the default {wanted}: training on batches of {available} classes x "
            f"{config.data.samples_per_class} images (set data.classes_per_batch to choose)"
        )
        return config.replace(data=config.data.replace(classes_per_batch=available))
    raise ConfigError(
        f"data.classes_per_batch: {wanted} classes per batch, but the training data "
        f"({train_source.name}) has {available} usable class(es) ({names}); a batch needs at "
        "least 2 classes and at most as many as the data has"
    )


def _proxies_for_the_classes(config, top_label):
    """A proxy or classifier loss (one weight vector per class: NormSoftmax, Proxy-Anchor, ...) without
    `loss.params.num_classes` gets one for each class id up to the training data's largest (the ids index them)."""
    section = config.loss
    needs = section.name != "group" and "num_classes" in recipes.required_arguments(
        getattr(losses, LOSSES[section.name])
    )
    if not needs or "num_classes" in section.params:
        return config
    return config.replace(loss=section.replace(params={**section.params, "num_classes": top_label + 1}))


def steps_per_epoch(config, train_source):
    """`training.steps_per_epoch`, or (null) the batches of one pass over the training images:
    `ceil(images / (classes_per_batch * samples_per_class))` (Group Loss's epochs; CUB: 5864 images in
    6 x 9 batches give 109 steps)."""
    if config.training.steps_per_epoch is not None:
        return config.training.steps_per_epoch
    batch = config.data.classes_per_batch * config.data.samples_per_class
    return max(1, -(-len(train_source.labels) // batch))


@dataclasses.dataclass
class Datasets:
    train: object  # class-balanced batches or ALA episodes, endless
    eval: object  # evaluation images: raw pixels at the model's input size
    pixels: object  # the same batches (raw-pixel baseline, report grid)
    train_source: object = None  # the training images (the heads' warm-up embeds them once)


def make_datasets(config, train_source, eval_source, num_replicas=1):
    """Raw pixels, resized, cropped or augmented as the job says: the embedder applies its own pixel
    preprocessing (its first layer), as the exported model does."""

    data = config.data
    common = dict(
        image_size=data.image_size,
        augment=data.augment,
        seed=config.seed,
        drop_small_classes=data.small_class_policy == "drop",
    )
    # What the sampler cannot do with this data (too few classes or images) is a setting of that section.
    section = "ala.episode" if config.ala.enabled else "data"
    verified = None  # ala.val_path: the validation subsets from hand-checked images, decoded as the training ones
    if config.ala.enabled and config.ala.val_path is not None:  # opened outside the try: its errors name its key
        verified = _open_image_folder(config.ala.val_path, "ala.val_path", channels=train_source.channels)
    try:
        if config.ala.enabled:
            train = data_lib.episode_dataset(
                train_source, val_source=verified, **common, **config.ala.episode.arguments(config.data)
            )
        else:
            train = data_lib.class_balanced_dataset(
                train_source,
                data.classes_per_batch,
                data.samples_per_class,
                num_replicas=num_replicas if num_replicas > 1 else None,
                **common,
            )
    except ValueError as error:
        raise ConfigError(f"{section}: {error}") from None
    batch, crop = config.evaluation.batch_size, data_lib.evaluation_center_crop(data.augment)
    evaluation = data_lib.eval_dataset(eval_source, batch, image_size=data.image_size, center_crop=crop)
    return Datasets(train=train, eval=evaluation, pixels=evaluation, train_source=train_source)


def check_unseen_classes(train_source, eval_source):
    """A warning when the evaluation classes are also training classes: the figures are then not retrieval
    of unseen classes. Compared by class name (image folders, embedded data sets), else by class id."""
    train_names, eval_names = train_source.class_names, eval_source.class_names
    if train_names is not None and eval_names is not None:
        names = [{source.class_name(int(c)) for c in source.classes} for source in (train_source, eval_source)]
        shared = sorted(names[0] & names[1])
    elif train_names is None and eval_names is None:
        shared = sorted(set(map(int, train_source.classes)) & set(map(int, eval_source.classes)))
    else:
        return
    if shared:
        named = ", ".join(map(str, shared[:5])) + (f" and {len(shared) - 5} more" if len(shared) > 5 else "")
        logger.warning(
            "%s shares %d of its %d classes with the training data (%s): %s; the retrieval figures are not on "
            "unseen classes",
            eval_source.name,
            len(shared),
            len(eval_source.classes),
            train_source.name,
            named,
        )


def check_evaluation_data(eval_source):

    single = single_image_classes(eval_source)
    if single:
        logger.warning(
            "%s: %d evaluation %s a single image and %s no query (nothing of %s class to find), "
            "only a gallery item: %s",
            eval_source.name,
            len(single),
            "class has" if len(single) == 1 else "classes have",
            "asks" if len(single) == 1 else "ask",
            "its" if len(single) == 1 else "their",
            eval_source.name_classes(single),
        )
    if len(single) == len(eval_source.classes):
        raise ConfigError(
            f"evaluation data ({eval_source.name}): every class has a single image, so no "
            "image has another of its class to retrieve; give at least 2 images per class"
        )
