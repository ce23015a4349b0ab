"""Every metric-learning method of tfdml on the glyph data set, with one backbone, one sampler and one budget.

    python -m benchmarks.glyph_methods.benchmark_methods                   # every method x seeds 0-4 (~25 min, 2 cores)
    python -m benchmarks.glyph_methods.benchmark_methods --methods rll_uniform triplet_all --seeds 0 1
    python -m benchmarks.glyph_methods.benchmark_methods --table-only        # rebuild the table and plot from the JSONL
    python -m benchmarks.glyph_methods.benchmark_methods --list              # the methods and whether they can run here

Protocol (the same for every row; `CONFIG` below): `tfdml.data.glyphs` at 32 px, training on the "train"
half of the characters and retrieval on the unseen "test" half (Recall@1 and MAP@R, exact search, every test
image a query); a small CNN (`tfdml.models.small_cnn`, widths 16-32-64-128, global average pool, Dense 64,
L2 normalisation) trained from scratch with Adam for a fixed number of steps on class-balanced C x K
batches. The batches are drawn once per seed as index arrays and every row of that seed trains on exactly
those batches (DML-ALA rows split each batch's classes into its training and validation halves).

The pytorch-metric-learning rows (the bench extra: torch + pytorch-metric-learning) train a torch copy of
the same CNN that starts from the same weights as the tfdml model of that seed (copied layer by layer;
BatchNorm momentum and epsilon and Adam's epsilon set to Keras' values), on the same index batches, for the
same steps; both are evaluated by the same `tfdml.retrieval.evaluate`.

Rows whose loss is not available in this checkout (a class or argument that does not exist yet) are skipped
with a message and leave no line; run them again later with `--methods`. Results are appended, one JSON line
per method and seed, to `<out-dir>/results.jsonl` (default `benchmarks/glyph_methods/`, committed); pairs of
method and seed that already have a line for the current protocol are skipped unless `--rerun` (the latest
line counts). `table.md` (mean and standard deviation over the seeds) and `methods.png` are rebuilt from
every line for the current protocol.
"""

import argparse
import datetime
import functools
import importlib
import json
import os
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIG = {
    "image_size": 32,
    "images_per_class": 20,
    "classes_per_batch": 22,
    "samples_per_class": 3,
    "steps": 300,
    "widths": [16, 32, 64, 128],
    "embedding_dim": 64,
    "learning_rate": 2e-3,
    # The glyph set these rows ran on: 150 training / 151 test characters since look-alike classes were
    # removed (lines without this key ran on the earlier, larger set and no longer enter the table).
    "glyph_classes": [150, 151],
}
OUT_DIR = os.path.join(ROOT, "benchmarks", "glyph_methods")  # committed: rows can be re-run and appended


# ------------------------------------------------------------------------------------------------ data
def load_data(config):
    glyphs = importlib.import_module("tfdml.data.glyphs")
    size = dict(image_size=config["image_size"], images_per_class=config["images_per_class"])
    train_x, train_y, _ = glyphs.glyph_arrays("train", **size)
    test_x, test_y, _ = glyphs.glyph_arrays("test", **size)
    # contiguous training ids for the classifier heads (softmax, Group Loss, proxies)
    _, train_y = np.unique(train_y, return_inverse=True)
    classes = [len(np.unique(train_y)), len(np.unique(test_y))]
    if classes != list(config["glyph_classes"]):
        raise SystemExit(
            f"The glyph set has {classes} training/test classes, the protocol says "
            f"{config['glyph_classes']}: update CONFIG['glyph_classes'] (a new protocol)."
        )
    return {
        "train_x": train_x.astype(np.float32) / 255.0,
        "train_y": train_y.astype(np.int64),
        "test_x": test_x.astype(np.float32) / 255.0,
        "test_y": test_y.astype(np.int64),
        "num_classes": int(train_y.max()) + 1,
    }


def index_batches(labels, classes_per_batch, samples_per_class, steps, seed):
    """`[steps, C * K]` item indices: each row C distinct classes (random), K distinct items of each, class
    after class (the layout of `tfdml.data.class_balanced_dataset`)."""
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in range(int(labels.max()) + 1)]
    rows = np.empty((steps, classes_per_batch * samples_per_class), np.int64)
    for step in range(steps):
        classes = rng.choice(len(by_class), classes_per_batch, replace=False)
        rows[step] = np.concatenate([rng.choice(by_class[c], samples_per_class, replace=False) for c in classes])
    return rows


