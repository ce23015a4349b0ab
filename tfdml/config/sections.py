"""The sections of a job (`DataConfig`, `ModelConfig`, `LossConfig`, `ALAConfig`, `OptimizerConfig`,
`TrainingConfig`, `EvaluationConfig`, `ExportConfig`, `ReportConfig`) and the whole `Config`: each field's type,
default, range and meaning, and the checks across fields."""

import dataclasses
import difflib
import os
from typing import Any

from tfdml import ala_options
from tfdml.config import nested
from tfdml.config.folders import check_image_folder
from tfdml.config.schema import (
    ConfigError,
    _check_arguments,
    _check_keys,
    _check_value,
    _convert,
    _field,
    _names,
    _Section,
    output_dir_problem,
)
from tfdml.loss_names import LOSSES  # noqa: F401  (loss name -> tfdml.losses class name)
from tfdml.retrieval_options import CALIBRATION_MODES, TARGET_RECALL

# Losses that learn from one image per class (class proxies or a classifier; Group Loss refines a
# classifier's predictions): every other loss needs positive pairs, >= 2 images per class in a batch.
UNPAIRED_LOSSES = ("proxy_anchor", "proxy_nca", "normalized_softmax", "arcface", "cosface", "group")
# DML-ALA's choices (`tfdml.models.ALAModel` arguments), one table shared with the model, without TensorFlow.
ALA_LOSSES = ala_options.BASE_LOSSES
# == tfdml.optimizers.OPTIMIZER_NAMES (tested); written out so that parsing a configuration imports no TensorFlow.
OPTIMIZERS = ("sgd", "adam", "adamw", "lamb", "rmsprop")
# The match calibration's modes, declared without TensorFlow (tfdml.retrieval_options).
MATCH_MODES = CALIBRATION_MODES


def _augment(value, key):
    """`data.augment`: true (the papers' crop + flip), false (plain resize) or a mapping of
    `tfdml.data.Augment` fields -> `True`, `False` or an `Augment`."""
    if isinstance(value, bool):  # before the import: tfdml.data imports TensorFlow
        return value
    from tfdml.data.preprocessing import Augment

    if isinstance(value, Augment):
        return value
    if not isinstance(value, dict):
        raise ConfigError(
            f"{key}: expected true, false or a mapping of {_names(dataclasses.fields(Augment))}, got {value!r}"
        )
    known = {f.name: f for f in dataclasses.fields(Augment)}
    _check_keys(value, known, key)
    fields = {}
    for name, item in value.items():
        where = f"{key}.{name}"
        default = known[name].default
        if isinstance(default, tuple):
            if not (isinstance(item, (list, tuple)) and len(item) == len(default)):
                raise ConfigError(f"{where}: expected a list of {len(default)} numbers, got {item!r}")
            fields[name] = tuple(_convert(v, float, f"{where}[{i}]") for i, v in enumerate(item))
        else:
            fields[name] = _convert(item, bool if isinstance(default, bool) else int | None, where)
    try:
        return Augment(**fields)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


