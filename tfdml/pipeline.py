"""The main job: train an embedder from a configuration, evaluate it, export it, and write a report.

`run(config)` is what `tfdml train` runs. With the defaults of `tfdml.config` it trains a multi-level
small-CNN embedder with Ranked List Loss on class-balanced batches of digits 0-4, evaluates retrieval on the
unseen digits 5-9 (exact ScaNN search) beside a raw-pixel baseline, exports a TF Serving SavedModel plus
its ScaNN gallery index, and writes a report folder:

    <report_dir>/metrics.json          metrics of the model and of the raw-pixel baseline, timings
    <report_dir>/config.yaml           the resolved configuration
    <report_dir>/recall_at_k.png       Recall@K curves (model vs raw pixels)
    <report_dir>/training_curves.png   loss (and per-level losses) per epoch
    <report_dir>/retrieval_grid.png    query images and their nearest neighbours
    <report_dir>/tensorboard/          TensorBoard logs
    <report_dir>/checkpoints/          BackupAndRestore state: a killed run resumes where it stopped
"""

import copy
import dataclasses
import json
import logging
import os
import time

import numpy as np
import yaml

from tfdml.config import DEFAULTS

logger = logging.getLogger("tfdml.pipeline")

LOSSES = {
    "ranked_list": "RankedListLoss",
    "triplet": "TripletLoss",
    "triplet_semihard": "TripletSemiHardLoss",
    "triplet_hard": "TripletHardLoss",
    "margin": "MarginLoss",
    "contrastive": "ContrastiveLoss",
    "group": "GroupLoss",
}


def _sources(data):
    """`(train source, evaluation source)` from the data section."""
    from tfdml import data as data_lib

    kind = data["source"]
    if kind == "digits":
        return data_lib.digits("train"), data_lib.digits("test")
    if kind == "glyphs":
        size = int(data["image_size"])  # rendered at the training size: no upscaling blur
        return data_lib.glyphs("train", image_size=size), data_lib.glyphs("test", image_size=size)
    if kind == "tfds":
        if not data["name"]:
            raise ValueError("data.source=tfds needs data.name (caltech_birds2011, cars196, "
                             "stanford_online_products, ...)")
        common = dict(data_dir=data["data_dir"], manual_dir=data["manual_dir"], download=data["download"])
        return (data_lib.tfds_source(data["name"], data["train_split"], **common),
                data_lib.tfds_source(data["name"], data["eval_split"], **common))
    if kind == "folder":
        if not data["path"] or not data["eval_path"]:
            raise ValueError("data.source=folder needs data.path (training classes) and data.eval_path "
                             "(evaluation classes), each with one sub-folder per class")
        return data_lib.image_folder(data["path"]), data_lib.image_folder(data["eval_path"])
    raise ValueError(f"unknown data.source {kind!r}; use digits, glyphs, tfds or folder")


def build_loss(section, num_classes=None, total_steps=None):
    """A tfdml loss from the loss section (`name`, `params`, optional `dynamic_temperature`)."""
    from tfdml import losses

    name = section["name"]
    if name not in LOSSES:
        raise ValueError(f"unknown loss.name {name!r}; choose from {sorted(LOSSES)}")
    params = dict(section.get("params") or {})
    schedule = section.get("dynamic_temperature")
    if schedule:
        if name != "ranked_list":
            raise ValueError("loss.dynamic_temperature applies to the ranked_list loss only")
        params["tn"] = losses.LinearTemperature(
            float(schedule["t1"]), float(schedule["t2"]), int(schedule.get("max_steps") or total_steps))
    if name == "group":
        params.setdefault("num_classes", num_classes)
        if params["num_classes"] is None:
            raise ValueError("the group loss needs model.num_classes (the classifier head size)")
    return getattr(losses, LOSSES[name])(**params)


def augment_setting(augment):
    """`data.augment` -> what `tfdml.data` takes: `True`/`False` as they are, a mapping of `tfdml.data.Augment`
    fields (`{flip: false, scale: [0.7, 1.0]}`; unset fields keep their defaults) -> an `Augment`."""
    from tfdml import data as data_lib

    if not isinstance(augment, dict):
        return augment
    fields = {f.name for f in dataclasses.fields(data_lib.Augment)}
    unknown = sorted(set(augment) - fields)
    if unknown:
        raise ValueError(f"data.augment has unknown keys {unknown}; valid keys: {sorted(fields)}")
    return data_lib.Augment(**{k: tuple(v) if isinstance(v, list) else v for k, v in augment.items()})


def _input_shape(config, source):
    size = config["data"]["image_size"]
    channels = getattr(source, "channels", 3)
    return (int(size), int(size), int(channels))


def _pixels(dataset):
    images, labels = [], []
    for batch_images, batch_labels in dataset:
        images.append(np.asarray(batch_images))
        labels.append(np.asarray(batch_labels).reshape(-1))
    return np.concatenate(images), np.concatenate(labels)


