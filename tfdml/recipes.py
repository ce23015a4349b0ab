"""Training recipes of the papers, built from the typed configuration sections of `tfdml.config`.

- `make_optimizer(config, model)`: SGD with momentum (RLL: lr 1e-2, momentum 0.9, weight decay 2e-5), Adam
  (Group Loss: 2e-4; margin loss), AdamW, Lamb, with an optional learning-rate schedule and the "new layers
  at `head_lr_multiplier` x the backbone learning rate" rule, implemented with
  `tfdml.optimizers.learning_rate_multipliers` (one inner optimizer per group, so the multiplier is exact
  for SGD and, through the scaled step, for every optimizer).
- `make_schedule(config, total_steps)`: constant, cosine or step decay (the Group Loss recipe divides the
  learning rate by 10 after 30 of 60 epochs: `schedule="step", boundaries=[0.5], factor=0.1`).
- `freeze_batchnorm(model)`: the RLL paper's frozen BatchNorm (CUB, Cars).
- `make_embedder(config, input_shape)`: an `Embedder` or `MultiLevelEmbedder` from a model section.

RAdam (used by some Group Loss runs) is not part of `keras.optimizers` (Keras 3.15 has Adam, AdamW, Nadam,
Lamb, Lion, ...); `name="radam"` raises a `tfdml.config.ConfigError` that says so instead of silently
substituting Adam. Mappings are validated like a configuration file (`ConfigError`, a `ValueError`).

Weight decay follows Keras: decoupled, `w <- w - lr * weight_decay * w` at every step, applied with each
group's own learning rate. For SGD without momentum this equals Caffe's L2 `weight_decay`; with momentum it
differs only in that the decay term does not accumulate in the momentum buffer.
"""

import keras

from tfdml.config import ModelConfig, OptimizerConfig
from tfdml.optimizers import learning_rate_multipliers

_OPTIMIZERS = {
    "sgd": lambda c, lr: keras.optimizers.SGD(lr, momentum=c.momentum, weight_decay=c.weight_decay or None),
    "adam": lambda c, lr: keras.optimizers.Adam(lr, weight_decay=c.weight_decay or None),
    "adamw": lambda c, lr: keras.optimizers.AdamW(lr, weight_decay=c.weight_decay),
    "lamb": lambda c, lr: keras.optimizers.Lamb(lr, weight_decay=c.weight_decay or None),
    "rmsprop": lambda c, lr: keras.optimizers.RMSprop(lr, momentum=c.momentum, weight_decay=c.weight_decay or None),
}


def make_schedule(config, total_steps=None):
    """Learning-rate value or schedule from an `OptimizerConfig` (or a mapping of its fields):
    `learning_rate` and `schedule`.

    Schedules: None (constant); "cosine" (`CosineDecay` to 0 over `total_steps`); "step" (multiply by
    `factor` (0.1) from each of `boundaries` on, given as fractions of `total_steps` when below 1, else as
    step numbers; the step counter starts at 0).
    """
    config = OptimizerConfig.from_dict(config)
    schedule = config.schedule
    if schedule in (None, "none", "constant"):
        return config.learning_rate
    if total_steps is None:
        raise ValueError(f"The {schedule!r} learning-rate schedule needs total_steps (epochs x steps per epoch).")
    if schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(config.learning_rate, decay_steps=int(total_steps))
    steps = sorted(int(round(b * total_steps)) if b < 1 else int(b) for b in config.boundaries)
    values = [config.learning_rate * config.factor ** i for i in range(len(steps) + 1)]
    # Keras keeps values[i] up to and including boundaries[i]; ours change *at* the boundary step.
    return keras.optimizers.schedules.PiecewiseConstantDecay([s - 1 for s in steps], values)


def make_optimizer(config, model=None, total_steps=None):
    """Optimizer from an `OptimizerConfig` (or a mapping of its fields; missing ones take its defaults:
    SGD, learning rate 1e-2, momentum 0.9).

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
    config = OptimizerConfig.from_dict(config)
    optimizer = _OPTIMIZERS[config.name](config, make_schedule(config, total_steps))
    if config.head_lr_multiplier == 1.0:
        return optimizer
    return learning_rate_multipliers(optimizer, [(_head_layers(model), config.head_lr_multiplier)])


def make_embedder(config, input_shape=None):
    """`Embedder` (`type: single`) or `MultiLevelEmbedder` (`type: multilevel`) from a `ModelConfig` (or a
    mapping of its fields; missing ones take its defaults).

    Fields: type, backbone, weights, embedding_dim, taps, levels, level_weights, freeze_batchnorm,
    num_classes, head_filters, head_units (the last three only for `multilevel`), widths (the small CNN's
    block widths, default (8, 16, 32); other backbones ignore it). `input_shape` is `(h, w, c)`.

    Example:
      >>> make_embedder({"type": "multilevel", "backbone": "small_cnn", "embedding_dim": 32}, (32, 32, 1))
    """
    from tfdml.models import Embedder, MultiLevelEmbedder, backbones  # models import recipes: import here

    config = ModelConfig.from_dict(config)
    backbone = config.backbone
    widths = tuple(config.widths) if config.widths is not None and backbones.is_small_cnn(backbone) else None
    common = dict(embedding_dim=config.embedding_dim, input_shape=input_shape, weights=config.weights,
                  num_classes=config.num_classes, freeze_batchnorm=config.freeze_batchnorm, widths=widths)
    if config.type == "single":
        return Embedder(backbone, **common)
    return MultiLevelEmbedder(backbone, taps=config.taps, levels=tuple(config.levels),
                              level_weights=config.level_weights, head_filters=config.head_filters,
                              head_units=config.head_units, **common)


def _head_layers(model):
    layers = list(getattr(model, "level_heads", [])) + list(getattr(model, "classifiers", []))
    if not layers:
        raise ValueError("head_lr_multiplier != 1 needs a tfdml Embedder / MultiLevelEmbedder (its heads are the "
                         f"new layers); got {type(model).__name__}.")
    return layers


def _all_layers(layer):
    for sub in getattr(layer, "layers", None) or getattr(layer, "_layers", []):
        yield sub
        yield from _all_layers(sub)


def freeze_batchnorm(model):
    """Freezes every BatchNormalization layer in `model` (recursively) and returns their number.

    A frozen Keras BatchNormalization runs in inference mode (moving statistics, which are not updated) and
    its scale and offset are not trained, Caffe's `use_global_stats` plus zero learning rate. Recompile the
    model afterwards if it was already compiled.
    """
    count = 0
    for layer in _all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
            count += 1
    return count