def validation_batches(labels, batches, val_classes, samples_per_class, seed, batch_labels=None, stream=1):
    """`[steps, val_classes * K]` item indices: per step `val_classes` classes not in that step's batch (by
    `batch_labels`, the labels the sampler sees; default `labels`), K distinct items of each by `labels`
    (-1: an item no class may use), among the classes that have K items (DML-ALA's validation subsets, drawn
    in addition to the batches). `stream` seeds the draw apart from the batches' (each benchmark keeps its own,
    so its recorded runs stay reproducible). Where a batch holds every class (Fashion-MNIST's 3-class validation
    split), the validation classes are drawn among all of them."""
    rng = np.random.default_rng([int(seed), int(stream)])
    batch_labels = labels if batch_labels is None else batch_labels
    by_class = [np.flatnonzero(labels == c) for c in range(int(labels.max()) + 1)]
    present = np.flatnonzero([len(items) >= samples_per_class for items in by_class])
    rows = np.empty((len(batches), val_classes * samples_per_class), np.int64)
    for step, batch in enumerate(batches):
        others = np.setdiff1d(present, batch_labels[batch])
        if len(others) < val_classes:
            others = present
        classes = rng.choice(others, val_classes, replace=False)
        rows[step] = np.concatenate([rng.choice(by_class[c], samples_per_class, replace=False) for c in classes])
    return rows


def episodes(images, labels, batches, val_batches, val_labels=None):
    """DML-ALA episodes `(train_x, train_y, val_x, val_y)` of the index `batches` and `val_batches` into the
    tensors `images` and `labels` (the validation labels from `val_labels` when given: a verified set)."""
    import tensorflow as tf

    val_labels = labels if val_labels is None else val_labels
    return tf.data.Dataset.from_tensor_slices((batches, val_batches)).map(
        lambda idx, val: (
            tf.gather(images, idx),
            tf.gather(labels, idx),
            tf.gather(images, val),
            tf.gather(val_labels, val),
        )
    )


def embed(model, images, batch=512):
    """`model`'s embeddings of `images` (inference mode), `batch` at a time."""
    return np.concatenate(
        [np.asarray(model(images[i : i + batch], training=False)) for i in range(0, len(images), batch)]
    )


def evaluate(embeddings, labels):
    from tfdml import retrieval

    result = retrieval.evaluate(
        np.asarray(embeddings, np.float32), labels, ks=[1], metrics=["recall", "map@r", "r_precision"]
    )
    return {
        "recall@1": float(result["recall@1"]),
        "map@r": float(result["map@r"]),
        "r_precision": float(result["r_precision"]),
    }


# ------------------------------------------------------------------------------------------------ tfdml
def tfdml_embedder(config, num_classes=None, levels=None, seed=0):
    import keras

    from tfdml.models import Embedder, MultiLevelEmbedder

    keras.utils.set_random_seed(seed)
    size = config["image_size"]
    # The arrays are in [0, 1] already (the torch copy takes them too): no pixel preprocessing in the model.
    common = dict(
        embedding_dim=config["embedding_dim"],
        input_shape=(size, size, 1),
        weights=None,
        num_classes=num_classes,
        widths=tuple(config["widths"]),
        preprocessing=None,
    )
    if levels:
        blocks = len(config["widths"])  # the last three blocks are the L, M, H levels
        return MultiLevelEmbedder(
            "small_cnn",
            levels=tuple(levels),
            head_filters=32,
            head_units=128,
            taps={"L": f"block{blocks - 2}_out", "M": f"block{blocks - 1}_out", "H": f"block{blocks}_out"},
            **common,
        )
    return Embedder("small_cnn", **common)


class SoftmaxCrossEntropy:
    """Classification baseline: cross-entropy of the classifier logits (the last `num_classes` columns of a
    tfdml embedder's training output); the embedding is read before the classifier."""

    def __new__(cls, num_classes):
        import keras
        import tensorflow as tf

        class _Loss(keras.losses.Loss):
            def call(self, y_true, y_pred):
                logits = y_pred[:, -num_classes:]
                return tf.nn.sparse_softmax_cross_entropy_with_logits(
                    tf.cast(tf.reshape(y_true, [-1]), tf.int32), logits
                )

        return _Loss(name="softmax_cross_entropy")


