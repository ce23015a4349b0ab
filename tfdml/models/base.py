"""`MetricModel`: the `keras.Model` base class of every tfdml embedder.

It changes `compile` (and, in `fit`, the default `shuffle` for a `tf.data.Dataset`, which Keras cannot
shuffle: tfdml's datasets come shuffled, and Keras' default `shuffle=True` only warns that it is ignored; an
endless dataset without `steps_per_epoch` is a `ValueError` at once, where Keras would wait for the end of
the first epoch forever), so the stock `train_step`, `fit`, `evaluate`, `model.save` and distribution
support are untouched:

- losses that own variables (`loss.trainable_variables`, e.g. the margin loss' learnable `beta`) have them
  tracked by the model, so they appear in `model.trainable_variables`, receive gradients in the default
  `train_step` and are saved by `model.save` / checkpoints. When the loss names a `variable_optimizer`, those
  variables are trained by it (through `tfdml.optimizers.MultiOptimizer`), not by the model's optimizer;
- losses with a `bind_step(step)` method (e.g. `RankedListLoss` with a temperature schedule) are bound to
  `optimizer.iterations`;
- losses with state that only training steps update (the queue of `CrossBatchMemory`) have their
  `non_trainable_variables` tracked (saved, checkpointed) and are told through `loss.training` whether a
  step trains, so `evaluate` leaves that state alone.
- tfdml losses given by their short name (`loss="ranked_list"`, the configuration's names) are built first
  (`tfdml.losses.get`), so that the two points above apply to them too.

`get_compile_config` stores the optimizer the user passed, so `keras.saving.load_model` recompiles the same
way (and restores the losses' variables and every inner optimizer's state).
"""

import inspect

import keras
import tensorflow as tf

from tfdml.keras_private import Functional, Trainer, functional_init_arguments
from tfdml.loss_names import LOSSES
from tfdml.losses.aliases import get as get_loss
from tfdml.optimizers import MultiOptimizer


def _resolve_names(loss):
    """Builds the tfdml losses named by string in `loss` (a loss or a structure of losses)."""
    return keras.tree.map_structure(
        lambda item: get_loss(item) if isinstance(item, str) and item in LOSSES else item, loss
    )


def _flat_losses(loss):
    if loss is None:
        return []
    return [item for item in keras.tree.flatten(loss) if isinstance(item, keras.losses.Loss)]


def _check_epoch_length(dataset, args, kwargs):
    """A `ValueError` for an endless dataset (e.g. `tfdml.data.class_balanced_dataset`) given to `fit` without
    `steps_per_epoch`: Keras would wait for its first epoch to end, forever and without a word."""
    steps = inspect.signature(keras.Model.fit).bind(None, None, None, *args, **kwargs).arguments.get("steps_per_epoch")
    if steps is None and int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        raise ValueError(
            "fit: the dataset never ends (e.g. tfdml.data.class_balanced_dataset without epochs), so an epoch "
            "needs steps_per_epoch=N batches; tfdml.data.steps_per_epoch(source, classes_per_batch) is one pass "
            "over the classes"
        )


