"""Training recipes of the papers, built from configuration dictionaries.

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
Lamb, Lion, ...); `name="radam"` raises an error that says so instead of silently substituting Adam.

Weight decay follows Keras: decoupled, `w <- w - lr * weight_decay * w` at every step, applied with each
group's own learning rate. For SGD without momentum this equals Caffe's L2 `weight_decay`; with momentum it
differs only in that the decay term does not accumulate in the momentum buffer.
"""

import keras

from tfdml.optimizers import learning_rate_multipliers

OPTIMIZER_DEFAULTS = {
    "name": "sgd",
    "learning_rate": 1e-2,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "head_lr_multiplier": 1.0,
    "schedule": None,
}

_OPTIMIZERS = {
    "sgd": lambda c: keras.optimizers.SGD(c["learning_rate"], momentum=c["momentum"],
                                          weight_decay=c["weight_decay"] or None),
    "adam": lambda c: keras.optimizers.Adam(c["learning_rate"], weight_decay=c["weight_decay"] or None),
    "adamw": lambda c: keras.optimizers.AdamW(c["learning_rate"], weight_decay=c["weight_decay"]),
    "lamb": lambda c: keras.optimizers.Lamb(c["learning_rate"], weight_decay=c["weight_decay"] or None),
    "rmsprop": lambda c: keras.optimizers.RMSprop(c["learning_rate"], momentum=c["momentum"],
                                                  weight_decay=c["weight_decay"] or None),
}


def make_schedule(config, total_steps=None):
    """Learning-rate value or schedule from `config["learning_rate"]` and `config["schedule"]`.

    Schedules: None (constant); "cosine" (`CosineDecay` to 0 over `total_steps`); "step" (multiply by
    `config["factor"]` (0.1) from each of `config["boundaries"]` on, given as fractions of `total_steps`
    when below 1, else as step numbers; the step counter starts at 0).
    """
    learning_rate = float(config["learning_rate"])
    schedule = config.get("schedule")
    if schedule in (None, "none", "constant"):
        return learning_rate
    if total_steps is None:
        raise ValueError(f"The {schedule!r} learning-rate schedule needs total_steps (epochs x steps per epoch).")
    if schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=int(total_steps))
    if schedule == "step":
        boundaries = config.get("boundaries", [0.5])
        factor = float(config.get("factor", 0.1))
        steps = sorted(int(round(b * total_steps)) if b < 1 else int(b) for b in boundaries)
        values = [learning_rate * factor ** i for i in range(len(steps) + 1)]
        # Keras keeps values[i] up to and including boundaries[i]; ours change *at* the boundary step.
        return keras.optimizers.schedules.PiecewiseConstantDecay([s - 1 for s in steps], values)
    raise ValueError(f"Unknown learning-rate schedule {schedule!r}; use None, 'cosine' or 'step'.")


def make_optimizer(config, model=None, total_steps=None):
    """Optimizer from a configuration dictionary (keys of `OPTIMIZER_DEFAULTS`, plus schedule options).

    Args:
      config: `{"name": "sgd" | "adam" | "adamw" | "lamb" | "rmsprop", "learning_rate", "momentum",
        "weight_decay", "head_lr_multiplier", "schedule", ...}`; missing keys take `OPTIMIZER_DEFAULTS`.
      model: needed when `head_lr_multiplier != 1`: a tfdml embedder (its `head_variables` are the new
        layers; everything else, the backbone, keeps the base learning rate).
      total_steps: training steps, for the cosine and step schedules.

    Returns:
      a Keras optimizer, or a `tfdml.optimizers.MultiOptimizer` when the head multiplier is not 1.

    Example (RLL, new layers at 10x):
      >>> make_optimizer({"name": "sgd", "learning_rate": 1e-2, "momentum": 0.9, "weight_decay": 2e-5,
      ...                 "head_lr_multiplier": 10}, model)
    """
    config = {**OPTIMIZER_DEFAULTS, **dict(config)}
    name = str(config["name"]).lower()
    if name == "radam":
        raise ValueError("RAdam is not available in keras.optimizers (Keras 3.15); use name='adam' (the Group "
                         "Loss paper's optimizer) or 'adamw'.")
    if name not in _OPTIMIZERS:
        raise ValueError(f"Unknown optimizer {config['name']!r}; choose from {sorted(_OPTIMIZERS)}.")
    config["learning_rate"] = make_schedule(config, total_steps)
    optimizer = _OPTIMIZERS[name](config)
    multiplier = float(config["head_lr_multiplier"])
    if multiplier == 1.0:
        return optimizer
    if multiplier <= 0:
        raise ValueError(f"head_lr_multiplier must be > 0, got {multiplier}.")
    head_layers = _head_layers(model)
    return learning_rate_multipliers(optimizer, [(head_layers, multiplier)])


MODEL_DEFAULTS = {
    "type": "multilevel",
    "backbone": "small_cnn",
    "weights": None,
    "embedding_dim": 512,
    "taps": None,
    "levels": ["L", "M", "H"],
    "level_weights": None,
    "freeze_batchnorm": False,
    "num_classes": None,
    "head_filters": 128,
    "head_units": 1024,
    "widths": None,
}


def make_embedder(config, input_shape=None):
    """`Embedder` (`type: single`) or `MultiLevelEmbedder` (`type: multilevel`) from a model section.

    Keys (missing ones take `MODEL_DEFAULTS`): type, backbone, weights, embedding_dim, taps, levels,
    level_weights, freeze_batchnorm, num_classes, head_filters, head_units (the last three only for
    `multilevel`), widths (the small CNN's block widths, default (8, 16, 32); other backbones ignore it).
    `input_shape` is `(h, w, c)`.

    Example:
      >>> make_embedder({"type": "multilevel", "backbone": "small_cnn", "embedding_dim": 32}, (32, 32, 1))
    """
    from tfdml.models import Embedder, MultiLevelEmbedder, backbones  # models import recipes: import here

    unknown = set(config) - set(MODEL_DEFAULTS)
    if unknown:
        raise ValueError(f"Unknown model keys {sorted(unknown)}; known: {sorted(MODEL_DEFAULTS)}.")
    config = {**MODEL_DEFAULTS, **dict(config)}
    backbone = config["backbone"]
    if config["widths"] is not None and backbones.is_small_cnn(backbone):
        # A small CNN of other widths is passed as a built model (saved in full by get_config).
        backbone = backbones.small_cnn(input_shape or backbones.SMALL_CNN_INPUT_SHAPE,
                                       widths=tuple(int(w) for w in config["widths"]))
    common = dict(embedding_dim=config["embedding_dim"], input_shape=input_shape, weights=config["weights"],
                  num_classes=config["num_classes"], freeze_batchnorm=config["freeze_batchnorm"])
    if config["type"] == "single":
        return Embedder(backbone, **common)
    if config["type"] != "multilevel":
        raise ValueError(f"Unknown model type {config['type']!r}; use 'single' or 'multilevel'.")
    return MultiLevelEmbedder(backbone, taps=config["taps"], levels=tuple(config["levels"]),
                              level_weights=config["level_weights"], head_filters=config["head_filters"],
                              head_units=config["head_units"], **common)


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