def tfdml_loss(name, **params):
    """A tfdml loss built by name (raises AttributeError / TypeError while it does not exist here)."""
    from tfdml import losses

    return getattr(losses, name)(**params)


def transfer_weights(source, target, classifiers=False):
    """Copies a trained tfdml embedder's backbone, and its global head when `target` has one of the same
    shape, into `target` (a warm start); auxiliary heads keep their initialisation, and so do classifier
    heads unless `classifiers` (then those of the same name and shape are copied too: same classes)."""
    target.backbone.set_weights(source.backbone.get_weights())
    layers = list(source.level_heads) + (list(getattr(source, "classifiers", [])) if classifiers else [])
    heads = {head.name: head for head in layers}
    for head in list(target.level_heads) + (list(getattr(target, "classifiers", [])) if classifiers else []):
        if head.name in heads and [w.shape for w in head.get_weights()] == [
            w.shape for w in heads[head.name].get_weights()
        ]:
            head.set_weights(heads[head.name].get_weights())


def train_tfdml(spec, data, batches, config, seed, warm_start=None, keep_classifier=False):
    """Trains `spec` on `batches` of `data["train_x"]` and embeds `data["test_x"]`: `(embeddings, embedder)`.
    `warm_start`: a trained tfdml embedder whose backbone (and global head) the new embedder starts from."""
    import keras
    import tensorflow as tf

    num_classes = data["num_classes"]
    model = tfdml_embedder(
        config, num_classes=num_classes if spec.get("classifier") else None, levels=spec.get("levels"), seed=seed
    )
    if warm_start is not None:
        transfer_weights(warm_start, model, classifiers=keep_classifier)
    images, labels = tf.constant(data["train_x"]), tf.constant(data["train_y"])
    optimizer = keras.optimizers.Adam(config["learning_rate"])
    if "ala" in spec:
        from tfdml.ala_options import episode_sizes
        from tfdml.models import ALAModel

        # DML-ALA's episodes: the training subset is the whole batch the base loss trains on, the validation
        # subset (one class per 5 of the batch's, as many images each) is drawn in addition, labels disjoint.
        k = config["samples_per_class"]
        val_classes = episode_sizes(config["classes_per_batch"], k)["val_size"] // k
        val_batches = validation_batches(data["train_y"], batches, val_classes, k, seed)
        dataset = episodes(images, labels, batches, val_batches)
        trainer = ALAModel(
            model, base_loss=spec["loss"](num_classes), embedding_dim=config["embedding_dim"], **spec["ala"]
        )
        trainer.compile(optimizer=optimizer)
    else:
        dataset = tf.data.Dataset.from_tensor_slices(batches).map(
            lambda idx: (tf.gather(images, idx), tf.gather(labels, idx))
        )
        trainer = model
        trainer.compile(optimizer=optimizer, loss=spec["loss"](num_classes))
    trainer.fit(dataset.prefetch(2), epochs=1, steps_per_epoch=len(batches), verbose=0)
    return embed(model, data["test_x"]), model


# ------------------------------------------------------------------------------------------------ torch
def torch_copy(keras_embedder, config):
    """The tfdml single-level small-CNN embedder as a torch module with the same weights."""
    import torch

    backbone = keras_embedder.backbone if hasattr(keras_embedder, "backbone") else None
    layers, width_in = [], 1
    for i, width in enumerate(config["widths"], start=1):
        conv = torch.nn.Conv2d(width_in, width, 3, padding=1, bias=False)
        bn = torch.nn.BatchNorm2d(width, eps=1e-3, momentum=0.01)  # Keras: epsilon 1e-3, momentum 0.99
        kernel = _keras_layer(keras_embedder, backbone, f"block{i}_conv").get_weights()[0]
        conv.weight.data = torch.from_numpy(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)))
        gamma, beta, mean, var = _keras_layer(keras_embedder, backbone, f"block{i}_bn").get_weights()
        for tensor, value in ((bn.weight, gamma), (bn.bias, beta), (bn.running_mean, mean), (bn.running_var, var)):
            tensor.data = torch.from_numpy(value.copy())
        # Keras MaxPooling2D(2, padding="same") on even sizes = torch MaxPool2d(2); odd sizes pad at the end.
        layers += [conv, bn, torch.nn.ReLU(), torch.nn.MaxPool2d(2, ceil_mode=True)]
        width_in = width
    projection = torch.nn.Linear(width_in, config["embedding_dim"], bias=False)
    head_kernel = [w for w in keras_embedder.level_heads[0].get_weights() if w.ndim == 2][0]
    projection.weight.data = torch.from_numpy(np.ascontiguousarray(head_kernel.T))

    class TorchEmbedder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.features = torch.nn.Sequential(*layers)
            self.projection = projection

        def forward(self, x):  # x: [B, H, W, 1] floats, as the Keras model takes
            x = self.features(x.permute(0, 3, 1, 2)).mean(dim=(2, 3))
            return torch.nn.functional.normalize(self.projection(x), dim=1)

    return TorchEmbedder()


