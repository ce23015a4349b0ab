"""Training configuration: typed, validated once, at the edge.

A job is a `Config` of typed sections (`DataConfig`, `ModelConfig`, `LossConfig`, `ALAConfig`,
`OptimizerConfig`, `TrainingConfig`, `EvaluationConfig`, `ExportConfig`, `ReportConfig`). `load_config` builds
one from the embedded default job (`DEFAULT_JOB`: a small-CNN embedder trained with Ranked List Loss on half
of the font-rendered characters of `tfdml.data.glyphs`, evaluated on the unseen half), a YAML file under
`configs/` that overrides any subset of it, and command-line overrides (`--set optimizer.learning_rate=0.01`)
that override the file.

Every value is checked before anything is built, in two passes: first keys, types, ranges, choices and
paths (no TensorFlow import, so that `tfdml train --set training.epoch=2` answers at once), then what only
the library can tell (`check_with_library`: the loss class's arguments, backbone and metric names, tfds
builders), which imports TensorFlow. unknown keys (also inside `loss.params`, checked against
the loss class's constructor), wrong types, out-of-range numbers and unknown names raise a `ConfigError`
whose message is one line that names the key and what is allowed, e.g.
`optimizer.learning_rate: expected a number, got 'abc'`. `Config.to_dict()` is plain YAML/JSON data and
`Config.from_dict(config.to_dict()) == config`.
"""

import copy
import dataclasses
import difflib
import inspect
import os
import types
import typing
from typing import Any

import yaml

from tfdml import ala_options
from tfdml.loss_names import LOSSES  # noqa: F401  (loss name -> tfdml.losses class name)

# `Optional[X]` and `X | None` annotations: both mean "X or null" to the validator.
_UNIONS = (typing.Union, types.UnionType)


class ConfigError(ValueError):
    """A configuration value that does not fit the schema; the message is one line naming the key."""


# Losses that learn from one image per class (class proxies or a classifier; Group Loss refines a
# classifier's predictions): every other loss needs positive pairs, >= 2 images per class in a batch.
UNPAIRED_LOSSES = ("proxy_anchor", "proxy_nca", "normalized_softmax", "arcface", "cosface", "group")
# DML-ALA's choices (`tfdml.models.ALAModel` arguments), one table shared with the model, without TensorFlow.
ALA_LOSSES = ala_options.BASE_LOSSES
# == tfdml.optimizers.OPTIMIZER_NAMES (tested); written out so that parsing a configuration imports no TensorFlow.
OPTIMIZERS = ("sgd", "adam", "adamw", "lamb", "rmsprop")


def _field(default=None, *, factory=None, choices=None, minimum=None, above=None, convert=None):
    """A dataclass field with its validation rules: `choices` (allowed values), `minimum` (>=), `above`
    (>), `convert(value, key)` (a custom parser)."""
    metadata = {"choices": choices, "minimum": minimum, "above": above, "convert": convert}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


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


def _names(items):
    return ", ".join(sorted(getattr(i, "name", i) for i in items))


