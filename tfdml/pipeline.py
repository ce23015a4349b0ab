"""The main job: train an embedder from a configuration, evaluate it, export it, and write a report.

`run(config)` is what `tfdml train` runs. With the default job of `tfdml.config` it trains a small-CNN
embedder with Ranked List Loss on class-balanced batches of half of the glyph classes (`tfdml.data.glyphs`),
evaluates retrieval on the unseen half (exact ScaNN search) beside a raw-pixel baseline, exports a TF Serving
SavedModel with the ScaNN index of the evaluation images inside its version, and writes a report folder:

    <report_dir>/metrics.json          metrics of the model and of the raw-pixel baseline, timings, history
    <report_dir>/config.yaml           the resolved configuration (`load_config` reads it back)
    <report_dir>/recall_at_k.png       Recall@K curves (model vs raw pixels)
    <report_dir>/training_curves.png   loss (and per-level losses) per epoch
    <report_dir>/retrieval_grid.png    query images and their nearest neighbours
    <report_dir>/tensorboard/          TensorBoard logs; its run `projector` holds the evaluation embeddings,
                                       class names and image sprite for the projector (PCA, t-SNE)
    <report_dir>/checkpoints/          state of an unfinished run: started again, it resumes where it stopped
                                       (after training, at the report); cleared once the report is in place

The job runs in stages, each a function of the typed `Config` that returns its result:
`choose_report_dir` (a finished report is kept), `prepare_report_dir` (resume or refuse), `load_sources`,
`build_model`, `make_datasets`, `train`, `evaluate`, `export`, then `write_report` into a folder beside the
report folder and `publish_report`, which moves it into place in one step and clears the checkpoints. The
report folder is locked for the whole job (`tfdml.locks`).
"""

import ctypes
import dataclasses
import errno
import glob
import json
import logging
import os
import shutil
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf
import yaml

from tfdml import callbacks as callbacks_lib
from tfdml import data as data_lib
from tfdml import export as export_lib
from tfdml import interrupts, losses, plots, projector, recipes, retrieval
from tfdml.callbacks import completed_epochs
from tfdml.config import (
    LOSSES,
    Config,
    ConfigError,
    DataConfig,
    default_config,
    default_report_dir,
    differences,
    output_dir_problem,
)
from tfdml.data.sources import DatasetUnavailable, class_halves, single_image_classes
from tfdml.locks import FolderLock
from tfdml.models import ALAModel
from tfdml.models.backbones import PretrainedWeightsError
from tfdml.ops.neighbours import exact_search
from tfdml.training import fit_distributed

logger = logging.getLogger("tfdml.pipeline")

# Sections that do not change what is trained: a resumed run may change them.
_RESUMABLE_CHANGES = ("description", "paper_target", "evaluation", "export", "report", "training.eval_every")
CONFIG_SNAPSHOT = "tfdml_config.yaml"
# In the checkpoint folder once training is complete: the embedder's weights (a rerun after a stop goes
# straight to the report) and the export written before the stop (not written twice).
TRAINED_WEIGHTS = "tfdml_trained.weights.h5"
EXPORT_RECORD = "tfdml_export.json"


def build_loss(section, num_classes=None, total_steps=None, embedding_dim=None):
    """A tfdml loss from a `LossConfig` (`name`, `params`, optional `dynamic_temperature`), in a
    `CrossBatchMemory` of `embedding_dim`-wide embeddings with `cross_batch_memory`, in `SmallLossWeighting`
    or `PRISM` with `label_noise`."""

    params = dict(section.params)
    schedule = section.dynamic_temperature
    if schedule is not None:
        params["tn"] = losses.LinearTemperature(schedule.t1, schedule.t2, schedule.max_steps or total_steps)
    if section.name == "group":
        params.setdefault("num_classes", num_classes)
        if params["num_classes"] is None:
            raise ConfigError("model.num_classes: the group loss needs the classifier head size")
    loss = getattr(losses, LOSSES[section.name])(**params)
    memory = section.cross_batch_memory
    if memory is not None:
        loss = losses.CrossBatchMemory(
            loss, memory_size=memory.memory_size, embedding_dim=embedding_dim, start_step=memory.start_step
        )
    noise = section.label_noise
    if noise is not None and noise.method == "small_loss":
        loss = losses.SmallLossWeighting(loss, drop_rate=noise.rate)
    elif noise is not None:
        window = {} if noise.window_size is None else {"window_size": noise.window_size}
        loss = losses.PRISM(
            loss, noise_rate=noise.rate, memory_size=noise.memory_size, embedding_dim=embedding_dim, **window
        )
    return loss