def _keras_layer(model, backbone, name):
    for owner in (backbone, model):
        if owner is None:
            continue
        try:
            return owner.get_layer(name)
        except (ValueError, AttributeError):
            continue
    for layer in model._flatten_layers():
        if layer.name == name:
            return layer
    raise ValueError(f"layer {name} not found in the tfdml embedder")


def train_pml(spec, data, batches, config, seed):
    import torch

    keras_model = tfdml_embedder(config, seed=seed)  # same initial weights as the tfdml rows of this seed
    torch.manual_seed(seed)
    model = torch_copy(keras_model, config)
    # the copy is the same function as the tfdml model before training
    probe = data["train_x"][:16]
    model.eval()
    with torch.no_grad():
        difference = float(
            np.abs(model(torch.from_numpy(probe)).numpy() - np.asarray(keras_model(probe, training=False))).max()
        )
    if difference > 1e-4:
        raise RuntimeError(f"the torch copy differs from the tfdml model by {difference:.2e}")
    loss, miner, loss_optimizer = spec["pml"]()
    optimizer = torch.optim.Adam(model.parameters(), lr=config["learning_rate"], eps=1e-7)
    images, labels = torch.from_numpy(data["train_x"]), torch.from_numpy(data["train_y"])
    model.train()
    for row in batches:
        index = torch.from_numpy(row)
        x, y = images[index], labels[index]
        embeddings = model(x)
        value = loss(embeddings, y, miner(embeddings, y)) if miner is not None else loss(embeddings, y)
        optimizer.zero_grad()
        if loss_optimizer is not None:
            loss_optimizer.zero_grad()
        value.backward()
        optimizer.step()
        if loss_optimizer is not None:
            loss_optimizer.step()
    model.eval()
    with torch.no_grad():
        embeddings = np.concatenate(
            [model(torch.from_numpy(data["test_x"][i : i + 512])).numpy() for i in range(0, len(data["test_x"]), 512)]
        )
    return embeddings, model


def _pml(loss_name, miner=None, beta_optimizer=False, **params):
    def build():
        import torch
        from pytorch_metric_learning import losses, miners

        loss = getattr(losses, loss_name)(**params)
        loss_optimizer = None
        if beta_optimizer:  # tfdml's MarginLoss trains beta with SGD(0.1, momentum 0.9), as the official code
            loss_optimizer = torch.optim.SGD(loss.parameters(), lr=0.1, momentum=0.9)
        return loss, (getattr(miners, miner[0])(**miner[1]) if miner else None), loss_optimizer

    return build


# ------------------------------------------------------------------------------------------------ methods
class LossBuilder:
    """`builder(num_classes)` -> the tfdml loss `name(**params)`; `kind` says which of `num_classes` and
    `embedding_dim` it also takes. `with_params(**changes)` gives a builder of the same loss with other
    parameters (the hyperparameter search of `benchmarks/reality_check/reality_check.py`)."""

    def __init__(self, name, kind="plain", **params):
        self.name, self.kind, self.params = name, kind, params

    def with_params(self, **changes):
        return LossBuilder(self.name, self.kind, **{**self.params, **changes})

    def __call__(self, num_classes):
        params = dict(self.params)
        if self.kind in ("classes", "proxy"):
            params["num_classes"] = num_classes
        if self.kind == "proxy":
            params["embedding_dim"] = CONFIG["embedding_dim"]
            rate = params.pop("proxy_learning_rate", None)
            if rate is not None:  # proxies on their own Adam (Proxy-Anchor's paper: 100x the network's rate)
                params["proxy_optimizer"] = {"class_name": "Adam", "config": {"learning_rate": float(rate)}}
        return tfdml_loss(self.name, **params)


def _loss(name, **params):
    return LossBuilder(name, **params)


