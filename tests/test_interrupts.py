"""tfdml.interrupts: a stop during training is held until the loop is between steps, never raised inside
TensorFlow's own code (where an exception from a signal handler can crash the process instead of stopping it)."""

import signal

import keras
import numpy as np
import pytest

from tfdml import interrupts
from tfdml.pipeline.evaluate import stoppable_batches
from tfdml.pipeline.train import StopBetweenSteps


@pytest.fixture
def installed():
    interrupts.install()
    yield
    interrupts.uninstall()


def test_a_stop_outside_training_raises_at_once(installed):
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGTERM)
    assert interrupts.received() == signal.SIGTERM


def test_a_stop_in_training_waits_for_the_next_stop_point(installed):
    reached = []
    with pytest.raises(KeyboardInterrupt), interrupts.between_steps():
        signal.raise_signal(signal.SIGINT)
        reached.append("after the signal")  # the step in progress goes on
        interrupts.stop_point()
        reached.append("after the stop point")
    assert reached == ["after the signal"]
    assert interrupts.received() == signal.SIGINT


def test_a_held_stop_is_raised_when_training_ends(installed):
    with pytest.raises(KeyboardInterrupt), interrupts.between_steps():
        signal.raise_signal(signal.SIGTERM)
    interrupts.stop_point()  # nothing is left held for later


def test_a_second_stop_raises_at_once(installed):
    reached = []
    with pytest.raises(KeyboardInterrupt), interrupts.between_steps():
        signal.raise_signal(signal.SIGINT)
        reached.append("after the first")
        signal.raise_signal(signal.SIGINT)
        reached.append("after the second")
    assert reached == ["after the first"]
    interrupts.stop_point()


def test_a_held_stop_gives_way_to_an_error_and_is_not_raised_later(installed):
    with pytest.raises(ValueError, match="the step failed"), interrupts.between_steps():
        signal.raise_signal(signal.SIGINT)
        raise ValueError("the step failed")
    interrupts.stop_point()


def test_blocks_nest_and_the_outer_one_goes_on_holding(installed):
    reached = []
    with pytest.raises(KeyboardInterrupt), interrupts.between_steps():
        with interrupts.between_steps():
            reached.append("inner")
        signal.raise_signal(signal.SIGINT)
        reached.append("held after the inner block")
        interrupts.stop_point()
        reached.append("after the stop point")
    assert reached == ["inner", "held after the inner block"]


def test_a_stop_while_the_job_embeds_waits_for_the_next_batch(installed):
    """The job's evaluation reads its batches through `stoppable_batches`: a stop while one batch is embedded (inside
    TensorFlow) is raised before the next one is read."""
    seen = []
    with pytest.raises(KeyboardInterrupt), interrupts.between_steps():
        for batch in stoppable_batches(range(3)):
            seen.append(batch)
            signal.raise_signal(signal.SIGINT)
            seen.append(f"{batch} embedded")
    assert seen == [0, "0 embedded"]


class _Record(keras.callbacks.Callback):
    """Sends SIGINT from `on_train_batch_end` of one step (as a signal arriving at any point of that step's
    callbacks) and records which hooks ran."""

    def __init__(self, stop_at):
        super().__init__()
        self.stop_at, self.events = stop_at, []

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.stop_at:
            signal.raise_signal(signal.SIGINT)
        self.events.append(("end", batch))

    def on_train_batch_begin(self, batch, logs=None):
        self.events.append(("begin", batch))


def test_fit_stops_before_the_step_after_the_signal(installed):
    """The step in which Ctrl-C arrived finishes with all its callbacks; the next step does not start."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((8, 3), "float32"), np.zeros((8, 2), "float32")
    record = _Record(stop_at=1)
    with pytest.raises(KeyboardInterrupt), interrupts.between_steps():
        model.fit(x, y, batch_size=2, epochs=1, callbacks=[StopBetweenSteps(), record], verbose=0)
    assert record.events == [("begin", 0), ("end", 0), ("begin", 1), ("end", 1)]
    assert int(model.optimizer.iterations.numpy()) == 2