def augment_setting(augment):
    """`data.augment` (true, false, an `Augment` or a mapping of its fields) -> what `tfdml.data` takes."""

    return DataConfig.from_dict({"augment": augment}).augment


def resolve_paths(config):
    """A copy of `config` with the derived paths filled (report dir, checkpoints, export name) and the image
    folders of `data` made absolute: the report's config.yaml and the export's metadata record where the
    job's evaluation data is, for `tfdml evaluate / export / search` run from any working directory."""
    report_dir = config.report.dir or default_report_dir(config)
    data = config.data
    if data.source == "folder":
        data = data.replace(
            **{
                key: os.path.abspath(getattr(data, key))
                for key in ("path", "eval_path")
                if getattr(data, key) is not None
            }
        )
    ala = config.ala
    if ala.val_path is not None:
        ala = ala.replace(val_path=os.path.abspath(ala.val_path))
    return dataclasses.replace(
        config,
        data=data,
        ala=ala,
        report=config.report.replace(dir=report_dir),
        training=config.training.replace(
            checkpoint_dir=config.training.checkpoint_dir or os.path.join(report_dir, "checkpoints")
        ),
        export=config.export.replace(name=config.export.name or config.name),
    )


# ---- report directory and resume ----------------------------------------------------------------------------


def _changed_keys(old, new):
    return [
        key for key in differences(old, new) if not any(key == s or key.startswith(s + ".") for s in _RESUMABLE_CHANGES)
    ]


def finished_report(report_dir):
    """Whether `report_dir` holds the report of a finished run (its metrics.json, and no unfinished run in
    its checkpoints folder)."""
    return os.path.exists(os.path.join(report_dir, "metrics.json")) and not os.path.exists(
        os.path.join(report_dir, "checkpoints", CONFIG_SNAPSHOT)
    )


def choose_report_dir(config, overwrite=False, say=print):
    """Where this run's report goes: a finished run's report is a result and is kept.

    With `report.dir` set, a folder holding a finished report is refused unless `overwrite`; by default
    (`reports/<name>`) the run goes to the first of `reports/<name>`, `reports/<name>-2`, ... that holds no
    finished report (an unfinished run there is resumed), said in one line."""
    if config.report.dir is not None:
        _recover_report(config.report.dir)
        if finished_report(config.report.dir) and not overwrite:
            raise ConfigError(
                f"report.dir: {config.report.dir} holds the report of a finished run, kept as a result; give "
                "another --report-dir, or add --overwrite to replace it"
            )
        return config.report.dir
    base = candidate = default_report_dir(config)
    number = 1
    while True:
        _recover_report(candidate)
        if overwrite or not finished_report(candidate):
            break
        number += 1
        candidate = f"{base}-{number}"
    if candidate != base:
        say(
            f"{base} holds the report of an earlier run (kept); this run's report goes to {candidate} "
            f"(choose with --report-dir; --overwrite replaces {base})"
        )
    return candidate