def _loss_with_classes(name, **params):
    return LossBuilder(name, "classes", **params)


def _proxy_loss(name, **params):
    return LossBuilder(name, "proxy", **params)


RLL = {"margin": 0.4, "alpha": 1.2, "tn": 10.0}
# ALAModel's own arguments among a searched setting (the rest are the base loss's).
ALA_PARAMS = ("inner_learning_rate", "assessor_learning_rate", "temperature", "weight_floor")

# name -> (label in the table, spec). `loss(num_classes)` builds a tfdml loss; `pml()` a PML loss, miner and
# loss optimiser; `ala` trains an ALAModel with that base loss; `levels` a multi-level embedder.
METHODS = {
    "raw_pixels": ("raw pixels (no training)", {"raw": True}),
    "softmax": ("softmax classification", {"loss": lambda c: SoftmaxCrossEntropy(c), "classifier": True}),
    "contrastive": ("contrastive", {"loss": _loss("ContrastiveLoss", pos_margin=0.0, neg_margin=1.0)}),
    "triplet_all": ("triplet, all", {"loss": _loss("TripletLoss", margin=0.2, mining="all")}),
    "triplet_semihard": ("triplet, semi-hard", {"loss": _loss("TripletSemiHardLoss", margin=0.2)}),
    "triplet_hard": ("triplet, hard", {"loss": _loss("TripletHardLoss", margin=0.2)}),
    "margin_dw": (
        "margin, distance-weighted",
        {"loss": _loss("MarginLoss", alpha=0.2, beta=1.2, sampling="distance_weighted")},
    ),
    "margin_all": ("margin, all triplets", {"loss": _loss("MarginLoss", alpha=0.2, beta=1.2, sampling="all")}),
    "rll_uniform": (
        "RLL, uniform query weighting",
        {"loss": _loss("RankedListLoss", query_weighting="uniform", **RLL)},
    ),
    "rll_official": (
        "RLL, official query weighting",
        {"loss": _loss("RankedListLoss", query_weighting="official", **RLL)},
    ),
    "rll_h": ("RLL-H (default RankedListLoss)", {"loss": _loss("RankedListLoss", **RLL), "levels": ["H"]}),
    "rll_lmh": ("RLL-(L,M,H)", {"loss": _loss("RankedListLoss", **RLL), "levels": ["L", "M", "H"]}),
    "group": ("Group Loss", {"loss": _loss_with_classes("GroupLoss"), "classifier": True}),
    # DML-ALA on a base loss as users compile it (`ala`: ALAModel's arguments); with uniform weights its step is
    # that loss's step on the same batch, so the base loss's own row is the twin.
    "triplet_ala": (
        "triplet, all + ALA (library defaults)",
        {"loss": _loss("TripletLoss", margin=0.2, mining="all"), "ala": {}},
    ),
    "margin_ala": (
        "margin, distance-weighted + ALA (library defaults)",
        {"loss": _loss("MarginLoss", alpha=0.2, beta=1.2, sampling="distance_weighted"), "ala": {}},
    ),
    "contrastive_ala": (
        "contrastive + ALA (library defaults)",
        {"loss": _loss("ContrastiveLoss", pos_margin=0.0, neg_margin=1.0), "ala": {}},
    ),
    # Algorithm 1 literally (sigmoid weights, sums over tuples, embeddings input, SGD 4e-4 assessor).
    "triplet_ala_paper": (
        "triplet + ALA, variant='paper'",
        {"loss": _loss("TripletLoss", margin=0.2, mining="all", squared=True), "ala": {"variant": "paper"}},
    ),
    "multi_similarity": ("MultiSimilarity", {"loss": _loss("MultiSimilarityLoss", alpha=2.0, beta=50.0, base=0.5)}),
    "proxy_anchor": ("ProxyAnchor", {"loss": _proxy_loss("ProxyAnchorLoss", margin=0.1, alpha=32.0)}),
    "normsoftmax": ("NormSoftmax", {"loss": _proxy_loss("NormalizedSoftmaxLoss", temperature=0.05)}),
    "arcface": ("ArcFace", {"loss": _proxy_loss("ArcFaceLoss", margin=28.6, scale=64.0)}),
    "pml_rll": ("PML RankedListLoss", {"pml": _pml("RankedListLoss", margin=0.4, alpha=1.2, Tn=10.0)}),
    "pml_triplet_all": ("PML triplet, all", {"pml": _pml("TripletMarginLoss", margin=0.2)}),
    "pml_triplet_semihard": (
        "PML triplet, semi-hard",
        {
            "pml": _pml(
                "TripletMarginLoss",
                miner=("TripletMarginMiner", {"margin": 0.2, "type_of_triplets": "semihard"}),
                margin=0.2,
            )
        },
    ),
    "pml_triplet_hard": (
        "PML triplet, hard",
        {"pml": _pml("TripletMarginLoss", miner=("BatchHardMiner", {}), margin=0.2)},
    ),
    "pml_margin_dw": (
        "PML margin, distance-weighted",
        {
            "pml": _pml(
                "MarginLoss",
                miner=("DistanceWeightedMiner", {"cutoff": 0.5, "nonzero_loss_cutoff": 1.4}),
                beta_optimizer=True,
                margin=0.2,
                beta=1.2,
                learn_beta=True,
            )
        },
    ),
    "pml_margin_all": (
        "PML margin, all triplets",
        {"pml": _pml("MarginLoss", beta_optimizer=True, margin=0.2, beta=1.2, learn_beta=True)},
    ),
}


