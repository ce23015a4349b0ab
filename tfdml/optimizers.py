"""Per-variable optimizers: different optimizers (or learning rates) for different parts of a model.

Metric-learning recipes train new layers faster than the pretrained backbone ("new layers at 10x the
backbone learning rate", RLL) and train auxiliary variables with their own optimizer (the margin loss'
`beta`: SGD 0.1, momentum 0.9, whatever trains the network). `MultiOptimizer` routes each variable to one
inner optimizer; `learning_rate_multipliers` builds one from a base optimizer.

`build_optimizer` / `build_schedule` construct the papers' optimizers from plain values (the configuration
layer, `tfdml.recipes.make_optimizer`, validates a configuration section and calls them).

Both build on Keras' own `keras.optimizers.MultiOptimizer` (state of every inner optimizer is part of
`optimizer.variables`, so it is saved by `model.save`, restored by `load_model` and checkpointed; updates go
through each inner optimizer's distribution-aware `apply`, so `MirroredStrategy` works). What this module
adds is routing by explicit selectors that serialise.

Selectors (first rule that matches a variable wins):
  - a string: a layer name, a layer path such as `"backbone"` or `"backbone/conv1"`, a variable path, or a
    regular expression fully matching the variable path (`variable.path`, e.g. `"backbone/d1/kernel"`);
  - a `keras.layers.Layer`: all of its variables (stored as its path);
  - a variable: that variable (stored as its path);
  - a callable `fn(variable) -> bool` (serialised by Keras; a lambda only loads with `safe_mode=False`);
  - a list or tuple of any of these.
"""

import re

import keras
from keras.saving import deserialize_keras_object, serialize_keras_object


def _selector_to_rules(selector):
    """Normalises a selector to a list of rules: `("path", str)` or `("fn", callable)` (plus ids of variables)."""
    if isinstance(selector, (list, tuple)):
        rules = []
        for item in selector:
            rules.extend(_selector_to_rules(item))
        return rules
    if isinstance(selector, str):
        return [("path", selector)]
    if isinstance(selector, keras.layers.Layer):
        return [("path", selector.path)]
    if isinstance(selector, keras.Variable):
        return [("variable", selector)]
    if callable(selector):
        return [("fn", selector)]
    raise TypeError(
        "A variable selector must be a string (layer name, path or regex), a Layer, a Variable, a callable "
        f"fn(variable) -> bool, or a list of these; got {type(selector).__name__}: {selector!r}."
    )


def _path_matches(pattern, path):
    if path == pattern or path.startswith(pattern + "/") or ("/" + pattern + "/") in ("/" + path):
        return True
    try:
        return re.fullmatch(pattern, path) is not None
    except re.error:
        return False


def _rule_matches(rule, variable):
    kind, value = rule
    if kind == "variable":
        return variable is value or variable.path == value.path
    if kind == "path":
        return _path_matches(value, variable.path)
    return bool(value(variable))


class _Router:
    """Maps a variable to the optimizer of the first matching rule, else to `default_optimizer`."""

    def __init__(self, routes, default_optimizer):
        self.routes = routes  # [(optimizer, [rule, ...])]
        self.default_optimizer = default_optimizer

    def values(self):
        return [optimizer for optimizer, _ in self.routes]

    def __call__(self, variable):
        for optimizer, rules in self.routes:
            if any(_rule_matches(rule, variable) for rule in rules):
                return optimizer
        if self.default_optimizer is None:
            raise ValueError(
                f"Variable {variable.path!r} matches no selector of the MultiOptimizer and no default "
                "optimizer was given. Add a selector for it or pass default=..."
            )
        return self.default_optimizer