def _l2_normalise(x):
    x = x.reshape(len(x), -1).astype(np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def resolve_paths(config):
    """Fills the derived paths (report dir, checkpoints, export name) in place and returns the config."""
    report = config["report"]
    report["dir"] = report["dir"] or os.path.join("reports", config["name"])
    training = config["training"]
    training["checkpoint_dir"] = training["checkpoint_dir"] or os.path.join(report["dir"], "checkpoints")
    config["export"]["name"] = config["export"]["name"] or config["name"]
    return config


def _strategy(choice):
    """The strategy for `training.distribute`: auto picks multi_worker when TF_CONFIG is set, mirrored with
    several GPUs, else none."""
    import tensorflow as tf

    if choice not in ("auto", "none", "mirrored", "multi_worker"):
        raise ValueError(f"training.distribute must be auto, none, mirrored or multi_worker, got {choice!r}")
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
    return resolver is None or resolver.task_type in (None, "chief") or (
        resolver.task_type == "worker" and resolver.task_id == 0)


def run(config=None, verbose=1):
    """Runs the whole job; returns the metrics dict also written to `<report_dir>/metrics.json`."""
    import keras
    import tensorflow as tf

    from tfdml import callbacks as callbacks_lib
    from tfdml import data as data_lib
    from tfdml import export as export_lib
    from tfdml import plots, recipes, retrieval
    from tfdml.models import ALAModel

    config = resolve_paths(copy.deepcopy(config or DEFAULTS))
    started = time.time()
    keras.utils.set_random_seed(int(config["seed"]))
    data_cfg, model_cfg, train_cfg = config["data"], config["model"], config["training"]
    report_dir = config["report"]["dir"]
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, "config.yaml"), "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)

    train_source, eval_source = _sources(data_cfg)
    num_classes, top_label = model_cfg["num_classes"], int(np.max(train_source.labels, initial=-1))
    if num_classes is not None and top_label >= int(num_classes):
        raise ValueError(f"model.num_classes={num_classes} but the training labels go up to "
                         f"{top_label}: the classifier head needs every class id below it")
    input_shape = _input_shape(config, train_source)
    epochs, steps = int(train_cfg["epochs"]), int(train_cfg["steps_per_epoch"])
    total_steps = epochs * steps

    strategy = _strategy(train_cfg["distribute"])
    with strategy.scope():
        embedder = recipes.make_embedder(
            {k: v for k, v in model_cfg.items() if v is not None or k in ("weights", "taps")}, input_shape)
        # One preprocessing spec serves the input pipeline here and the exported serving graph.
        preprocess_name = embedder.preprocessing
        preprocess = export_lib.resolve_preprocessing(preprocess_name)[0]
        optimizer = recipes.make_optimizer(config["optimizer"], embedder, total_steps)
        if config["ala"]["enabled"]:
            ala_params = dict(config["ala"]["params"])
            ala_params.setdefault("embedding_dim", embedder.output_dim)  # the embedder is not built yet
            if float(config["optimizer"]["head_lr_multiplier"]) != 1.0:
                # A multi-rate optimizer has no single learning rate for the look-ahead step of eq (10):
                # it takes the backbone rate.
                ala_params.setdefault("inner_learning_rate", float(config["optimizer"]["learning_rate"]))
            model = ALAModel(embedder, base_loss=config["loss"]["name"],
                             loss_params=config["loss"]["params"] or None, seed=int(config["seed"]),
                             **ala_params)
            model.compile(optimizer=optimizer)
        else:
            model = embedder
            model.compile(optimizer=optimizer,
                          loss=build_loss(config["loss"], model_cfg["num_classes"], total_steps))

    common = dict(image_size=data_cfg["image_size"], augment=augment_setting(data_cfg["augment"]),
                  preprocess=preprocess,
                  seed=int(config["seed"]), drop_small_classes=data_cfg["small_class_policy"] == "drop")
    if config["ala"]["enabled"]:
        train_ds = data_lib.episode_dataset(train_source, **common, **{
            k: v for k, v in config["ala"]["episode"].items()})
    else:
        train_ds = data_lib.class_balanced_dataset(
            train_source, int(data_cfg["classes_per_batch"]), int(data_cfg["samples_per_class"]),
            num_replicas=strategy.num_replicas_in_sync if strategy.num_replicas_in_sync > 1 else None,
            **common)
    eval_batch = int(config["evaluation"]["batch_size"])
    # Evaluation images are prepared as training ones: the papers' centre crop when training crops, a plain
    # resize when it does not (augment: false), so that the model sees whole images in both.
    center_crop = common["augment"] not in (None, False)
    eval_ds = data_lib.eval_dataset(eval_source, eval_batch, image_size=data_cfg["image_size"],
                                    center_crop=center_crop, preprocess=preprocess)
    # The same images as pixels in [0, 1]: the raw-pixel baseline, the index gallery and the report grid.
    pixel_ds = data_lib.eval_dataset(eval_source, eval_batch, image_size=data_cfg["image_size"],
                                     center_crop=center_crop)

    # A killed run, started again, resumes at its first unfinished epoch on the batches it would have seen
    # (resume_stream below skips what the checkpointed epochs consumed).
    callbacks = [keras.callbacks.BackupAndRestore(train_cfg["checkpoint_dir"])]
    if train_cfg["eval_every"]:
        callbacks.append(callbacks_lib.RetrievalEvaluation(
            eval_ds, every_n_epochs=int(train_cfg["eval_every"]), ks=config["evaluation"]["ks"]))
    if train_cfg["pretrain_epochs"]:
        callbacks.append(callbacks_lib.ClassificationPretraining(int(train_cfg["pretrain_epochs"])))
    callbacks.append(keras.callbacks.TensorBoard(os.path.join(report_dir, "tensorboard")))

    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if multi_worker:
        # Keras 3 fit fails under MultiWorkerMirroredStrategy: tfdml's strategy.run loop trains the same
        # model, checkpoints on the chief and resumes by itself (no Keras callbacks in this mode).
        from tfdml.training import fit_distributed

        history_dict = fit_distributed(model, train_ds, epochs=epochs, steps_per_epoch=steps,
                                       checkpoint_dir=train_cfg["checkpoint_dir"], strategy=strategy,
                                       verbose=verbose)
    else:
        train_ds = callbacks_lib.resume_stream(train_ds, train_cfg["checkpoint_dir"], steps)
        history_dict = model.fit(train_ds, epochs=epochs, steps_per_epoch=steps, callbacks=callbacks,
                                 verbose=verbose, shuffle=False).history  # tfdml.data batches come shuffled
    train_seconds = time.time() - started
    if not _is_chief(strategy):
        return {"name": config["name"], "chief": False, "train_seconds": round(train_seconds, 2)}

    ks = [int(k) for k in config["evaluation"]["ks"]]
    metrics = list(config["evaluation"]["metrics"])
    embeddings, labels = retrieval.embed_batches(embedder, eval_ds)
    results = retrieval.evaluate(embeddings, labels, ks=ks, metrics=metrics,
                                 exact=bool(config["evaluation"]["exact"]))
    pixels, pixel_labels = _pixels(pixel_ds)
    baseline = retrieval.evaluate(_l2_normalise(pixels), pixel_labels, ks=ks, metrics=metrics, exact=True)

    embedder.save(os.path.join(report_dir, "model.keras"))
    summary = {
        "name": config["name"],
        "report_dir": report_dir,
        "paper_target": config["paper_target"],
        "model": results,
        "raw_pixels": baseline,
        "eval_items": int(len(labels)),
        "eval_classes": int(len(np.unique(labels))),
        "train_seconds": round(train_seconds, 2),
        "history": {k: [float(v) for v in vs] for k, vs in history_dict.items()},
    }

    if config["export"]["enabled"]:
        export_cfg = config["export"]
        path = export_lib.export_saved_model(
            embedder, base_dir=export_cfg["base_dir"], name=export_cfg["name"], version=export_cfg["version"],
            image_size=(data_cfg["image_size"], data_cfg["image_size"]),
            preprocess=preprocess_name,
            training_config=config, metrics=results, overwrite=export_cfg["version"] is not None)
        summary["export_dir"] = path
        if export_cfg["index"]:
            gallery = np.clip(np.round(pixels * 255.0), 0, 255).astype(np.uint8)
            index = export_lib.export_index(gallery, base_dir=export_cfg["base_dir"], name=export_cfg["name"],
                                            labels=pixel_labels, mode="exact")
            summary["index_size"] = int(index.size) if hasattr(index, "size") else int(len(pixel_labels))

    plots.plot_recall_curve({"tfdml": results, "raw pixels": baseline},
                            os.path.join(report_dir, "recall_at_k.png"))
    plots.plot_training_curves(history_dict, os.path.join(report_dir, "training_curves.png"))
    _retrieval_grid(embeddings, labels, pixels, config["report"], os.path.join(report_dir, "retrieval_grid.png"))
    summary["wall_seconds"] = round(time.time() - started, 2)
    with open(os.path.join(report_dir, "metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _retrieval_grid(embeddings, labels, images, report_cfg, path):
    """Nearest neighbours of one query per class (then more), for `plot_retrieval_grid`."""
    from tfdml import plots
    from tfdml.ops.neighbours import exact_search

    num_queries, k = int(report_cfg["grid_queries"]), int(report_cfg["grid_neighbours"])
    first_of_class = [int(np.flatnonzero(labels == c)[0]) for c in np.unique(labels)]
    rest = [i for i in range(len(labels)) if i not in set(first_of_class)]
    queries = (first_of_class + rest)[:num_queries]
    neighbours, _ = exact_search(embeddings[queries], embeddings, k=k + 1, distance="squared_l2")
    neighbours = [[j for j in row if j != q][:k] for q, row in zip(queries, np.asarray(neighbours))]
    plots.plot_retrieval_grid(
        [images[q] for q in queries], [[images[j] for j in row] for row in neighbours],
        np.array([[labels[j] == labels[q] for j in row] for q, row in zip(queries, neighbours)]), path)