@keras.saving.register_keras_serializable(package="tfdml")
class MetricModel(keras.Model):
    """A `keras.Model` (functional or subclassed) whose `compile` understands tfdml losses.

    Example:
        >>> inputs = keras.Input((64,))
        >>> embeddings = keras.layers.UnitNormalization()(keras.layers.Dense(32)(inputs))
        >>> model = MetricModel(inputs, embeddings)
        >>> model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=tfdml.losses.MarginLoss())
        >>> model.fit(class_balanced_dataset, steps_per_epoch=100)   # beta trained by its own SGD(0.1, 0.9)
    """

    def __new__(cls, *args, **kwargs):
        # Functional use, `MetricModel(inputs, outputs)`: left to Keras, it would rewrite MetricModel's own
        # bases to `Functional` for good (`inject_functional_model_class`), and every subclassed tfdml
        # embedder created afterwards would fail. A dedicated functional subclass leaves MetricModel intact.
        if cls is MetricModel and functional_init_arguments(args, kwargs):
            return keras.Model.__new__(FunctionalMetricModel)
        return super().__new__(cls, *args, **kwargs)

    def compile(self, optimizer="rmsprop", loss=None, **kwargs):
        optimizer = keras.optimizers.get(optimizer)
        loss = _resolve_names(loss)
        losses = _flat_losses(loss)
        routes, loss_variables = [], []
        for item in losses:
            variables = list(getattr(item, "trainable_variables", None) or [])
            loss_variables.extend(variables)
            loss_variables.extend(getattr(item, "non_trainable_variables", None) or [])
            variable_optimizer = getattr(item, "variable_optimizer", None)
            if variables and variable_optimizer is not None:
                routes.append((variable_optimizer, variables))
        self._track_loss_variables(loss_variables)
        training_optimizer = optimizer
        if routes:
            if isinstance(optimizer, MultiOptimizer):
                training_optimizer = optimizer.with_routes(routes)
            else:
                training_optimizer = MultiOptimizer(routes, default=optimizer)
        super().compile(optimizer=training_optimizer, loss=loss, **kwargs)
        # Serialise what the user passed: recompiling from it re-creates the routing.
        self._compile_config.config["optimizer"] = optimizer
        for item in losses:
            if hasattr(item, "bind_step"):
                item.bind_step(self.optimizer.iterations)

    def fit(self, x=None, y=None, *args, **kwargs):
        if isinstance(x, tf.data.Dataset):
            _check_epoch_length(x, args, kwargs)
            kwargs.setdefault("shuffle", False)  # a dataset is shuffled by its own pipeline, never by fit
        self._build_optimizer()
        return super().fit(x, y, *args, **kwargs)

    def _build_optimizer(self):
        """Builds the optimizer of a built model before fit traces its train step, as Keras does under a
        distribution strategy: without one, Keras creates the optimizer's variables inside the first trace,
        and a function that creates variables is traced twice."""
        optimizer = getattr(self, "optimizer", None)
        if optimizer is None or optimizer.built or self._distribute_strategy is not None:
            return
        if all(layer.built for layer in self._flatten_layers()):
            optimizer.build(self.trainable_variables)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        self._tell_losses_whether_training(training)
        return super().compute_loss(x, y, y_pred, sample_weight, training=training)

    def _tell_losses_whether_training(self, training):
        """Sets `loss.training` on the losses that have it; read while the train / test function is traced,
        so that a test step does not update the losses' state (the cross-batch memory's queue)."""
        for item in _flat_losses(getattr(self, "loss", None)):
            if hasattr(item, "training"):
                item.training = bool(training)

    def compile_from_config(self, config):
        # keras skips compile_from_config for models that override compile; ours is safe to replay.
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def _track_loss_variables(self, variables):
        """Makes the current losses' variables part of this model's own state (the model may already be
        built, hence the unlock) and drops those of losses from an earlier compile."""
        previous = getattr(self, "_loss_variables", [])
        keep = {id(v) for v in variables}
        was_locked = self._tracker.locked
        self._tracker.unlock()
        try:
            for variable in previous:
                if id(variable) not in keep:
                    self._tracker.untrack(variable)
            tracked = {id(v) for v in self._trainable_variables + self._non_trainable_variables}
            for variable in variables:
                if id(variable) not in tracked:
                    self._track_variable(variable)
        finally:
            if was_locked:
                self._tracker.lock()
        # A plain list on purpose: Keras would otherwise track the attribute as state.
        object.__setattr__(self, "_loss_variables", list(variables))


@keras.saving.register_keras_serializable(package="tfdml")
class FunctionalMetricModel(MetricModel, Functional):
    """What `MetricModel(inputs, outputs)` builds: a functional model with `MetricModel.compile`."""

    def __init__(self, inputs, outputs, *args, **kwargs):
        # What keras.Model.__init__ does for a subclass called with functional arguments.
        Trainer.__init__(self)
        Functional.__init__(self, inputs, outputs, *args, **kwargs)