@keras.saving.register_keras_serializable(package="tfdml")
class MultiOptimizer(keras.optimizers.MultiOptimizer):
    """Routes each trainable variable to one of several inner optimizers.

    Args:
        optimizers_and_selectors: list of `(optimizer, selector)` pairs (see the module docstring for
            selectors); the first pair whose selector matches a variable trains it.
        default: optimizer for variables no selector matches (`None`: such a variable is an error).
        loss_scale_factor, name: as for any Keras optimizer.

    Each inner optimizer keeps its own learning rate, schedule, momentum and `iterations`; this optimizer's
    `iterations` counts the training steps. Inner optimizers cannot themselves be `MultiOptimizer` or
    `LossScaleOptimizer` (mixed precision wraps the whole `MultiOptimizer` instead, which `compile` does).

    Example:
        >>> optimizer = MultiOptimizer(
        ...     [(keras.optimizers.SGD(0.01, momentum=0.9), "backbone"),
        ...      (keras.optimizers.SGD(0.1, momentum=0.9), ["embedding", "classifier"])])
        >>> model.compile(optimizer=optimizer, loss=...)
    """

    def __init__(self, optimizers_and_selectors, default=None, loss_scale_factor=None, name=None):
        routes = []
        for entry in optimizers_and_selectors:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
                raise ValueError(f"Each entry must be an (optimizer, selector) pair, got {entry!r}.")
            optimizer, selector = entry
            optimizer = keras.optimizers.get(optimizer)
            routes.append((optimizer, _selector_to_rules(selector)))
        if default is not None:
            default = keras.optimizers.get(default)
        if not routes and default is None:
            raise ValueError("MultiOptimizer needs at least one (optimizer, selector) pair or a default.")
        for optimizer in [o for o, _ in routes] + ([default] if default is not None else []):
            if isinstance(optimizer, (keras.optimizers.MultiOptimizer, keras.optimizers.LossScaleOptimizer)):
                raise ValueError(
                    f"An inner optimizer cannot be a {type(optimizer).__name__}; nest plain optimizers only "
                    "(use with_routes() to add routes to an existing MultiOptimizer)."
                )
        # The routes live in the router, a plain object that no tracker follows.
        super().__init__(_Router(routes, default), loss_scale_factor=loss_scale_factor, name=name)
        # Named attributes make each inner optimizer (and its slots) a dependency of tf.train.Checkpoint;
        # the base class keeps them in a plain list that TF checkpoints do not follow.
        for index, optimizer in enumerate(self._inner_optimizers):
            setattr(self, f"inner_optimizer_{index}", optimizer)

    @property
    def default_optimizer(self):
        return self._optimizer_map.default_optimizer

    @property
    def _routes(self):
        return self._optimizer_map.routes

    def finalize_variable_values(self, var_list):
        # Keras' fit passes every trainable weight of the model; a model that trains some of them with
        # another optimizer (ALAModel's assessor) must not fail here on variables this one never built.
        known = getattr(self, "_var_to_optimizer_idx", {})
        super().finalize_variable_values([v for v in var_list if self._var_key(v) in known])

    def with_routes(self, optimizers_and_selectors):
        """A new `MultiOptimizer` whose extra `(optimizer, selector)` pairs take precedence over these ones
        (same inner optimizer objects, same default)."""
        own = [(optimizer, [value for _, value in rules]) for optimizer, rules in self._routes]
        return MultiOptimizer(
            list(optimizers_and_selectors) + own,
            default=self.default_optimizer,
            loss_scale_factor=self.loss_scale_factor,
            name=self.name,
        )

    def get_config(self):
        def rule_config(rule):
            kind, value = rule
            if kind == "variable":
                return {"path": "^" + re.escape(value.path) + "$"}
            if kind == "path":
                return {"path": value}
            return {"fn": serialize_keras_object(value)}

        return {
            "optimizers_and_selectors": [
                [serialize_keras_object(optimizer), [rule_config(rule) for rule in rules]]
                for optimizer, rules in self._routes
            ],
            "default": None if self.default_optimizer is None else serialize_keras_object(self.default_optimizer),
            "loss_scale_factor": self.loss_scale_factor,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        pairs = []
        for optimizer_config, rules in config["optimizers_and_selectors"]:
            optimizer = deserialize_keras_object(optimizer_config, custom_objects=custom_objects)
            selector = [
                rule["path"] if "path" in rule else deserialize_keras_object(rule["fn"], custom_objects=custom_objects)
                for rule in rules
            ]
            pairs.append((optimizer, selector))
        default = config.get("default")
        if default is not None:
            default = deserialize_keras_object(default, custom_objects=custom_objects)
        return cls(pairs, default=default, loss_scale_factor=config.get("loss_scale_factor"), name=config.get("name"))


@keras.saving.register_keras_serializable(package="tfdml")
class ScaledLearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """`multiplier * schedule(step)`: a learning-rate schedule scaled by a constant."""

    def __init__(self, schedule, multiplier):
        self.schedule = schedule
        self.multiplier = float(multiplier)

    def __call__(self, step):
        return self.schedule(step) * self.multiplier

    def get_config(self):
        return {"schedule": serialize_keras_object(self.schedule), "multiplier": self.multiplier}

    @classmethod
    def from_config(cls, config):
        return cls(deserialize_keras_object(config["schedule"]), config["multiplier"])


def _scaled_clone(optimizer, multiplier, suffix):
    config = optimizer.get_config()
    learning_rate = optimizer._learning_rate  # the schedule object itself, if any
    if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        config["learning_rate"] = ScaledLearningRate(learning_rate, multiplier)
    else:
        config["learning_rate"] = config["learning_rate"] * multiplier
    config["name"] = f"{optimizer.name}_{suffix}"
    return type(optimizer).from_config(config)


def learning_rate_multipliers(optimizer, multipliers, default_multiplier=1.0):
    """A `MultiOptimizer` of clones of `optimizer` whose learning rates are scaled per variable group.

    Args:
        optimizer: base optimizer (instance or name); its config (momentum, weight decay ...) is kept and only
            the learning rate (float or schedule) is multiplied.
        multipliers: `{selector: multiplier}` (string/Layer/callable keys, see the module docstring) or a list
            of `(selector, multiplier)` pairs for unhashable selectors such as lists of variables.
        default_multiplier: multiplier of the variables no selector matches (1.0).

    Example (RLL recipe, new layers at 10x the backbone rate):
        >>> opt = learning_rate_multipliers(keras.optimizers.SGD(0.01, momentum=0.9), {"backbone": 0.1})
    """
    optimizer = keras.optimizers.get(optimizer)
    if isinstance(optimizer, (keras.optimizers.MultiOptimizer, keras.optimizers.LossScaleOptimizer)):
        raise ValueError(f"learning_rate_multipliers needs a plain optimizer, got {type(optimizer).__name__}.")
    items = list(multipliers.items()) if isinstance(multipliers, dict) else list(multipliers)
    pairs = []
    for index, (selector, multiplier) in enumerate(items):
        if not multiplier > 0:
            raise ValueError(f"Learning-rate multipliers must be > 0, got {multiplier} for {selector!r}.")
        pairs.append((_scaled_clone(optimizer, multiplier, f"group{index}"), selector))
    default = _scaled_clone(optimizer, default_multiplier, "default")
    return MultiOptimizer(pairs, default=default, name=f"{optimizer.name}_multipliers")


# The optimizers of the papers' recipes: SGD with momentum (RLL: lr 1e-2, momentum 0.9, weight decay 2e-5),
# Adam (Group Loss: 2e-4; margin loss), AdamW, Lamb, RMSprop. Weight decay is Keras' decoupled decay
# (`w <- w - lr * weight_decay * w`), Caffe's L2 decay for SGD without momentum.
OPTIMIZER_BUILDERS = {
    "sgd": lambda lr, momentum, decay: keras.optimizers.SGD(lr, momentum=momentum, weight_decay=decay or None),
    "adam": lambda lr, momentum, decay: keras.optimizers.Adam(lr, weight_decay=decay or None),
    "adamw": lambda lr, momentum, decay: keras.optimizers.AdamW(lr, weight_decay=decay),
    "lamb": lambda lr, momentum, decay: keras.optimizers.Lamb(lr, weight_decay=decay or None),
    "rmsprop": lambda lr, momentum, decay: keras.optimizers.RMSprop(lr, momentum=momentum, weight_decay=decay or None),
}
OPTIMIZER_NAMES = tuple(OPTIMIZER_BUILDERS)


def build_schedule(learning_rate, schedule=None, total_steps=None, boundaries=(0.5,), factor=0.1):
    """A learning-rate value or schedule.

    Args:
        learning_rate: the base (initial) learning rate.
        schedule: None / "none" / "constant" (the value itself); "cosine" (`CosineDecay` to 0 over
            `total_steps`); "step" (multiply by `factor` from each of `boundaries` on).
        total_steps: training steps, needed by "cosine" and "step".
        boundaries: for "step": fractions of `total_steps` when below 1, else step numbers (the step counter
            starts at 0). The Group Loss recipe: `boundaries=[0.5], factor=0.1` (lr / 10 after 30 of 60 epochs).
        factor: for "step": the multiplier applied at each boundary.
    """
    if schedule in (None, "none", "constant"):
        return learning_rate
    if total_steps is None:
        raise ValueError(f"The {schedule!r} learning-rate schedule needs total_steps (epochs x steps per epoch).")
    if schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=int(total_steps))
    if schedule != "step":
        raise ValueError(f"Unknown learning-rate schedule {schedule!r}; expected cosine, step or constant.")
    steps = sorted(int(round(b * total_steps)) if b < 1 else int(b) for b in boundaries)
    values = [learning_rate * factor**i for i in range(len(steps) + 1)]
    # Keras keeps values[i] up to and including boundaries[i]; ours change *at* the boundary step.
    return keras.optimizers.schedules.PiecewiseConstantDecay([s - 1 for s in steps], values)


