"""Every tfdml loss by its configuration name in `compile`, as Keras' own losses: `loss="ranked_list"`."""

import inspect

import keras
import numpy as np
import pytest

from tfdml import losses
from tfdml.loss_names import LOSSES
from tfdml.models import Embedder, MetricModel


def _required(cls):
    return [
        n
        for n, p in inspect.signature(cls).parameters.items()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_name_gives_its_class(name):
    cls = getattr(losses, LOSSES[name])
    if _required(cls):  # e.g. group: num_classes; the proxy losses: num_classes and embedding_dim
        with pytest.raises(
            ValueError,
            match=rf"loss '{name}' needs arguments \({', '.join(_required(cls))}\): "
            rf"pass tfdml.losses.{cls.__name__}\(",
        ):
            losses.get(name)
        return
    loss = losses.get(name)
    assert type(loss) is cls and loss.get_config() == cls().get_config()
    if name != "circle":  # Keras has its own "circle": a plain keras.Model keeps it
        assert type(keras.losses.get(name)) is cls


def _data():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 3)
    return (rng.random((12, 6)) + labels[:, None]).astype("float32"), labels


def test_plain_keras_model_compiles_with_a_name():
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.UnitNormalization()(keras.layers.Dense(4)(inputs)))
    model.compile("adam", loss="ranked_list")
    x, y = _data()
    assert np.isfinite(model.fit(x, y, batch_size=12, epochs=1, verbose=0).history["loss"][0])
    assert type(keras.losses.get("circle")) is not losses.CircleLoss  # Keras' own name is left alone


def test_tfdml_model_builds_named_losses_and_tracks_their_variables():
    inputs = keras.Input((6,))
    model = MetricModel(inputs, keras.layers.UnitNormalization()(keras.layers.Dense(4)(inputs)))
    before = len(model.trainable_variables)
    model.compile("adam", loss="margin")
    assert isinstance(model.loss, losses.MarginLoss)
    assert len(model.trainable_variables) == before + 1  # beta, trained by its own optimizer
    x, y = _data()
    beta = model.loss.beta.numpy().copy()
    model.fit(x, y, batch_size=12, epochs=2, verbose=0)
    assert not np.allclose(model.loss.beta.numpy(), beta)
    embedder = Embedder("small_cnn", embedding_dim=4, input_shape=(8, 8, 1))
    embedder.compile("adam", loss="circle")  # the configuration's meaning: tfdml's CircleLoss
    assert isinstance(embedder.loss, losses.CircleLoss)
    with pytest.raises(ValueError, match="loss 'group' needs arguments"):
        embedder.compile("adam", loss="group")
