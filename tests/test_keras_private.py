"""The private Keras names of `tfdml.keras_private` still exist and behave as tfdml relies on: a Keras release
that moves or changes them fails here, by name."""

import inspect

import keras

from tfdml import keras_private
from tfdml.models import MetricModel


def test_functional_is_the_class_of_functional_models():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    assert isinstance(model, keras_private.Functional)
    assert issubclass(keras_private.Functional, keras.Model)


def test_trainer_init_takes_no_arguments_and_is_a_base_of_model():
    assert keras_private.Trainer in keras.Model.__mro__
    assert list(inspect.signature(keras_private.Trainer.__init__).parameters) == ["self"]


def test_functional_init_arguments_tells_functional_from_subclassed_calls():
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(2)(inputs)
    assert keras_private.functional_init_arguments((inputs, outputs), {})
    assert keras_private.functional_init_arguments((), {"inputs": inputs, "outputs": outputs})
    assert not keras_private.functional_init_arguments((), {"name": "model"})


def test_metric_model_builds_both_ways_without_rewriting_its_bases():
    inputs = keras.Input((3,))
    functional = MetricModel(inputs, keras.layers.Dense(2)(inputs))
    assert isinstance(functional, keras_private.Functional)
    assert keras_private.Functional not in MetricModel.__mro__


def test_loss_names_table_is_where_keras_losses_get_looks_strings_up():
    table = keras_private.LOSS_NAMES_TABLE
    assert table["MeanSquaredError"] is keras.losses.MeanSquaredError
    table["tfdml_probe_loss"] = keras.losses.Huber
    try:
        assert isinstance(keras.losses.get("tfdml_probe_loss"), keras.losses.Huber)
    finally:
        del table["tfdml_probe_loss"]