@dataclasses.dataclass
class DataConfig(_Section):
    """Where the images come from and how training batches are drawn (`tfdml.data`)."""

    _KEY = "data"
    # digits: sklearn 8x8 digits 0-4 -> 5-9; glyphs: the embedded 301 characters; tfds: `name`; folder: `path`
    source: str = _field("digits", choices=("digits", "tfds", "folder", "glyphs"))
    name: str | None = None  # tfds builder name (caltech_birds2011, cars196, stanford_online_products)
    path: str | None = None  # image folder, one sub-folder per class
    eval_path: str | None = None  # image folder of the evaluation classes (null: second half of path's)
    data_dir: str | None = None  # tfds data_dir
    manual_dir: str | None = None  # tfds manual_dir (Cars196)
    download: bool = False  # let tfds download and prepare the dataset (needs the network)
    train_split: str = "train"  # tfds split of the training classes
    eval_split: str = "test"  # tfds split of the evaluation (unseen) classes
    image_size: int = _field(224, minimum=1, maximum=4096)  # side of the square images the model takes, in pixels
    classes_per_batch: int = _field(8, minimum=2, maximum=100_000)  # a batch needs negatives
    # K images of each class in a batch (pair losses: >= 2)
    samples_per_class: int = _field(4, minimum=1, maximum=10_000)
    # true: the papers' crop + flip; false: plain resize; a mapping: tfdml.data.Augment fields.
    augment: Any = _field(True, convert=_augment)
    # a class with fewer than samples_per_class images: sampled with replacement, or left out
    small_class_policy: str = _field("replace", choices=("replace", "drop"))
    images_per_class: int | None = _field(None, minimum=1, maximum=10_000)  # generated data sets (glyphs)

    def check(self, key):
        if self.source == "folder":
            if not self.path:
                raise ConfigError(
                    f"{key}.path: data.source=folder needs an image folder with one sub-folder "
                    "per class (tfdml train --image-dir DIR)"
                )
            for name in ("path", "eval_path"):
                if getattr(self, name) is not None:
                    check_image_folder(getattr(self, name), f"{key}.{name}")

    def check_with_library(self, key):
        if self.source == "tfds":
            _check_tfds_name(self.name, f"{key}.name")