def build_optimizer(
    name="sgd",
    learning_rate=1e-2,
    momentum=0.9,
    weight_decay=0.0,
    head_lr_multiplier=1.0,
    model=None,
    schedule=None,
    total_steps=None,
    boundaries=(0.5,),
    factor=0.1,
):
    """An optimizer of the papers' recipes, with the "new layers at `head_lr_multiplier` x" rule.

    Args:
        name: one of `OPTIMIZER_NAMES` ("sgd", "adam", "adamw", "lamb", "rmsprop").
        learning_rate, schedule, total_steps, boundaries, factor: see `build_schedule`.
        momentum: SGD's and RMSprop's momentum (ignored by the Adam family).
        weight_decay: Keras' decoupled weight decay (0: none).
        head_lr_multiplier: learning-rate multiple of the new layers; needs `model`, a tfdml embedder whose
            `level_heads` / `classifiers` are the new layers (everything else, the backbone, keeps the base
            rate). Implemented with `learning_rate_multipliers`, exact for every optimizer.

    Returns:
        a Keras optimizer, or a `MultiOptimizer` when `head_lr_multiplier != 1`.

    Example (RLL, new layers at 10x):
        >>> build_optimizer("sgd", 1e-2, momentum=0.9, weight_decay=2e-5, head_lr_multiplier=10, model=embedder)
    """
    if name not in OPTIMIZER_BUILDERS:
        raise ValueError(f"Unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZER_NAMES)}.")
    rate = build_schedule(learning_rate, schedule, total_steps, boundaries, factor)
    optimizer = OPTIMIZER_BUILDERS[name](rate, momentum, weight_decay)
    if head_lr_multiplier == 1.0:
        return optimizer
    return learning_rate_multipliers(optimizer, [(_head_layers(model), head_lr_multiplier)])


def _head_layers(model):
    layers = list(getattr(model, "level_heads", [])) + list(getattr(model, "classifiers", []))
    if not layers:
        raise ValueError(
            "head_lr_multiplier != 1 needs a tfdml Embedder / MultiLevelEmbedder (its heads are the "
            f"new layers); got {type(model).__name__}."
        )
    return layers