def prepare_report_dir(config, restart=False, say=print):
    """Creates the report directory and decides between a fresh start and a resume.

    An unfinished run in `training.checkpoint_dir` resumes only with the configuration it was started
    with (apart from evaluation, export and report settings); otherwise this raises a `ConfigError` naming
    the keys that differ. `restart=True` deletes that run's checkpoints first. Returns the number of epochs
    already done."""

    checkpoints = config.training.checkpoint_dir
    done = completed_epochs(checkpoints)
    if done and restart:
        shutil.rmtree(checkpoints)
        say(
            f"--restart: removed the unfinished run's checkpoints ({done} epoch(s) done) in {checkpoints}; "
            "training from epoch 1"
        )
        done = 0
    if done:
        snapshot = os.path.join(checkpoints, CONFIG_SNAPSHOT)
        if not os.path.exists(snapshot):
            raise ConfigError(
                f"{checkpoints} holds an unfinished run without a record of its configuration; "
                "start afresh with --restart or use another --report-dir"
            )
        with open(snapshot) as f:
            changed = _changed_keys(yaml.safe_load(f), config.to_dict())
        if changed:
            raise ConfigError(
                f"{checkpoints} holds an unfinished run ({done} epoch(s) done) with another configuration "
                f"({', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'}); run it again unchanged "
                "to resume, add --restart to discard it, or use another --report-dir"
            )
        if done >= config.training.epochs:
            say(
                f"training is complete ({done} epoch(s) in {checkpoints}); the run stopped before its report: "
                "writing the report"
            )
        else:
            say(
                f"resuming from epoch {done + 1}/{config.training.epochs} ({done} epoch(s) restored from {checkpoints})"
            )
    else:
        os.makedirs(checkpoints, exist_ok=True)
        with open(os.path.join(checkpoints, CONFIG_SNAPSHOT), "w") as f:
            yaml.safe_dump(config.to_dict(), f, sort_keys=False)
    return done


def _sibling(report_dir, kind):
    """`<parent>/.<name>.<kind>`: hidden beside the report folder, on the same file system."""
    report_dir = os.path.abspath(report_dir)
    return os.path.join(os.path.dirname(report_dir), f".{os.path.basename(report_dir)}.{kind}")


def _recover_report(report_dir):
    """Puts back a report folder that a stop left aside between the renames of `publish_report` (systems
    without an atomic exchange)."""
    previous = _sibling(report_dir, "previous")
    if os.path.isdir(previous) and not os.path.exists(report_dir):
        os.rename(previous, report_dir)