def _check_tfds_name(name, key):
    if not name:
        raise ConfigError(
            f"{key}: data.source=tfds needs a tfds builder name, e.g. caltech_birds2011, cars196, "
            "stanford_online_products"
        )
    import tensorflow_datasets as tfds

    if ":" in name:  # a namespaced (community) data set: tfds resolves it when it opens it
        return
    builders = tfds.list_builders(with_community_datasets=False)  # offline: the registered builders
    if name.split("/")[0] not in builders:  # "cars196/2.1.0": builder, then version or config
        close = difflib.get_close_matches(name, builders, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see tfds.list_builders()"
        raise ConfigError(f"{key}: unknown tfds data set {name!r}{hint}")


@dataclasses.dataclass
class ModelConfig(_Section):
    """The embedder (`tfdml.recipes.make_embedder`): backbone, heads and embedding size."""

    _KEY = "model"
    # multilevel: MultiLevelEmbedder (RLL L, M, H heads); single: Embedder (one head on the last feature map)
    type: str = _field("multilevel", choices=("multilevel", "single"))
    backbone: str = "small_cnn"  # a keras.applications name (resnet50, inception_v3, ...) or small_cnn
    weights: str | None = None  # imagenet | null | path to a weights file
    embedding_dim: int | None = _field(512, minimum=1, maximum=65_536)  # null: the pooled backbone feature
    taps: dict[str, str] | None = None  # {L: layer, M: layer, H: layer} for backbones without defaults
    levels: list[str] = _field(factory=lambda: ["L", "M", "H"], choices=("L", "M", "H"))  # heads of a multilevel model
    # one per level; null: every level weighs 1
    level_weights: list[float] | None = _field(None, minimum=0.0, maximum=1e3)
    freeze_batchnorm: bool = False  # backbone BatchNorm in inference mode (RLL on CUB and Cars)
    # the backbone's stem and first N stages left as they are (EfficientNet-Lite: 1-7; small_cnn: blocks)
    frozen_stages: int = _field(0, minimum=0, maximum=1000)
    freeze_backbone: bool = False  # the whole backbone left as it is: only the heads train
    num_classes: int | None = _field(None, minimum=1, maximum=10_000_000)  # classifier head (Group Loss)
    head_filters: int = _field(128, minimum=1, maximum=65_536)  # auxiliary (L, M) heads: 1x1 conv width
    head_units: int = _field(1024, minimum=1, maximum=65_536)  # auxiliary heads: hidden Dense width
    widths: list[int] | None = _field(None, minimum=1, maximum=65_536)  # small_cnn block widths (default 8, 16, 32)

    def check(self, key):
        if not self.levels:
            raise ConfigError(f"{key}.levels: expected a non-empty list drawn from L, M, H, e.g. [H]")
        if self.level_weights is not None and len(self.level_weights) != len(self.levels):
            raise ConfigError(
                f"{key}.level_weights: expected one weight per level ({len(self.levels)}), "
                f"got {len(self.level_weights)}"
            )

    def check_with_library(self, key):
        from tfdml.models import backbones

        names = backbones.backbone_names()
        if backbones.normalise_name(self.backbone) not in {backbones.normalise_name(n) for n in names}:
            close = difflib.get_close_matches(self.backbone.lower(), names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{key}.backbone: unknown backbone {self.backbone!r}{hint}; valid: {', '.join(names)}")
        if backbones.is_small_cnn(self.backbone) and self.weights not in (None, "none"):
            raise ConfigError(f"{key}.weights: the small CNN has no pretrained weights: use null, got {self.weights!r}")
        lite = backbones.is_efficientnet_lite(self.backbone)
        if lite and self.weights not in (None, "none", "imagenet"):
            raise ConfigError(
                f"{key}.weights: {self.backbone} takes imagenet (from its installed package) or null, "
                f"got {self.weights!r}"
            )
        if self.frozen_stages and not (lite or backbones.is_small_cnn(self.backbone)):
            raise ConfigError(
                f"{key}.frozen_stages: the stages of {self.backbone} are not known (EfficientNet-Lite and small_cnn "
                "are); use 0, or freeze_backbone: true"
            )


@dataclasses.dataclass
class TemperatureConfig(_Section):
    """`tfdml.losses.LinearTemperature` as RankedListLoss's `tn` (eq. 15 of the RLL paper)."""

    _KEY = "loss.dynamic_temperature"
    t1: float = _field(20.0, above=0.0, maximum=1e4)  # negative temperature Tn at step 0
    t2: float = _field(5.0, above=0.0, maximum=1e4)  # Tn from max_steps on
    max_steps: int | None = _field(None, minimum=1, maximum=10**12)  # null: the whole run


@dataclasses.dataclass
class MemoryConfig(_Section):
    """`tfdml.losses.CrossBatchMemory` around the loss (Wang et al. 2020)."""

    _KEY = "loss.cross_batch_memory"
    memory_size: int = _field(1024, minimum=1, maximum=10_000_000)  # embeddings the queue holds (>= the batch)
    start_step: int = _field(0, minimum=0, maximum=10**12)  # warm-up: training steps on the batch alone


@dataclasses.dataclass
class LabelNoiseConfig(_Section):
    """Training under label noise (`tfdml.losses.noise`): the loss's terms that mislabelled samples likely
    make weigh 0."""

    _KEY = "loss.label_noise"
    # small_loss: tfdml.losses.SmallLossWeighting (each batch's farthest positive pairs dropped; needs no
    # verified data); prism: tfdml.losses.PRISM (Liu et al. 2021: the samples least likely clean against a
    # memory's class centres dropped)
    method: str = _field("small_loss", choices=("small_loss", "prism"))
    # small_loss: the fraction of each batch's positive pairs dropped; prism: the expected noise rate. Choose it
    # on a validation split of the training classes (at 40 % noise the glyphs benchmark's split chose 0.25 for
    # the contrastive and margin losses, 0.5 for all triplets)
    rate: float = _field(0.25, minimum=0.0, maximum=0.99)
    # prism: embeddings the memory holds (the paper: about the training set; at least a batch)
    memory_size: int | None = _field(None, minimum=1, maximum=10_000_000)
    window_size: int | None = _field(None, minimum=1, maximum=10_000)  # prism: past thresholds averaged (null: 30)

    def check(self, key):
        if self.method == "prism" and self.memory_size is None:
            raise ConfigError(
                f"{key}.memory_size: prism needs the size of its memory of past embeddings (the paper: about "
                "the number of training images; at least a batch)"
            )
        if self.method != "prism":
            for name in ("memory_size", "window_size"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{key}.{name}: applies to method=prism only, not {self.method}")


@dataclasses.dataclass
class LossConfig(_Section):
    """The loss (`tfdml.losses`) and its arguments."""

    _KEY = "loss"
    name: str = _field("ranked_list", choices=tuple(LOSSES))  # tfdml.loss_names.LOSSES: the loss class
    params: dict[str, Any] = _field(factory=dict)  # arguments of the loss class (checked against it)
    dynamic_temperature: TemperatureConfig | None = None  # RLL eq. 15
    # XBM (Wang et al. 2020): tfdml.losses.CrossBatchMemory around the loss
    cross_batch_memory: MemoryConfig | None = None
    # for training labels with errors: the small-loss heuristic or PRISM around the loss.
    label_noise: LabelNoiseConfig | None = None
    # nested (Matryoshka) embeddings: tfdml.losses.NestedLoss applies the loss to these prefixes of the embedding,
    # strictly increasing, e.g. [8, 16, 32, 64] (null: the full embedding only)
    nested_dims: list[int] | None = _field(None, minimum=1, maximum=65_536)
    nested_weights: list[float] | None = _field(None, above=0.0, maximum=1e4)  # one per nested dim (null: 1 each)

    def check(self, key):
        if self.dynamic_temperature is not None and self.name != "ranked_list":
            raise ConfigError(f"{key}.dynamic_temperature: applies to loss.name=ranked_list only, not {self.name}")
        nested.check_section(self, key, UNPAIRED_LOSSES)
        if self.label_noise is not None and self.cross_batch_memory is not None:
            raise ConfigError(
                f"{key}.label_noise: one wrapper around the loss at a time; this job also sets {key}.cross_batch_memory"
            )

    def check_with_library(self, key):
        from tfdml import losses

        _check_arguments(getattr(losses, LOSSES[self.name]), self.params, f"{key}.params", skip=("self", "name"))
        if self.cross_batch_memory is not None and not getattr(losses, LOSSES[self.name]).supports_references:
            usable = sorted(name for name, cls in LOSSES.items() if getattr(losses, cls).supports_references)
            raise ConfigError(
                f"{key}.cross_batch_memory: {self.name} has no pairs to a memory of past "
                f"embeddings; a cross-batch memory works with {', '.join(usable)}"
            )
        noise = self.label_noise
        if noise is not None and noise.method == "small_loss" and getattr(losses, LOSSES[self.name]).tuple_kind is None:
            usable = sorted(name for name, cls in LOSSES.items() if getattr(losses, cls).tuple_kind is not None)
            raise ConfigError(
                f"{key}.label_noise: the small-loss heuristic drops the terms of far positive pairs, and "
                f"{self.name} does not list its terms; it works with {', '.join(usable)} (prism works with any "
                "pair-based loss)"
            )


@dataclasses.dataclass
class ALAParams(_Section, ala_options.ALAOptions):
    """`tfdml.models.ALAModel`'s switches, as `tfdml.ala_options.ALAOptions` declares them (types, defaults,
    ranges); null takes the variant's choice. The base loss is `loss`."""

    _KEY = "ala.params"


@dataclasses.dataclass
class EpisodeConfig(_Section):
    """`tfdml.data.episode_dataset` arguments: per step a training subset, by default the base loss's batch
    (`data.classes_per_batch x data.samples_per_class`), and a validation subset drawn in addition (by default
    one class per 5 training classes, `tfdml.ala_options.episode_sizes`)."""

    _KEY = "ala.episode"
    train_size: int | None = _field(None, minimum=1)  # null: data.classes_per_batch x data.samples_per_class
    val_size: int | None = _field(None, minimum=1)  # null: round(training classes / 5) classes
    samples_per_class: int | None = _field(None, minimum=1)  # null: data.samples_per_class
    train_classes: int | None = _field(None, minimum=1)  # null: train_size // samples_per_class
    val_classes: int | None = _field(None, minimum=1)  # null: val_size // samples_per_class
    disjoint_labels: bool | None = None  # null: the episode_dataset default

    def sizes(self, data):
        """`(train_size, val_size, samples_per_class)`, the unset ones from the data section's batch."""
        k = self.samples_per_class or data.samples_per_class
        default = ala_options.episode_sizes(data.classes_per_batch, k)
        return self.train_size or default["train_size"], self.val_size or default["val_size"], k

    def check_sizes(self, key, data):
        train_size, val_size, k = self.sizes(data)
        for subset, size in (("train", train_size), ("val", val_size)):
            classes = getattr(self, f"{subset}_classes") or max(1, size // k)
            if size % classes:
                raise ConfigError(
                    f"{key}.{subset}_size: {size} images do not split evenly over {classes} "
                    f"classes ({key}.{subset}_classes or {subset}_size // samples_per_class)"
                )

    def arguments(self, data):
        """`episode_dataset` arguments, the sizes completed from `data` (the data section)."""
        train_size, val_size, k = self.sizes(data)
        explicit = {k: v for k, v in self.to_dict().items() if v is not None}
        return {**explicit, "train_size": train_size, "val_size": val_size, "samples_per_class": k}


@dataclasses.dataclass
class ALAConfig(_Section):
    """DML-ALA (`tfdml.models.ALAModel`): a meta-learned assessor weights the tuples of the loss."""

    _KEY = "ala"
    enabled: bool = False  # train with ALAModel on episodes instead of plain batches
    params: ALAParams = _field(factory=ALAParams)
    episode: EpisodeConfig = _field(factory=EpisodeConfig)
    # an image folder (DIR/<class name>/<image files>) whose labels were checked by hand: the validation subsets
    # come from it (tfdml.data.episode_dataset's val_source), not from the training data; under label noise
    # the assessor needs it. null: from the training data
    val_path: str | None = None
    # the loss that scores the look-ahead on the validation subsets (ALAModel's validation_loss; null: the base
    # loss); warm-started, one whose negative pairs are active there (the label-noise benchmark's finding)
    validation_loss: str | None = _field(None, choices=ALA_LOSSES)
    validation_loss_params: dict[str, Any] = _field(factory=dict)  # validation_loss's arguments, as loss.params

    def check(self, key):
        for name in ("val_path", "validation_loss"):
            if getattr(self, name) is not None and not self.enabled:
                raise ConfigError(f"{key}.{name}: applies with {key}.enabled=true only")
        if self.validation_loss_params and self.validation_loss is None:
            raise ConfigError(
                f"{key}.validation_loss_params: sets the arguments of {key}.validation_loss, which is null"
            )
        if self.val_path is not None:
            check_image_folder(self.val_path, f"{key}.val_path")

    def check_with_library(self, key):
        if self.validation_loss is not None:
            from tfdml import losses

            loss_class = getattr(losses, LOSSES[self.validation_loss])
            _check_arguments(
                loss_class, self.validation_loss_params, f"{key}.validation_loss_params", skip=("self", "name")
            )


def _optimizer_name(value, key):
    name = _convert(value, str, key).lower()
    if name == "radam":
        raise ConfigError(
            f"{key}: RAdam is not available in keras.optimizers (Keras 3); use adam (the Group "
            "Loss paper's optimizer) or adamw"
        )
    return name


@dataclasses.dataclass
class OptimizerConfig(_Section):
    """The optimizer and its schedule (`tfdml.recipes.make_optimizer`)."""

    _KEY = "optimizer"
    name: str = _field("sgd", choices=OPTIMIZERS, convert=_optimizer_name)  # a Keras optimizer
    learning_rate: float = _field(1e-2, above=0.0, maximum=100.0)  # the backbone's rate (schedules start from it)
    momentum: float = _field(0.9, minimum=0.0, maximum=1.0)  # SGD and RMSprop
    weight_decay: float = _field(0.0, minimum=0.0, maximum=10.0)  # Keras' decoupled weight decay (0: none)
    head_lr_multiplier: float = _field(1.0, above=0.0, maximum=1e4)  # new layers at this multiple of the backbone rate
    schedule: str | None = _field(None, choices=("cosine", "step", "constant", "none"))  # over the whole run
    # step: fractions of the run or steps
    boundaries: list[float] = _field(factory=lambda: [0.5], above=0.0, maximum=1e9)
    factor: float = _field(0.1, above=0.0, maximum=1e3)  # step schedule: multiplier at each boundary


@dataclasses.dataclass
class TrainingConfig(_Section):
    """How long to train, checkpoints and the distribution strategy."""

    _KEY = "training"
    epochs: int = _field(16, minimum=1, maximum=1_000_000)  # epochs of steps_per_epoch steps
    # null: one pass over the training images
    steps_per_epoch: int | None = _field(None, minimum=1, maximum=100_000_000)
    pretrain_epochs: int = _field(0, minimum=0, maximum=1_000_000)  # Group Loss classification pre-training
    # steps of the new heads alone on backbone features computed once, before the whole network trains
    head_warmup_steps: int = _field(0, minimum=0, maximum=1_000_000)
    checkpoint_dir: str | None = None  # default: <report_dir>/checkpoints
    eval_every: int = _field(0, minimum=0, maximum=1_000_000)  # epochs between retrieval evaluations (0: never)
    # auto: multi_worker when TF_CONFIG is set, mirrored with several GPUs, else none
    distribute: str = _field("auto", choices=("auto", "none", "mirrored", "multi_worker"))

    def check(self, key):
        if self.pretrain_epochs > self.epochs:
            raise ConfigError(
                f"{key}.pretrain_epochs: must be <= training.epochs ({self.epochs}), got {self.pretrain_epochs}"
            )


def _metric_names():
    from tfdml.retrieval.evaluation import METRICS

    return METRICS


@dataclasses.dataclass
class EvaluationConfig(_Section):
    """Retrieval evaluation on the unseen classes (`tfdml.retrieval.evaluate`)."""

    _KEY = "evaluation"
    ks: list[int] = _field(factory=lambda: [1, 2, 4, 8], minimum=1, maximum=100_000)  # the K of Recall@K
    metrics: list[str] = _field(factory=lambda: ["recall", "map@r", "r_precision", "nmi", "f1"])  # retrieval.METRICS
    exact: bool = True  # exact nearest neighbours; false: ScaNN tree + AH + re-ordering
    batch_size: int = _field(256, minimum=1, maximum=65_536)  # images embedded per batch

    def check(self, key):
        if not self.ks:
            raise ConfigError(f"{key}.ks: expected a non-empty list of positive integers, e.g. [1, 2, 4, 8]")

    def check_with_library(self, key):
        allowed = _metric_names()
        for i, name in enumerate(self.metrics):
            _check_value(name, {"choices": allowed}, f"{key}.metrics[{i}]")


@dataclasses.dataclass
class ExportConfig(_Section):
    """The TF Serving SavedModel, its ScaNN index and its `search` signature (`tfdml.export`)."""

    _KEY = "export"
    enabled: bool = True  # write the SavedModel after training
    base_dir: str = "exported_models"  # TF Serving base directory: <base_dir>/<name>/<version>/
    name: str | None = None  # default: the configuration's name
    version: int | None = _field(None, minimum=1, maximum=2**31 - 1)  # default: the next integer version
    index: bool = True  # the evaluation data's ScaNN index inside the version (assets.extra/tfdml_index)
    # The `search` signature (written whenever an index is built): top_k neighbours, the gallery stored as
    # gallery_dtype, `match` at the score threshold of match_precision on the evaluation data.
    search: bool = True  # write the search signature (with index)
    top_k: int = _field(10, minimum=1, maximum=10_000)  # neighbours the search signature returns
    gallery_dtype: str = _field("float32", choices=("float32", "bfloat16", "int8"))  # how the gallery is stored
    match_precision: float = _field(0.9, above=0.0, maximum=1.0)  # target precision of top-1 matches (<= 1)
    # How match_precision is calibrated: open (leave-one-class-out: it holds for queries of classes absent from
    # the gallery too), closed (leave-one-out: queries of the gallery's classes only) or auto (open from 4 classes).
    match_mode: str = _field("auto", choices=MATCH_MODES)
    # An approximate ScaNN index (galleries from 20,000 items; tfdml train's own index is exact): the
    # recall@10 against exact search its settings are raised to reach (null: automatic settings, unmeasured).
    target_recall: float | None = _field(TARGET_RECALL, above=0.0, maximum=1.0)
    # Nested embeddings (loss.nested_dims): the index on this prefix, its shortlist re-ranked with the full vector
    # (tfdml.export.PrefixIndex), in the search signature too; null: the full vector.
    search_dims: int | None = _field(None, minimum=1, maximum=65_536)


@dataclasses.dataclass
class ReportConfig(_Section):
    """The report folder: metrics.json, plots, model.keras, config.yaml, TensorBoard logs."""

    _KEY = "report"
    dir: str | None = None  # default: reports/<name>
    grid_queries: int = _field(8, minimum=1, maximum=64)  # queries (rows) of retrieval_grid.png
    grid_neighbours: int = _field(5, minimum=1, maximum=32)  # neighbours shown per query
    worst_queries: int = _field(12, minimum=1, maximum=64)  # queries of worst_queries.html (and .png)
    # Worst first by the rank of the nearest correct item (rank) or by average precision (ap).
    worst_order: str = _field("rank", choices=("rank", "ap"))


@dataclasses.dataclass
class Config(_Section):
    """A whole job. Sections are typed; `Config.from_dict` validates, `to_dict` gives plain data back."""

    _KEY = ""
    name: str = "job"  # names the report folder (reports/<name>) and the export
    description: str | None = None  # free text, kept in the report and the export's metadata
    paper_target: str | None = None  # the paper table row a configuration reproduces (free text)
    # weights, batches and augmentation: the same seed, the same run
    seed: int = _field(0, minimum=0, maximum=2**32 - 1)
    data: DataConfig = _field(factory=DataConfig)
    model: ModelConfig = _field(factory=ModelConfig)
    loss: LossConfig = _field(factory=LossConfig)
    ala: ALAConfig = _field(factory=ALAConfig)
    optimizer: OptimizerConfig = _field(factory=OptimizerConfig)
    training: TrainingConfig = _field(factory=TrainingConfig)
    evaluation: EvaluationConfig = _field(factory=EvaluationConfig)
    export: ExportConfig = _field(factory=ExportConfig)
    report: ReportConfig = _field(factory=ReportConfig)

    def check(self, key):
        if self.loss.name == "group" and self.model.num_classes is None and "num_classes" not in self.loss.params:
            raise ConfigError(
                "model.num_classes: the group loss needs the classifier head size (the number of training classes)"
            )
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"name: expected a job name usable as a folder name, got {self.name!r}")
        self._check_pairs()
        self.ala.episode.check_sizes("ala.episode", self.data)
        # Output folders: a file in the way is found now, not after training.
        outputs = [
            ("report.dir", self.report.dir or default_report_dir(self)),
            ("training.checkpoint_dir", self.training.checkpoint_dir),
        ]
        if self.export.enabled:
            outputs.append(("export.base_dir", os.path.join(self.export.base_dir, self.export.name or self.name)))
        for where, path in outputs:
            problem = path and output_dir_problem(path)
            if problem:
                raise ConfigError(f"{where}: {problem}")
        if self.ala.enabled and self.loss.name not in ALA_LOSSES:
            raise ConfigError(
                f"loss.name: DML-ALA (ala.enabled) weights {', '.join(ALA_LOSSES)} tuples, not {self.loss.name}"
            )
        if self.training.head_warmup_steps and self.model.num_classes:
            raise ConfigError(
                "training.head_warmup_steps: the warm-up trains embedding heads on backbone features; a model "
                "with a classifier head (model.num_classes) pre-trains with training.pretrain_epochs instead"
            )
        if self.loss.cross_batch_memory is not None:
            self._check_memory(self.loss.cross_batch_memory)
        if self.loss.nested_dims is not None:
            nested.check_job(self)
        if self.export.search_dims is not None:
            nested.check_search_dims(self)
        if self.loss.label_noise is not None and self.loss.label_noise.method == "prism":
            self._check_prism(self.loss.label_noise)

    def _check_prism(self, prism):
        key = "loss.label_noise"
        if self.ala.enabled:
            raise ConfigError(
                f"{key}.method: DML-ALA (ala.enabled) weighs the terms of the loss, which prism does not list; use "
                "method=small_loss (DML-ALA then weighs the pairs the heuristic keeps)"
            )
        if self.loss.name in UNPAIRED_LOSSES:
            raise ConfigError(f"{key}.method: prism selects the samples of pair-based losses, not {self.loss.name}")
        self._check_stored_embeddings(key, "prism's memory", prism.memory_size)

    def _check_memory(self, memory):
        key = "loss.cross_batch_memory"
        if self.ala.enabled:
            raise ConfigError(f"{key}: DML-ALA (ala.enabled) trains on its own episodes, without a memory")
        self._check_stored_embeddings(key, "the memory", memory.memory_size)

    def _check_stored_embeddings(self, key, memory, memory_size):
        """A memory of past embeddings (XBM's queue, PRISM's) holds one per image, and at least a batch."""
        if self.model.type == "multilevel" and len(self.model.levels) > 1:
            raise ConfigError(
                f"{key}: {memory} holds one embedding per image; model.levels "
                f"{self.model.levels} gives {len(self.model.levels)} (use model.levels=[H] or "
                "model.type=single)"
            )
        batch = self.data.classes_per_batch * self.data.samples_per_class
        if memory_size < batch:
            raise ConfigError(
                f"{key}.memory_size: {memory_size} is less than a batch "
                f"(data.classes_per_batch x data.samples_per_class = {batch})"
            )

    def _check_pairs(self):
        """Pair-based losses need a positive pair in every batch: at least 2 images per class."""
        if self.loss.name in UNPAIRED_LOSSES:
            return
        key, value = (
            ("ala.episode.samples_per_class", self.ala.episode.sizes(self.data)[2])
            if self.ala.enabled and self.ala.episode.samples_per_class is not None
            else ("data.samples_per_class", self.data.samples_per_class)
        )
        if value < 2:
            raise ConfigError(
                f"{key}: {self.loss.name} compares images of one class, so a batch needs at least "
                f"2 per class (with {value} there is no positive pair and nothing to learn), got "
                f"{value}"
            )

    def check_with_library(self, key):
        if self.ala.enabled:
            from tfdml.models.ala.model import resolve_base_loss, resolve_validation_loss

            try:
                base_loss = resolve_base_loss(self.loss.name, self.loss.params or None)
            except ValueError as error:
                raise ConfigError(f"loss.params: {error}") from None
            try:
                resolve_validation_loss(self.ala.validation_loss, self.ala.validation_loss_params or None, base_loss)
            except ValueError as error:
                raise ConfigError(f"ala.validation_loss_params: {error}") from None


def default_report_dir(config):
    """`reports/<name>`: where a job's report goes unless `report.dir` says otherwise (or a finished report
    is there already: see `tfdml.pipeline.choose_report_dir`)."""
    return os.path.join("reports", config.name)
