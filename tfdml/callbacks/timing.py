"""`EpochTimeEstimate`: how long an epoch and the whole run will take, said once, early in the first epoch."""

import time

import keras


def _duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class EpochTimeEstimate(keras.callbacks.Callback):
    """Times `measured_steps` training steps after the first `warmup_steps` (which trace the step function)
    and prints one line: the time a step, an epoch of `steps_per_epoch` steps and the `epochs` left take at
    that pace: "about S s a step: E an epoch of N steps, T for M epochs".

    Args:
      steps_per_epoch: the steps of an epoch.
      epochs: the epochs this run trains (those left when it resumes).
      say: where the line goes (default `print`, on a line of its own).
    """

    def __init__(self, steps_per_epoch, epochs, say=print, warmup_steps=1, measured_steps=3):
        super().__init__()
        self.steps_per_epoch, self.epochs, self.say = int(steps_per_epoch), int(epochs), say
        self.warmup_steps, self.measured_steps = int(warmup_steps), int(measured_steps)
        self._steps, self._started, self.seconds_per_step = 0, None, None

    def on_train_batch_end(self, batch, logs=None):
        if self.seconds_per_step is not None:
            return
        self._steps += 1
        if self._steps == self.warmup_steps:
            self._started = time.perf_counter()
        elif self._steps == self.warmup_steps + self.measured_steps or self._steps == self.steps_per_epoch:
            if self._started is None:
                return  # an epoch too short to measure past its traced first step
            measured = self._steps - self.warmup_steps
            self.seconds_per_step = (time.perf_counter() - self._started) / measured
            epoch = self.seconds_per_step * self.steps_per_epoch
            self.say(
                f"\nabout {self.seconds_per_step:.2g} s a step: {_duration(epoch)} an epoch of "
                f"{self.steps_per_epoch} steps, {_duration(epoch * self.epochs)} for {self.epochs} "
                f"epoch{'s' if self.epochs != 1 else ''}"
            )