def _check_keys(mapping, known, key):
    for name in mapping:
        if name not in known:
            close = difflib.get_close_matches(str(name), list(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            where = f"{key}.{name}" if key else str(name)
            raise ConfigError(f"unknown configuration key '{where}'{hint}; valid keys here: {_names(known)}")


def _type_name(tp):
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if tp in names:
        return names[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        return " or ".join([_type_name(a) for a in args if a is not type(None)] + ["null"])
    if origin is list:
        return f"a list of {_type_name(args[0]).replace('an ', '').replace('a ', '')}s"
    return "a mapping"


def _convert(value, tp, key):
    """`value` as type `tp` (int, float, bool, str, Optional/List/Dict of these, a dataclass) or a
    `ConfigError` naming `key`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        if value is None:
            return None
        return _convert(value, next(a for a in args if a is not type(None)), key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    ok = None
    if tp is bool:
        ok = value if isinstance(value, bool) else None
    elif tp is int:
        ok = value if isinstance(value, int) and not isinstance(value, bool) else None
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ok = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                ok = float(value)
            except ValueError:
                ok = None
    elif tp is str:
        ok = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    elif origin is list:
        if isinstance(value, (list, tuple)):
            return [_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    elif origin is dict or tp is Any:
        if isinstance(value, dict) or tp is Any:
            return copy.deepcopy(value)
    if ok is None:
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    return ok


def _check_value(value, meta, key):
    items = value if isinstance(value, list) else [value]
    for item in items:
        if item is None:
            continue
        choices = meta.get("choices")
        if choices and item not in choices:
            raise ConfigError(f"{key}: must be one of {', '.join(map(str, choices))}, got {item!r}")
        if meta.get("minimum") is not None and item < meta["minimum"]:
            raise ConfigError(f"{key}: must be >= {meta['minimum']}, got {item!r}")
        if meta.get("above") is not None and item <= meta["above"]:
            raise ConfigError(f"{key}: must be > {meta['above']}, got {item!r}")


def _build(cls, mapping, key=""):
    """An instance of the dataclass `cls` from `mapping` (missing keys keep their defaults), validated."""
    if isinstance(mapping, cls):
        return mapping
    if not isinstance(mapping, dict):
        raise ConfigError(f"{key or 'the configuration'}: expected a mapping, got {mapping!r}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    _check_keys(mapping, known, key)
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in mapping.items():
        where = f"{key}.{name}" if key else name
        meta = known[name].metadata
        try:
            value = meta["convert"](value, where) if meta.get("convert") else _convert(value, hints[name], where)
        except ConfigError:
            if meta.get("choices") and typing.get_origin(hints[name]) is list:
                raise ConfigError(
                    f"{where}: expected a list drawn from {', '.join(meta['choices'])} "
                    f"(e.g. [{meta['choices'][-1]}]), got {value!r}"
                ) from None
            raise
        _check_value(value, meta, where)
        values[name] = value
    instance = cls(**values)
    check = getattr(instance, "check", None)
    if check is not None:
        check(key)
    return instance


def _plain(value):
    """Dataclasses and tuples -> dicts and lists (YAML- and JSON-safe)."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _check_with_library(instance, key):
    """The second pass: `check_with_library(key)` of every section, nested ones first."""
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _check_with_library(value, f"{key}.{field.name}" if key else field.name)
    check = getattr(instance, "check_with_library", None)
    if check is not None:
        check(key)


class _Section:
    """Mapping-style helpers shared by every section."""

    @classmethod
    def from_dict(cls, mapping, key=None):
        key = cls._KEY if key is None else key
        instance = _build(cls, mapping, key)
        _check_with_library(instance, key)
        return instance

    def to_dict(self):
        return _plain(self)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class DataConfig(_Section):
    _KEY = "data"
    source: str = _field("digits", choices=("digits", "tfds", "folder", "glyphs"))
    name: str | None = None  # tfds builder name (caltech_birds2011, cars196, stanford_online_products)
    path: str | None = None  # image folder, one sub-folder per class
    eval_path: str | None = None  # image folder of the evaluation classes (null: second half of path's)
    data_dir: str | None = None  # tfds data_dir
    manual_dir: str | None = None  # tfds manual_dir (Cars196)
    download: bool = False  # let tfds download and prepare the dataset (needs the network)
    train_split: str = "train"
    eval_split: str = "test"
    image_size: int = _field(224, minimum=1)
    classes_per_batch: int = _field(8, minimum=2)  # a batch needs negatives
    samples_per_class: int = _field(4, minimum=1)
    # true: the papers' crop + flip; false: plain resize; a mapping: tfdml.data.Augment fields.
    augment: Any = _field(True, convert=_augment)
    small_class_policy: str = _field("replace", choices=("replace", "drop"))
    images_per_class: int | None = _field(None, minimum=1)  # generated data sets (glyphs)

    def check(self, key):
        if self.source == "folder":
            if not self.path:
                raise ConfigError(
                    f"{key}.path: data.source=folder needs an image folder with one sub-folder "
                    "per class (tfdml train --image-dir DIR)"
                )
            for name in ("path", "eval_path"):
                folder = getattr(self, name)
                if folder is None:
                    continue
                if not os.path.isdir(folder):
                    raise ConfigError(f"{key}.{name}: no such directory: {folder}")
                problem = _image_folder_problem(folder)
                if problem:
                    raise ConfigError(f"{key}.{name}: {problem}")

    def check_with_library(self, key):
        if self.source == "tfds":
            _check_tfds_name(self.name, f"{key}.name")


def _image_folder_problem(folder):
    """What makes `folder` no image folder (no class sub-folders, or nothing in them), or None. Cheap: it
    stops at the first class folder holding a file (image_folder checks the files themselves)."""
    try:
        classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    except OSError as error:
        return f"cannot read {folder}: {error.strerror or error}"
    if not classes:
        return f"{folder} has no class sub-folders (expected {folder}/<class name>/<image files>)"
    for name in classes:
        try:
            if any(entry.is_file() for entry in os.scandir(os.path.join(folder, name))):
                return None
        except OSError:
            continue
    return (
        f"none of the {len(classes)} class sub-folders of {folder} holds a file (expected "
        f"{folder}/<class name>/<image files>)"
    )


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
    _KEY = "model"
    type: str = _field("multilevel", choices=("multilevel", "single"))
    backbone: str = "small_cnn"
    weights: str | None = None  # imagenet | null | path to a weights file
    embedding_dim: int | None = _field(512, minimum=1)  # null: the pooled backbone feature
    taps: dict[str, str] | None = None  # {L: layer, M: layer, H: layer} for backbones without defaults
    levels: list[str] = _field(factory=lambda: ["L", "M", "H"], choices=("L", "M", "H"))
    level_weights: list[float] | None = _field(None, minimum=0.0)
    freeze_batchnorm: bool = False
    num_classes: int | None = _field(None, minimum=1)  # classifier head (Group Loss)
    head_filters: int = _field(128, minimum=1)  # auxiliary (L, M) heads: 1x1 conv width
    head_units: int = _field(1024, minimum=1)  # auxiliary heads: hidden Dense width
    widths: list[int] | None = _field(None, minimum=1)  # small_cnn block widths (default 8, 16, 32)

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


@dataclasses.dataclass
class TemperatureConfig(_Section):
    _KEY = "loss.dynamic_temperature"
    t1: float = _field(20.0, above=0.0)
    t2: float = _field(5.0, above=0.0)
    max_steps: int | None = _field(None, minimum=1)  # null: the whole run


@dataclasses.dataclass
class MemoryConfig(_Section):
    _KEY = "loss.cross_batch_memory"
    memory_size: int = _field(1024, minimum=1)  # embeddings the queue holds (>= the batch)
    start_step: int = _field(0, minimum=0)  # warm-up: training steps on the batch alone


@dataclasses.dataclass
class LossConfig(_Section):
    _KEY = "loss"
    name: str = _field("ranked_list", choices=tuple(LOSSES))
    params: dict[str, Any] = _field(factory=dict)  # arguments of the loss class (checked against it)
    dynamic_temperature: TemperatureConfig | None = None  # RLL eq. 15
    # XBM (Wang et al. 2020): tfdml.losses.CrossBatchMemory around the loss
    cross_batch_memory: MemoryConfig | None = None

    def check(self, key):
        if self.dynamic_temperature is not None and self.name != "ranked_list":
            raise ConfigError(f"{key}.dynamic_temperature: applies to loss.name=ranked_list only, not {self.name}")

    def check_with_library(self, key):
        from tfdml import losses

        _check_arguments(getattr(losses, LOSSES[self.name]), self.params, f"{key}.params", skip=("self", "name"))
        if self.cross_batch_memory is not None and not getattr(losses, LOSSES[self.name]).supports_references:
            usable = sorted(name for name, cls in LOSSES.items() if getattr(losses, cls).supports_references)
            raise ConfigError(
                f"{key}.cross_batch_memory: {self.name} has no pairs to a memory of past "
                f"embeddings; a cross-batch memory works with {', '.join(usable)}"
            )


def _check_arguments(function, params, key, skip=()):
    """`params` against the named arguments of `function`: unknown names and values of the wrong kind
    (a number where the default is a number, true/false where it is a bool) are `ConfigError`s."""
    signature = inspect.signature(function)
    known = {
        name: p
        for name, p in signature.parameters.items()
        if name not in skip and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    _check_keys(params, known, key)
    for name, value in params.items():
        default = known[name].default
        if isinstance(default, bool):
            _convert(value, bool, f"{key}.{name}")
        elif isinstance(default, (int, float)) and value is not None:
            _convert(value, float, f"{key}.{name}")


@dataclasses.dataclass
class ALAParams(_Section):
    """`tfdml.models.ALAModel` arguments; null keeps the ALAModel default. The base loss is `loss`."""

    _KEY = "ala.params"
    variant: str | None = _field(None, choices=tuple(ala_options.VARIANTS))  # paper: Algorithm 1 literally
    weights: str | None = _field(None, choices=ala_options.WEIGHT_FORMS)
    temperature: float | None = _field(None, above=0.0)  # softmax weights' temperature
    weight_floor: float | None = _field(None, minimum=0.0)  # softmax weights mixed with uniform ones
    reduction: str | None = _field(None, choices=ala_options.REDUCTIONS)
    lookahead: str | None = _field(None, choices=ala_options.LOOKAHEADS)
    assessor_input: str | None = _field(None, choices=ala_options.ASSESSOR_INPUTS)
    meta_interval: int | None = _field(None, minimum=1)  # assessor updated every N steps
    assessor_units: int | None = _field(None, minimum=1)
    assessor_layers: int | None = _field(None, minimum=1)
    inner_learning_rate: float | None = _field(None, above=0.0)
    assessor_learning_rate: float | None = _field(None, above=0.0)
    assessor_steps: int | None = _field(None, minimum=0)
    state: str | None = _field(None, choices=ala_options.STATE_MODES)
    weighting: str | None = _field(None, choices=ala_options.WEIGHTINGS)  # uniform: the base loss itself

    def arguments(self):
        return {k: v for k, v in self.to_dict().items() if v is not None}


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
    _KEY = "ala"
    enabled: bool = False
    params: ALAParams = _field(factory=ALAParams)
    episode: EpisodeConfig = _field(factory=EpisodeConfig)


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
    _KEY = "optimizer"
    name: str = _field("sgd", choices=OPTIMIZERS, convert=_optimizer_name)
    learning_rate: float = _field(1e-2, above=0.0)
    momentum: float = _field(0.9, minimum=0.0)
    weight_decay: float = _field(0.0, minimum=0.0)
    head_lr_multiplier: float = _field(1.0, above=0.0)  # new layers at this multiple of the backbone rate
    schedule: str | None = _field(None, choices=("cosine", "step", "constant", "none"))
    boundaries: list[float] = _field(factory=lambda: [0.5], above=0.0)  # step: fractions of the run or steps
    factor: float = _field(0.1, above=0.0)  # step schedule: multiplier at each boundary


@dataclasses.dataclass
class TrainingConfig(_Section):
    _KEY = "training"
    epochs: int = _field(16, minimum=1)
    steps_per_epoch: int | None = _field(None, minimum=1)  # null: one pass over the training images
    pretrain_epochs: int = _field(0, minimum=0)  # Group Loss classification pre-training
    checkpoint_dir: str | None = None  # default: <report_dir>/checkpoints
    eval_every: int = _field(0, minimum=0)  # epochs between retrieval evaluations (0: never)
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
    _KEY = "evaluation"
    ks: list[int] = _field(factory=lambda: [1, 2, 4, 8], minimum=1)
    metrics: list[str] = _field(factory=lambda: ["recall", "map@r", "r_precision", "nmi", "f1"])
    exact: bool = True
    batch_size: int = _field(256, minimum=1)

    def check(self, key):
        if not self.ks:
            raise ConfigError(f"{key}.ks: expected a non-empty list of positive integers, e.g. [1, 2, 4, 8]")

    def check_with_library(self, key):
        allowed = _metric_names()
        for i, name in enumerate(self.metrics):
            _check_value(name, {"choices": allowed}, f"{key}.metrics[{i}]")


@dataclasses.dataclass
class ExportConfig(_Section):
    _KEY = "export"
    enabled: bool = True
    base_dir: str = "exported_models"
    name: str | None = None  # default: the configuration's name
    version: int | None = _field(None, minimum=1)  # default: the next integer version
    index: bool = True
    # The `search` signature (written whenever an index is built): top_k neighbours, the gallery stored as
    # gallery_dtype, `match` at the score threshold of match_precision on the evaluation data.
    search: bool = True
    top_k: int = _field(10, minimum=1)
    gallery_dtype: str = _field("float32", choices=("float32", "bfloat16", "int8"))
    match_precision: float = _field(0.9, above=0.0)

    def check(self, key):
        if self.match_precision > 1.0:
            raise ConfigError(f"{key}.match_precision: expected a precision in (0, 1], got {self.match_precision}")


@dataclasses.dataclass
class ReportConfig(_Section):
    _KEY = "report"
    dir: str | None = None  # default: reports/<name>
    grid_queries: int = _field(8, minimum=1)
    grid_neighbours: int = _field(5, minimum=1)


@dataclasses.dataclass
class Config(_Section):
    """A whole job. Sections are typed; `Config.from_dict` validates, `to_dict` gives plain data back."""

    _KEY = ""
    name: str = "job"
    description: str | None = None
    paper_target: str | None = None
    seed: int = _field(0, minimum=0)
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
            ("report.dir", self.report.dir or os.path.join("reports", self.name)),
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
        if self.loss.cross_batch_memory is not None:
            self._check_memory(self.loss.cross_batch_memory)

    def _check_memory(self, memory):
        key = "loss.cross_batch_memory"
        if self.ala.enabled:
            raise ConfigError(f"{key}: DML-ALA (ala.enabled) trains on its own episodes, without a memory")
        if self.model.type == "multilevel" and len(self.model.levels) > 1:
            raise ConfigError(
                f"{key}: the memory holds one embedding per image; model.levels "
                f"{self.model.levels} gives {len(self.model.levels)} (use model.levels=[H] or "
                "model.type=single)"
            )
        batch = self.data.classes_per_batch * self.data.samples_per_class
        if memory.memory_size < batch:
            raise ConfigError(
                f"{key}.memory_size: {memory.memory_size} is less than a batch "
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
            from tfdml.models.ala import resolve_base_loss

            try:
                resolve_base_loss(self.loss.name, self.loss.params or None)
            except ValueError as error:
                raise ConfigError(f"loss.params: {error}") from None


# The embedded default job (what `tfdml train` runs with no options; configs/glyphs_rll.yaml writes it out).
DEFAULT_JOB = {
    "name": "glyphs_rll",
    "description": "Embedded default: small-CNN embedder, RLL, 150 font-rendered characters -> 151 unseen ones.",
    # tfdml.data.glyphs: 301 characters (look-alikes removed), 20 images each at 32 px with random face, size,
    # rotation, position, stroke weight and blur; train on one half of the characters, retrieve the other.
    # configs/glyphs_rll.yaml writes this job out with the reasons for each setting.
    "data": {"source": "glyphs", "image_size": 32, "classes_per_batch": 22, "samples_per_class": 3, "augment": False},
    "model": {"type": "single", "embedding_dim": 64, "widths": [16, 32, 64, 128]},
    # Eq. 14's uniform query weighting: on glyphs it beats the authors' Caffe weighting (the library default),
    # MAP@R 0.499 vs 0.436 at seed 0 on the 310-class set (README method table: tuned, over 5 seeds).
    "loss": {"name": "ranked_list", "params": {"margin": 0.4, "alpha": 1.0, "tn": 10.0, "query_weighting": "uniform"}},
    "optimizer": {"name": "adam", "learning_rate": 2e-3},
    "training": {"epochs": 10, "steps_per_epoch": 60},
    # k-means (NMI, F1) over 151 classes would take most of the job's time.
    "evaluation": {"ks": [1, 2, 4, 8], "metrics": ["recall", "map@r", "r_precision"]},
}


def default_config():
    """The embedded default job as a `Config`."""
    return Config.from_dict(copy.deepcopy(DEFAULT_JOB))


def _merge(base, update, path=""):
    """`update` merged into the plain mapping `base` (nested mappings key by key, other values replaced)."""
    if path == "loss." and "name" in update and update["name"] != base.get("name"):
        # Loss parameters belong to the loss they were set for: another loss starts from its own defaults.
        base["params"] = {}
    for key, value in update.items():
        if isinstance(base.get(key), dict) and isinstance(value, dict):
            _merge(base[key], value, f"{path}{key}.")
        else:
            base[key] = copy.deepcopy(value)
    return base


def parse_override(text):
    """`'a.b=value'` -> (`['a', 'b']`, value parsed as YAML: numbers, booleans, null, lists)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key.path=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw  # not YAML (e.g. an unbalanced bracket): the string itself, checked like any value
    return key.strip().split("."), value


def load_config(path=None, overrides=()):
    """`DEFAULT_JOB` <- YAML file at `path` <- each override, as a validated `Config`. An override is a
    `"key.path=value"` string (the value parsed as YAML) or a `("key.path", value)` pair."""
    # The defaults filled in without the library pass: the merged whole gets it once, at the end.
    config = _build(Config, copy.deepcopy(DEFAULT_JOB)).to_dict()
    for layer in _layers(path, overrides):
        _merge(config, layer)
    return Config.from_dict(config)


def _layers(path=None, overrides=()):
    """The mappings that `load_config` merges over the defaults: the file's, then one per override."""
    layers = []
    if path is not None:
        if os.path.isdir(path):
            raise ConfigError(f"--config {path} is a directory; give a YAML file, e.g. configs/glyphs_rll.yaml")
        if not os.path.exists(path):
            raise ConfigError(f"configuration file not found: {path}")
        try:
            with open(path) as f:
                loaded = yaml.safe_load(f) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
        except OSError as error:
            raise ConfigError(f"cannot read the configuration file {path}: {error.strerror or error}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping at the top level")
        layers.append(loaded)
    for override in overrides:
        keys, value = (override[0].split("."), override[1]) if isinstance(override, tuple) else parse_override(override)
        nested = value
        for key in reversed(keys):
            nested = {key: nested}
        layers.append(nested)
    return layers


def given_keys(path=None, overrides=()):
    """The dotted keys that the file at `path` and the `overrides` set (as `load_config` takes them), e.g. to
    tell a value the user chose from a default."""

    def leaves(mapping, prefix):
        for key, value in mapping.items():
            if isinstance(value, dict) and value:
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"

    return {key for layer in _layers(path, overrides) for key in leaves(layer, "")}


def output_dir_problem(path, writable=False):
    """Why no folder can be made at `path` (a file in the way; with `writable`, no write permission on
    the nearest existing folder), or None."""
    path = os.path.abspath(os.fspath(path))
    current = path
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
    if not os.path.isdir(current):
        return (
            f"{current} is a file, not a folder"
            if current == path
            else f"{current} is a file, so the folder {path} cannot be made"
        )
    if writable and not os.access(current, os.W_OK | os.X_OK):
        return f"no permission to write in {current}"
    return None


def differences(old, new, prefix=""):
    """Dotted keys whose values differ between two plain configuration mappings."""
    keys = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            keys.append(f"{prefix}{key}")
    return keys