def with_params(name, params):
    """`METHODS[name]`'s spec with its loss parameters changed by `params` (for the ALA rows, ALAModel's own,
    `ALA_PARAMS`, go to its arguments, the rest to the base loss)."""
    spec = dict(METHODS[name][1])
    if "ala" in spec:
        spec["ala"] = {**spec["ala"], **{k: v for k, v in params.items() if k in ALA_PARAMS}}
        params = {k: v for k, v in params.items() if k not in ALA_PARAMS}
    if "loss" in spec and isinstance(spec["loss"], LossBuilder):
        spec["loss"] = spec["loss"].with_params(**params)
    elif params:
        raise ValueError(f"{name} has no parameters to change (got {sorted(params)}).")
    return spec


def available(name):
    """`None` when the method can run in this checkout, else why not."""
    spec = METHODS[name][1]
    try:
        if "loss" in spec:
            spec["loss"](4)
        elif "pml" in spec:
            spec["pml"]()
    except (AttributeError, TypeError, ImportError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


# ------------------------------------------------------------------------------------------------ runs
def run_one(name, data, batches, config, seed):
    spec = METHODS[name][1]
    started, cpu = time.time(), time.process_time()
    if spec.get("raw"):
        flat = data["test_x"].reshape(len(data["test_x"]), -1)
        embeddings = flat / np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-12)
        framework = "none"
    elif "pml" in spec:
        embeddings, _ = train_pml(spec, data, batches, config, seed)
        framework = "pytorch-metric-learning"
    else:
        embeddings, _ = train_tfdml(spec, data, batches, config, seed)
        framework = "tfdml"
    seconds, cpu_seconds = time.time() - started, time.process_time() - cpu
    metrics = evaluate(embeddings, data["test_y"])
    return {
        "method": name,
        "label": METHODS[name][0],
        "framework": framework,
        "seed": int(seed),
        **metrics,
        "train_wall_s": round(seconds, 2),
        "train_cpu_s": round(cpu_seconds, 2),
        "config": config,
        **({"ala_design": ala_design()} if is_ala(name) else {}),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def latest_records(path, key, keep=lambda record: True, latest=None):
    """The JSON lines of `path` that `keep` accepts, the latest per `key(record)` (a missing file has none),
    added to `latest` when given: the results files are appended to, so a re-run row replaces the earlier one."""
    latest = {} if latest is None else latest
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    if keep(record):
                        latest[key(record)] = record
    return latest


@functools.cache  # read for every result line; the library defaults do not change within a process
def ala_design():
    """What a DML-ALA result line records of the design it ran: the episode (the whole batch is the training
    subset, the validation subset is drawn in addition) and every library default (`tfdml.ala_options`). A line
    that does not record the current design ran an earlier one (e.g. the batch split into the two subsets) and
    does not count, so a change of the defaults leaves the ALA rows to be run again."""
    from tfdml.ala_options import ALAOptions

    return {"episode": "validation subset drawn in addition to the batch", "defaults": ALAOptions().resolved().saved()}


def is_ala(name):
    spec = METHODS.get(name, ("", {}))[1]
    return "ala" in spec


# DML-ALA options added after the committed ALA lines were run, each with a default that is what those runs did
# (no output penalty, no distance cut, the virtual step on every variable): a line without the key ran it.
ADDED_WITH_THE_EARLIER_BEHAVIOUR = ("output_penalty", "distance_cut", "lookahead_variables")


def counts(record, config):
    """Whether a result line was run under `config` (and, for a DML-ALA row, the current `ala_design()`)."""
    if record.get("config") != config:
        return False
    if not is_ala(record["method"]):
        return True
    design, current = record.get("ala_design") or {}, ala_design()
    defaults = dict(design.get("defaults") or {})
    for key in ADDED_WITH_THE_EARLIER_BEHAVIOUR:
        defaults.setdefault(key, current["defaults"][key])
    return design.get("episode") == current["episode"] and defaults == current["defaults"]


def read_lines(path, config):
    """The result lines of `path` for `config`, the latest per (method, seed)."""
    records = latest_records(path, lambda r: (r["method"], r["seed"]), lambda r: counts(r, config))
    return list(records.values())


def summarise(records):
    """`[(name, label, framework, n, r1 mean, r1 std, map mean, map std, cpu mean)]` in `METHODS` order."""
    rows = []
    for name, (label, _) in METHODS.items():
        mine = [r for r in records if r["method"] == name]
        if not mine:
            continue
        r1 = np.array([r["recall@1"] for r in mine])
        mapr = np.array([r["map@r"] for r in mine])
        rows.append(
            (
                name,
                label,
                mine[0]["framework"],
                len(mine),
                r1.mean(),
                r1.std(),
                mapr.mean(),
                mapr.std(),
                float(np.mean([r["train_cpu_s"] for r in mine])),
            )
        )
    return rows


# ALA rows and the base loss each is compared with (the same batches: ALA's training subsets).
ALA_TWINS = {
    "triplet_ala": "triplet_all",
    "margin_ala": "margin_dw",
    "contrastive_ala": "contrastive",
    "triplet_ala_paper": "triplet_all",
}


def paired_differences(records):
    """`[(ala name, twin name, n, R@1 diff mean, its standard error, MAP@R diff mean, its SE)]`: ALA minus its
    uniform twin, paired by seed (both trained on the same batches), over the seeds both have."""
    by_key = {(r["method"], r["seed"]): r for r in records}
    rows = []
    for ala, twin in ALA_TWINS.items():
        seeds = sorted(seed for method, seed in by_key if method == ala and (twin, seed) in by_key)
        if not seeds:
            continue
        diffs = {
            metric: np.array([by_key[ala, s][metric] - by_key[twin, s][metric] for s in seeds])
            for metric in ("recall@1", "map@r")
        }
        se = {m: float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan") for m, d in diffs.items()}
        rows.append(
            (
                ala,
                twin,
                len(seeds),
                float(diffs["recall@1"].mean()),
                se["recall@1"],
                float(diffs["map@r"].mean()),
                se["map@r"],
            )
        )
    return rows


def markdown_table(rows, config, missing=(), paired=()):
    batch = f"{config['classes_per_batch']} x {config['samples_per_class']}"
    lines = [
        f"Glyphs, {config['image_size']} px, {config['images_per_class']} images per character; zero-shot: "
        f"trained on half of the characters, retrieval on the other half. Every row: small CNN "
        f"{'-'.join(map(str, config['widths']))}, {config['embedding_dim']}-d, Adam "
        f"{config['learning_rate']:g}, {config['steps']} steps of the same {batch} batches per seed. "
        "Mean +- standard deviation over the seeds (n). Train CPU s: process CPU seconds of the training "
        "(TensorFlow on its default threads, torch on one).",
        "",
        "| method | framework | Recall@1 (%) | MAP@R (%) | n | train CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for _name, label, framework, n, r1, r1s, mapr, maprs, cpu in rows:
        lines.append(
            f"| {label} | {framework} | {100 * r1:.1f} +- {100 * r1s:.1f} | "
            f"{100 * mapr:.1f} +- {100 * maprs:.1f} | {n} | {cpu:.1f} |"
        )
    if missing:  # named once below the table, not as rows without figures
        lines += ["", "Not run on this protocol yet: " + "; ".join(METHODS[name][0] for name in missing) + "."]
    if paired:
        lines += [
            "",
            "DML-ALA minus the base loss it wraps, compiled plainly and trained on the same batches (with uniform "
            "weights ALA's step is that loss's step; ALA also reads its validation subsets), paired by seed: mean "
            "difference +- its standard error (n seeds), percentage points.",
            "",
            "| ALA row | base loss | Delta Recall@1 | Delta MAP@R | n |",
            "|---|---|---|---|---|",
        ]
        for ala, twin, n, r1, r1se, mapr, maprse in paired:
            lines.append(
                f"| {METHODS[ala][0]} | {METHODS[twin][0]} | {100 * r1:+.1f} +- {100 * r1se:.1f} | "
                f"{100 * mapr:+.1f} +- {100 * maprse:.1f} | {n} |"
            )
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for _, label, *_ in rows]  # the PML rows' labels say so; their bars are orange
    y = np.arange(len(rows))
    figure, axes = plt.subplots(1, 2, figsize=(12, 0.35 * len(rows) + 1.5), sharey=True)
    for axis, (mean_at, std_at, title) in zip(axes, ((4, 5, "Recall@1"), (6, 7, "MAP@R"))):
        colours = [
            "tab:orange" if row[2] == "pytorch-metric-learning" else "tab:grey" if row[2] == "none" else "tab:blue"
            for row in rows
        ]
        axis.barh(y, [row[mean_at] for row in rows], xerr=[row[std_at] for row in rows], color=colours)
        axis.set_title(f"{title} on unseen glyph classes")
        axis.set_xlim(0, 1)
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y)
    axes[0].set_yticklabels(labels)
    axes[0].invert_yaxis()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--methods", nargs="+", default=["all"], help="method names (see --list) or 'all'")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=CONFIG["steps"], help="training steps per run")
    parser.add_argument("--out-dir", default=OUT_DIR, help="results.jsonl, table.md and methods.png go here")
    parser.add_argument("--table-only", action="store_true", help="only rebuild the table and plot")
    parser.add_argument("--list", action="store_true", help="list the methods and whether they can run")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="TensorFlow CPU threads (0: TensorFlow's default); torch uses this many, or 1 by "
        "default (its OpenMP threads spin when the cores are shared: 10x the CPU time)",
    )
    parser.add_argument(
        "--rerun", action="store_true", help="run (method, seed) pairs that already have a line for this protocol again"
    )
    args = parser.parse_args(argv)
    config = dict(CONFIG, steps=int(args.steps))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.list:
        for name, (label, _) in METHODS.items():
            reason = available(name)
            print(f"{name:22s} {label:36s} {'ok' if reason is None else 'unavailable: ' + reason}")
        return 0
    names = list(METHODS) if args.methods == ["all"] else args.methods
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {list(METHODS)}")
    os.makedirs(args.out_dir, exist_ok=True)
    jsonl = os.path.join(args.out_dir, "results.jsonl")
    if not args.table_only:
        if args.threads:
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        try:
            import torch

            torch.set_num_threads(args.threads or 1)
        except ImportError:
            pass  # no bench extra: the PML rows are reported unavailable
        done = set() if args.rerun else {(r["method"], r["seed"]) for r in read_lines(jsonl, config)}
        runnable = []
        for name in names:
            reason = available(name)
            if reason is None:
                runnable.append(name)
            else:
                print(f"skipping {name}: not available in this checkout ({reason})", flush=True)
        data = load_data(config)
        for seed in args.seeds:
            batches = index_batches(
                data["train_y"], config["classes_per_batch"], config["samples_per_class"], config["steps"], seed
            )
            for name in runnable:
                if (name, seed) in done:
                    continue
                try:
                    record = run_one(name, data, batches, config, seed)
                except Exception:  # one failing row must not stop the others
                    print(f"{name} seed {seed} failed:\n{traceback.format_exc()}", flush=True)
                    continue
                with open(jsonl, "a") as f:
                    f.write(json.dumps(record) + "\n")
                print(
                    f"{name:22s} seed {seed}: R@1 {record['recall@1']:.3f}  MAP@R {record['map@r']:.3f}  "
                    f"({record['train_wall_s']:.1f} s wall, {record['train_cpu_s']:.1f} s CPU)",
                    flush=True,
                )
    records = read_lines(jsonl, config)
    rows = summarise(records)
    done = {row[0] for row in rows}
    table = markdown_table(
        rows, config, missing=[n for n in METHODS if n not in done], paired=paired_differences(records)
    )
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(table)
    if rows:
        plot(rows, os.path.join(args.out_dir, "methods.png"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
