"""Training recipes of the papers, built from the typed configuration sections of `tfdml.config`.

- `make_optimizer(config, model)`: SGD with momentum (RLL: lr 1e-2, momentum 0.9, weight decay 2e-5), Adam
  (Group Loss: 2e-4; margin loss), AdamW, Lamb, with an optional learning-rate schedule and the "new layers
  at `head_lr_multiplier` x the backbone learning rate" rule: the section validated, then built by
  `tfdml.optimizers.build_optimizer` (one inner optimizer per group, so the multiplier is exact for SGD and,
  through the scaled step, for every optimizer).
- `make_schedule(config, total_steps)`: constant, cosine or step decay (the Group Loss recipe divides the
  learning rate by 10 after 30 of 60 epochs: `schedule="step", boundaries=[0.5], factor=0.1`).
- `freeze_batchnorm(model)`: the RLL paper's frozen BatchNorm (CUB, Cars), from `tfdml.models.backbones`.
- `make_embedder(config, input_shape)`: an `Embedder` or `MultiLevelEmbedder` from a model section.
- `build_loss(config, ...)`: a tfdml loss from a loss section, on each prefix of `nested_dims` (`NestedLoss`), in
  `CrossBatchMemory`, `SmallLossWeighting` or `PRISM` as the section says.

RAdam (used by some Group Loss runs) is not part of `keras.optimizers` (Keras 3.15 has Adam, AdamW, Nadam,
Lamb, Lion, ...); `name="radam"` raises a `tfdml.config.ConfigError` that says so instead of silently
substituting Adam. Mappings are validated like a configuration file (`ConfigError`, a `ValueError`).

Weight decay follows Keras: decoupled, `w <- w - lr * weight_decay * w` at every step, applied with each
group's own learning rate. For SGD without momentum this equals Caffe's L2 `weight_decay`; with momentum it
differs only in that the decay term does not accumulate in the momentum buffer.
"""

import inspect

from tfdml import losses
from tfdml.config import LOSSES, ConfigError, ModelConfig, OptimizerConfig
from tfdml.models import Embedder, MultiLevelEmbedder, backbones
from tfdml.models.backbones import freeze_batchnorm  # noqa: F401  (re-exported: the configuration's name)
from tfdml.optimizers import build_optimizer, build_schedule


def make_schedule(config, total_steps=None):
    """Learning-rate value or schedule from an `OptimizerConfig` (or a mapping of its fields):
    `learning_rate`, `schedule`, `boundaries`, `factor` (see `tfdml.optimizers.build_schedule`)."""
    config = OptimizerConfig.from_dict(config)
    return build_schedule(config.learning_rate, config.schedule, total_steps, config.boundaries, config.factor)


def make_optimizer(config, model=None, total_steps=None):
    """Optimizer from an `OptimizerConfig` (or a mapping of its fields; missing ones take its defaults:
    SGD, learning rate 1e-2, momentum 0.9), validated like a configuration file, then built by
    `tfdml.optimizers.build_optimizer`.

    Args:
      config: `name` ("sgd" | "adam" | "adamw" | "lamb" | "rmsprop"), `learning_rate`, `momentum`,
        `weight_decay`, `head_lr_multiplier`, `schedule`, `boundaries`, `factor`.
      model: needed when `head_lr_multiplier != 1`: a tfdml embedder (its `head_variables` are the new
        layers; everything else, the backbone, keeps the base learning rate).
      total_steps: training steps, for the cosine and step schedules.

    Returns:
      a Keras optimizer, or a `tfdml.optimizers.MultiOptimizer` when the head multiplier is not 1.

    Example (RLL, new layers at 10x):
      >>> make_optimizer({"name": "sgd", "learning_rate": 1e-2, "momentum": 0.9, "weight_decay": 2e-5,
      ...                 "head_lr_multiplier": 10}, model)
    """
    # The section's fields are build_optimizer's keyword arguments.
    return build_optimizer(**OptimizerConfig.from_dict(config).to_dict(), model=model, total_steps=total_steps)


def make_embedder(config, input_shape=None):
    """`Embedder` (`type: single`) or `MultiLevelEmbedder` (`type: multilevel`) from a `ModelConfig` (or a
    mapping of its fields; missing ones take its defaults).

    Fields: type, backbone, weights, embedding_dim, taps, levels, level_weights, freeze_batchnorm,
    frozen_stages, freeze_backbone,
    num_classes, head_filters, head_units (the last three only for `multilevel`), widths (the small CNN's
    block widths, default (8, 16, 32); other backbones ignore it). `input_shape` is `(h, w, c)`.

    Example:
      >>> make_embedder({"type": "multilevel", "backbone": "small_cnn", "embedding_dim": 32}, (32, 32, 1))
    """
    config = ModelConfig.from_dict(config)
    backbone = config.backbone
    widths = tuple(config.widths) if config.widths is not None and backbones.is_small_cnn(backbone) else None
    common = dict(
        embedding_dim=config.embedding_dim,
        input_shape=input_shape,
        weights=config.weights,
        num_classes=config.num_classes,
        freeze_batchnorm=config.freeze_batchnorm,
        frozen_stages=config.frozen_stages,
        freeze_backbone=config.freeze_backbone,
        widths=widths,
    )
    if config.type == "single":
        return Embedder(backbone, **common)
    return MultiLevelEmbedder(
        backbone,
        taps=config.taps,
        levels=tuple(config.levels),
        level_weights=config.level_weights,
        head_filters=config.head_filters,
        head_units=config.head_units,
        **common,
    )


def required_arguments(loss_class):
    """The names of the arguments `loss_class` cannot do without (no default), e.g. a proxy loss's
    `num_classes` and `embedding_dim`."""
    parameters = inspect.signature(loss_class).parameters.values()
    return {p.name for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def build_loss(section, num_classes=None, total_steps=None, embedding_dim=None):
    """A tfdml loss from a `LossConfig` (`name`, `params`, optional `dynamic_temperature`), applied to each
    prefix of `nested_dims` (`NestedLoss`), in a `CrossBatchMemory` of `embedding_dim`-wide embeddings (the full
    vectors) with `cross_batch_memory`, in `SmallLossWeighting` or `PRISM` with `label_noise`."""

    params = dict(section.params)
    loss_class = getattr(losses, LOSSES[section.name])
    if "embedding_dim" in required_arguments(loss_class):  # a proxy per class, as wide as the embedding
        params.setdefault("embedding_dim", embedding_dim)
    if section.name != "group" and "num_classes" in required_arguments(loss_class) and "num_classes" not in params:
        raise ConfigError(
            f"loss.params.num_classes: {section.name} learns one proxy per training class: give their number "
            "(tfdml train takes it from the training data)"
        )
    schedule = section.dynamic_temperature
    if schedule is not None:
        params["tn"] = losses.LinearTemperature(schedule.t1, schedule.t2, schedule.max_steps or total_steps)
    if section.name == "group":
        params.setdefault("num_classes", num_classes)
        if params["num_classes"] is None:
            raise ConfigError("model.num_classes: the group loss needs the classifier head size")
    loss = loss_class(**params)
    if section.nested_dims is not None:
        loss = losses.NestedLoss(loss, section.nested_dims, section.nested_weights)
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