def _staging_dir(report_dir):
    """A fresh folder beside `report_dir` for the report being written; those of stopped runs are removed
    (the caller holds the report folder's lock, so none is being written)."""
    prefix = os.path.basename(_sibling(report_dir, "partial")) + "-"
    parent = os.path.dirname(_sibling(report_dir, "partial"))
    for partial in glob.glob(os.path.join(glob.escape(parent), glob.escape(prefix) + "*")):
        shutil.rmtree(partial, ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=prefix, dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # the report folder's permissions as os.makedirs gives them
    return staging


def _exchange(a, b):
    """Swaps the folders `a` and `b` in one step (Linux `renameat2(RENAME_EXCHANGE)`); False where the
    system cannot."""
    rename = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename is None:
        return False
    at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE
    if rename(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EPERM):  # file system or kernel without it
        return False
    raise OSError(code, os.strerror(code), b)


def publish_report(staging, report_dir, checkpoint_dir):
    """Moves the complete report in `staging` into `report_dir` in one step, then clears the run's
    checkpoints (and what `report_dir` held before): a stop at any point leaves either the unfinished run,
    which a rerun takes to its report, or the complete report."""
    if not os.path.exists(report_dir):
        os.rename(staging, report_dir)
    elif not _exchange(staging, report_dir):
        previous = _sibling(report_dir, "previous")  # _recover_report puts it back after a stop here
        os.rename(report_dir, previous)
        os.rename(staging, report_dir)
        os.rename(previous, staging)
    shutil.rmtree(staging, ignore_errors=True)  # the old folder, with the checkpoints inside by default
    if os.path.exists(checkpoint_dir):
        shutil.rmtree(checkpoint_dir, ignore_errors=True)


# ---- data ---------------------------------------------------------------------------------------------------


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
    return Datasets(train=train, eval=evaluation, pixels=evaluation)


# ---- model --------------------------------------------------------------------------------------------------


def _strategy(choice):
    """The strategy for `training.distribute`: auto picks multi_worker when TF_CONFIG is set, mirrored with
    several GPUs, else none."""

    if choice == "auto":
        if os.environ.get("TF_CONFIG"):
            choice = "multi_worker"
        elif len(tf.config.list_physical_devices("GPU")) > 1:
            choice = "mirrored"
    if choice == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if choice == "mirrored":
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def _is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    return (
        resolver is None
        or resolver.task_type in (None, "chief")
        or (resolver.task_type == "worker" and resolver.task_id == 0)
    )


def build_model(config, input_shape, total_steps):
    """`(trainable model, embedder)`, compiled, in the current strategy scope."""

    try:
        embedder = recipes.make_embedder(config.model, input_shape)
    except PretrainedWeightsError as error:
        raise ConfigError(
            f"model.weights: {error.reason}; offline, train from scratch with --set "
            "model.weights=null, or give the path of the backbone's keras.applications 'notop' "
            "weights file downloaded elsewhere: --set model.weights=/path/to/file.h5"
        ) from None
    optimizer = recipes.make_optimizer(config.optimizer, embedder, total_steps)
    if not config.ala.enabled:
        embedder.compile(
            optimizer=optimizer,
            loss=build_loss(config.loss, config.model.num_classes, total_steps, embedder.embedding_dim),
        )
        return embedder, embedder
    # The look-ahead step of eq (10) reads each variable's rate from the (multi-rate) optimizer, and ALAModel
    # reads the embedding size from the tfdml embedder.
    ala_params = config.ala.params.arguments()
    # With loss.label_noise the assessor weighs the pairs the small-loss heuristic keeps (PRISM is refused).
    base_loss = build_loss(config.loss, config.model.num_classes, total_steps, embedder.embedding_dim)
    model = ALAModel(embedder, base_loss=base_loss, **ala_params)
    model.compile(optimizer=optimizer)
    return model, embedder


# ---- training -----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Training:
    history: dict  # {metric: [value per epoch]} over every epoch, those of resumed runs included
    seconds: float  # training time of every epoch, summed over this process and the runs it resumed
    seconds_this_run: float  # training time of the epochs this process trained
    epochs_this_run: int  # how many epochs this process trained (the last ones)


def train(config, model, datasets, strategy, steps, eval_ds, verbose=1):
    """Fits `model`; returns a `Training` (history and training time over every epoch of the run, the
    epochs of the runs it resumed included, and this process's share)."""

    training, checkpoints = config.training, config.training.checkpoint_dir
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        # Keras 3 fit fails under MultiWorkerMirroredStrategy: tfdml's strategy.run loop trains the same
        # model, checkpoints on the chief and resumes by itself (no Keras callbacks in this mode).

        started, done = time.perf_counter(), callbacks_lib.completed_epochs(checkpoints)
        history = fit_distributed(
            model,
            datasets.train,
            epochs=training.epochs,
            steps_per_epoch=steps,
            checkpoint_dir=checkpoints,
            strategy=strategy,
            verbose=verbose,
        )
        seconds = time.perf_counter() - started  # this process only: the loop keeps no earlier epoch times
        return Training(history, seconds, seconds, training.epochs - done)

    callbacks = []
    if training.eval_every:
        callbacks.append(
            callbacks_lib.RetrievalEvaluation(eval_ds, every_n_epochs=training.eval_every, ks=config.evaluation.ks)
        )
    if training.pretrain_epochs:
        callbacks.append(callbacks_lib.ClassificationPretraining(training.pretrain_epochs))
    # A killed run, started again, resumes at its first unfinished epoch on the batches it would have seen
    # (resume_stream skips what the checkpointed epochs consumed); EpochLog keeps the earlier epochs' logs.
    epoch_log = callbacks_lib.EpochLog(checkpoints)
    callbacks += [
        epoch_log,
        keras.callbacks.BackupAndRestore(checkpoints, delete_checkpoint=False),  # cleared with the report
        keras.callbacks.TensorBoard(os.path.join(config.report.dir, "tensorboard")),
    ]
    train_ds = callbacks_lib.resume_stream(datasets.train, checkpoints, steps)
    model.fit(
        train_ds, epochs=training.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=verbose, shuffle=False
    )  # tfdml.data batches come shuffled
    return Training(
        epoch_log.history(),
        epoch_log.seconds(),
        epoch_log.seconds(this_run=True),
        len(epoch_log.epochs) - epoch_log.resumed_epochs,
    )


# ---- evaluation, export, report -----------------------------------------------------------------------------


def _pixels(dataset):
    images, labels = [], []
    for batch_images, batch_labels in dataset:
        images.append(np.asarray(batch_images))
        labels.append(np.asarray(batch_labels).reshape(-1))
    return np.concatenate(images), np.concatenate(labels)


def _l2_normalise(x):
    x = x.reshape(len(x), -1).astype(np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclasses.dataclass
class Evaluation:
    results: dict  # the model's metrics
    baseline: dict  # raw pixels' metrics
    embeddings: np.ndarray
    labels: np.ndarray
    pixels: np.ndarray  # evaluation images in [0, 1]
    pixel_labels: np.ndarray
    calibration: object = None  # tfdml.retrieval.Calibration of the served `match` decision


def evaluate(config, embedder, datasets):
    """Retrieval metrics of the embedder and of raw pixels on the evaluation images."""

    ks, metrics = config.evaluation.ks, config.evaluation.metrics
    embeddings, labels = retrieval.embed_batches(embedder, datasets.eval)
    results = retrieval.evaluate(embeddings, labels, ks=ks, metrics=metrics, exact=config.evaluation.exact)
    pixels, pixel_labels = _pixels(datasets.pixels)
    pixels = pixels / np.float32(255.0)  # [0, 1] for the grid; the baseline normalises anyway
    baseline = retrieval.evaluate(_l2_normalise(pixels), pixel_labels, ks=ks, metrics=metrics, exact=True)
    # The score threshold of a correct top-1 match at the export's precision, on the held-out items.
    calibration = (
        retrieval.calibrate(
            embeddings, labels, target_precision=config.export.match_precision, mode=config.export.match_mode
        )
        if len(labels) > 1
        else None
    )
    return Evaluation(results, baseline, embeddings, labels, pixels, pixel_labels, calibration)


def export(config, embedder, evaluation, eval_source):
    """Exports the SavedModel with the index of the evaluation items inside its version (and, with it, the
    `search` signature over the same items, `match` calibrated on them), in one atomic step; returns the
    summary entries it adds."""

    settings, size = config.export, config.data.image_size
    # The index stores the evaluation items' ids (item numbers or file paths), labels and class names,
    # embedded by the written SavedModel from the raw images.
    path = export_lib.export_saved_model(
        embedder,
        base_dir=settings.base_dir,
        name=settings.name,
        version=settings.version,
        image_size=(size, size),
        center_crop=data_lib.evaluation_center_crop(config.data.augment),
        training_config=config.to_dict(),
        metrics=evaluation.results,
        overwrite=settings.version is not None,
        gallery=eval_source if settings.index else None,
        index_mode="exact",
        search=settings.search,
        top_k=settings.top_k,
        gallery_dtype=settings.gallery_dtype,
        match_precision=settings.match_precision,
        match_mode=settings.match_mode,
        calibration=evaluation.calibration,
        index_settings={"target_recall": settings.target_recall},
    )
    added = {"export_dir": path}
    if settings.index:
        metadata = export_lib.load_metadata(path)
        added["index_size"] = int(metadata["index"]["size"])
        if "search" in metadata:
            added["search"] = {
                key: metadata["search"][key] for key in ("top_k", "gallery_dtype", "match_threshold", "match_precision")
            }
    return added


def write_report(folder, config, summary, history, evaluation, class_names=None):
    """The report in `folder`: config.yaml, the plots and metrics.json (the one place it is written)."""

    with open(os.path.join(folder, "config.yaml"), "w") as f:
        yaml.safe_dump(config.to_dict(), f, sort_keys=False)
    plots.plot_recall_curve(
        {"tfdml": evaluation.results, "raw pixels": evaluation.baseline}, os.path.join(folder, "recall_at_k.png")
    )
    plots.plot_training_curves(history, os.path.join(folder, "training_curves.png"))
    if evaluation.calibration is not None:
        plots.plot_match_calibration(evaluation.calibration, os.path.join(folder, "match_calibration.png"))
    _retrieval_grid(evaluation, config.report, os.path.join(folder, "retrieval_grid.png"), class_names)
    with open(os.path.join(folder, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)


def write_projector(folder, evaluation, class_names=None):
    """The evaluation embeddings with class names and images for TensorBoard's projector
    (`<folder>/tensorboard`, run `projector`, see `tfdml.projector`)."""

    # The pixels come from their own pass over the evaluation data, in the same order.
    same_items = np.array_equal(evaluation.pixel_labels, evaluation.labels)
    return projector.write_projector(
        os.path.join(folder, "tensorboard"),
        evaluation.embeddings,
        evaluation.labels,
        class_names,
        evaluation.pixels if same_items else None,
    )


def _retrieval_grid(evaluation, report_cfg, path, class_names=None):
    """Nearest neighbours of one query per class (then more), for `plot_retrieval_grid`."""

    labels, images = evaluation.labels, evaluation.pixels
    first_of_class = [int(np.flatnonzero(labels == c)[0]) for c in np.unique(labels)]
    rest = [i for i in range(len(labels)) if i not in set(first_of_class)]
    queries = (first_of_class + rest)[: report_cfg.grid_queries]
    k = report_cfg.grid_neighbours
    neighbours, distances = exact_search(
        evaluation.embeddings[queries], evaluation.embeddings, k=k + 1, distance="squared_l2"
    )
    kept = [
        [(j, d) for j, d in zip(row, drow) if j != q][:k]
        for q, row, drow in zip(queries, np.asarray(neighbours), np.asarray(distances))
    ]
    neighbours = [[j for j, _ in row] for row in kept]

    def name(label):
        if class_names is not None and 0 <= label < len(class_names):
            return plots.drawable_name(str(class_names[label]), label)
        return str(label)

    shown = [labels[i] for i in queries] + [labels[j] for row in neighbours for j in row]
    by_index = class_names is not None and any(name(label) != str(class_names[label]) for label in shown)

    # Scores as the served index reports them: dot products of the unit-norm embeddings (1 - d^2 / 2).
    plots.plot_retrieval_grid(
        [images[q] for q in queries],
        [[images[j] for j in row] for row in neighbours],
        np.array([[labels[j] == labels[q] for j in row] for q, row in zip(queries, neighbours)]),
        path,
        titles=[[f"{name(labels[j])} {1.0 - d / 2.0:.2f}" for j, d in row] for row in kept],
        query_titles=[f"class {name(labels[q])}" for q in queries],
        note="[n]: a class name no installed font can draw, by its index n in the class list" if by_index else None,
    )


# ---- the job ------------------------------------------------------------------------------------------------


class JobError(RuntimeError):
    """A failure after training (e.g. the export cannot be written); the message says what was kept."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the job; the message says where it stopped and how to go on."""


def check_outputs(config):
    """`ConfigError` naming the key for an output folder of the (resolved) job that cannot be written: a
    file in the way or no write permission. Run before anything is trained."""
    outputs = [("report.dir", config.report.dir), ("training.checkpoint_dir", config.training.checkpoint_dir)]
    if config.export.enabled:
        outputs.append(("export.base_dir", os.path.join(config.export.base_dir, config.export.name)))
    for key, path in outputs:
        problem = output_dir_problem(path, writable=True)
        if problem:
            raise ConfigError(f"{key}: {problem}")


def process_seconds():
    """Wall seconds since this process started (interpreter start-up and imports included): from the
    process start time on Linux, else since `tfdml.pipeline` was imported."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = float(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def _interrupted(stage, config):
    epochs, checkpoints = config.training.epochs, config.training.checkpoint_dir
    if stage == "training":
        done = completed_epochs(checkpoints)
        if done:
            return Interrupted(f"interrupted after epoch {done}/{epochs}; run the same command to resume")
        return Interrupted(
            f"interrupted in epoch 1/{epochs}, before its checkpoint: run the same command to start again"
        )
    if stage == "after training":
        return Interrupted(
            f"interrupted after training ({epochs}/{epochs} epochs, kept in {checkpoints}), before the report "
            f"was complete; run the same command to write the report in {config.report.dir}"
        )
    if stage == "reported":
        return Interrupted(f"stopped after the report in {config.report.dir} was complete; nothing was lost")
    return Interrupted("interrupted before training started: run the same command to start")


def _lock(config, say):
    """The report folder's lock (None for the non-chief workers of a multi-worker job, which write no
    report)."""
    task = (json.loads(os.environ.get("TF_CONFIG") or "{}") or {}).get("task") or {}
    if task.get("type") not in (None, "chief") and not (task.get("type") == "worker" and task.get("index") == 0):
        return None
    lock = FolderLock(
        config.report.dir,
        "tfdml train",
        say=say,
        advice="wait for it to finish, stop it (started again, the run resumes), or give another --report-dir",
    )
    return lock.acquire()


def run(config=None, verbose=1, restart=False, say=print, fit_classes_per_batch=False, overwrite=False):
    """Runs the whole job; returns the metrics dict also written to `<report_dir>/metrics.json`.

    `config`: a `Config` (default: the embedded default job); `restart`: discard an unfinished run in the
    report directory instead of resuming it; `say`: where the one-line notices (resuming ...) go;
    `fit_classes_per_batch`: train on all the classes of training data that has fewer than
    `data.classes_per_batch` (see `fit_to_data`); `overwrite`: replace a finished run's report instead of
    keeping it (see `choose_report_dir`).

    Output folders are checked and the report folder locked (`tfdml.locks`; `LockedError` when another
    process writes it) before anything is read or trained. The report is written beside its folder and
    moved into place in one step; the checkpoints are cleared only then, so a run stopped after training
    is taken to its report by the same call again. A stop (Ctrl-C, or SIGTERM under the CLI) raises
    `Interrupted`, whose message says how to go on; a failed export raises `JobError` once the report is
    in place."""
    if not isinstance(config, Config):
        config = Config.from_dict(config) if config is not None else default_config()
    report_dir = choose_report_dir(config, overwrite, say)
    config = resolve_paths(config.replace(report=config.report.replace(dir=report_dir)))
    started = time.perf_counter()
    check_outputs(config)
    lock = _lock(config, say)
    try:
        return _job(config, verbose, restart, say, fit_classes_per_batch, started)
    finally:
        if lock is not None:
            lock.release()


def _job(config, verbose, restart, say, fit_classes_per_batch, started):
    stage = ["before training"]  # where a stop found the job (_run moves it on)
    try:
        keras.utils.set_random_seed(config.seed)
        train_source, eval_source = load_sources(config.data)
        config = fit_to_data(config, train_source, fit_classes_per_batch, say)
        _check_evaluation_data(eval_source)
        _check_unseen_classes(train_source, eval_source)
        prepare_report_dir(config, restart, say)
        outcome = _run(config, verbose, train_source, eval_source, stage)
        if not outcome.summary.get("chief", True):
            return outcome.summary
        summary = _report(config, outcome, started, stage)
    except KeyboardInterrupt:
        raise _interrupted(stage[0], config) from None
    if outcome.export_error is not None:
        raise JobError(
            f"the export to {os.path.join(config.export.base_dir, config.export.name)} failed "
            f"({outcome.export_error}); the report is complete in {config.report.dir}"
        )
    return summary


def _check_weights(config, train_source):
    """ImageNet weights take RGB images: said before the backbone is built, naming the key."""
    channels = getattr(train_source, "channels", 3)
    if config.model.weights == "imagenet" and channels != 3:
        raise ConfigError(
            f"model.weights: ImageNet weights take 3-channel (RGB) images, but the training data "
            f"({train_source.name}) has {channels} channel(s): train from scratch with --set "
            "model.weights=null, or use RGB images"
        )


def _check_unseen_classes(train_source, eval_source):
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


def _check_evaluation_data(eval_source):

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


def _report(config, outcome, started, stage):
    """Writes the report beside its folder, moves it into place in one step and clears the checkpoints;
    returns the summary written to metrics.json."""
    report_dir, checkpoints = config.report.dir, config.training.checkpoint_dir
    staging = _staging_dir(report_dir)
    training_logs = os.path.join(report_dir, "tensorboard")
    if os.path.isdir(training_logs):
        shutil.copytree(training_logs, os.path.join(staging, "tensorboard"))
    outcome.embedder.save(os.path.join(staging, "model.keras"))
    class_names = outcome.eval_source.class_names
    write_projector(staging, outcome.evaluation, class_names)
    summary = dict(outcome.summary)
    summary["job_seconds"] = round(time.perf_counter() - started, 2)  # this call, from configuration to report
    summary["wall_seconds"] = round(process_seconds(), 2)  # this process since it started, imports included
    write_report(staging, config, summary, outcome.history, outcome.evaluation, class_names)
    with interrupts.holding():  # the move and the clearing are not cut in half
        publish_report(staging, report_dir, checkpoints)
        interrupts.complete(f"the report in {report_dir}")
        stage[0] = "reported"
    return summary


@dataclasses.dataclass
class Outcome:
    """What the job's stages produced, for its report."""

    summary: dict
    history: dict = None
    evaluation: Evaluation = None
    embedder: object = None
    eval_source: object = None
    export_error: object = None  # the export failed (the report is written anyway)


def _train_or_restore(config, model, embedder, datasets, strategy, steps, verbose):
    """Trains, or takes the weights of a run that was stopped after training; the trained weights are kept
    in the checkpoints until the report is in place."""
    checkpoints = config.training.checkpoint_dir
    weights = os.path.join(checkpoints, TRAINED_WEIGHTS)
    if os.path.exists(weights):
        embedder.load_weights(weights)
        log = callbacks_lib.EpochLog(checkpoints)
        return Training(log.history(), log.seconds(), 0.0, 0)
    trained = train(config, model, datasets, strategy, steps, datasets.eval, verbose)
    if _is_chief(strategy) and not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        os.makedirs(checkpoints, exist_ok=True)
        partial = weights + ".partial.weights.h5"
        embedder.save_weights(partial)
        os.replace(partial, weights)  # whole or absent
    return trained


def _export_once(config, embedder, evaluation, eval_source):
    """The export, or the one a stopped run of this job wrote before its report; `(added, error)`."""
    record = os.path.join(config.training.checkpoint_dir, EXPORT_RECORD)
    if os.path.exists(record):
        with open(record) as f:
            added = json.load(f)
        if os.path.isdir(added.get("export_dir", "")):
            return added, None
    try:
        added = export(config, embedder, evaluation, eval_source)
    except (OSError, ValueError) as error:
        return {}, error
    with open(record, "w") as f:
        json.dump(added, f)
    return added, None


def _run(config, verbose, train_source, eval_source, stage):
    steps = steps_per_epoch(config, train_source)
    input_shape = (config.data.image_size, config.data.image_size, getattr(train_source, "channels", 3))
    _check_weights(config, train_source)

    strategy = _strategy(config.training.distribute)
    with strategy.scope():
        model, embedder = build_model(config, input_shape, config.training.epochs * steps)
    datasets = make_datasets(config, train_source, eval_source, strategy.num_replicas_in_sync)
    stage[0] = "training"
    trained = _train_or_restore(config, model, embedder, datasets, strategy, steps, verbose)
    stage[0] = "after training"
    summary = {
        "name": config.name,
        "train_seconds": round(trained.seconds, 2),  # every epoch, across resumed runs
        "train_seconds_this_run": round(trained.seconds_this_run, 2),
        "epochs_this_run": int(trained.epochs_this_run),
    }
    if not _is_chief(strategy):
        return Outcome(dict(summary, chief=False))

    evaluation = evaluate(config, embedder, datasets)
    summary.update(
        {
            "report_dir": config.report.dir,
            "paper_target": config.paper_target,
            "model": evaluation.results,
            "raw_pixels": evaluation.baseline,
            "eval_items": int(len(evaluation.labels)),
            "eval_classes": int(len(np.unique(evaluation.labels))),
            "match_calibration": evaluation.calibration.to_dict() if evaluation.calibration else None,
            "steps_per_epoch": int(steps),
            "history": {k: [float(v) for v in vs] for k, vs in trained.history.items()},
        }
    )
    error = None
    if config.export.enabled:
        added, error = _export_once(config, embedder, evaluation, eval_source)
        summary.update(added)
    return Outcome(summary, trained.history, evaluation, embedder, eval_source, error)
