"""Keras callback driving the Ranked List Loss temperature schedule (eq. 15) in plain `keras.Model.fit`."""

import keras
import tensorflow as tf


def _losses_with_temperature(loss):
    """The losses among a compiled `model.loss` (object, list or dict) that expose `bind_step`."""
    if loss is None:
        return []
    return [item for item in tf.nest.flatten(loss) if hasattr(item, "bind_step")]


class DynamicTemperature(keras.callbacks.Callback):
    """Binds `RankedListLoss` temperature schedules to the optimizer's step counter and logs `tn`.

    At the start of training each Ranked List Loss of the model (or the ones given in `losses`) reads its
    step from `model.optimizer.iterations`, so a `LinearTemperature` decays as in eq. 15,
    `tn(step) = T1 - step (T1 - T2) / max_steps`. At the end of every epoch the temperature used by the
    epoch's last step is added to the logs (key `log_name`, or `"<loss name>_<log_name>"` when the model has
    several such losses), so it shows up in `History` and in a `keras.callbacks.TensorBoard` listed after
    this callback.

    `tfdml.models.MetricModel` binds the step in `compile`; the callback is then only needed for logging.

    Args:
        losses: the losses to drive; default: those found in `model.loss`.
        log_name: key of the temperature in the epoch logs.

    Example:
        >>> loss = RankedListLoss(tn=LinearTemperature(t1=20.0, t2=5.0, max_steps=10_000))
        >>> model.compile(optimizer="sgd", loss=loss)
        >>> history = model.fit(x, y, epochs=10, callbacks=[DynamicTemperature()])
        >>> history.history["tn"]
    """

    def __init__(self, losses=None, log_name="tn"):
        super().__init__()
        self._given_losses = losses
        self.log_name = log_name
        self._losses = []

    def on_train_begin(self, logs=None):
        given = self._given_losses
        self._losses = _losses_with_temperature(given if given is not None else getattr(self.model, "loss", None))
        if not self._losses:
            raise ValueError(
                "DynamicTemperature found no loss with a temperature (bind_step) among the model's losses; "
                "compile the model with a RankedListLoss or pass losses=[...]."
            )
        step = self.model.optimizer.iterations
        rebound = False
        for loss in self._losses:
            if loss.bound_step is not step:
                loss.bind_step(step)
                rebound = True
        # A train function traced before the binding still holds the old temperature: retrace it.
        if rebound and getattr(self.model, "train_function", None) is not None:
            self.model.make_train_function(force=True)

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        last_step = max(int(self.model.optimizer.iterations.numpy()) - 1, 0)
        for loss in self._losses:
            key = self.log_name if len(self._losses) == 1 else f"{loss.name}_{self.log_name}"
            logs[key] = float(loss.temperature(last_step))
