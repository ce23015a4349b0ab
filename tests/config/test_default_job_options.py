"""Options added for the embedded jobs (glyphs, digits): small-CNN widths, an `Augment` mapping for `data.augment`, and
loss parameters that reset when the loss changes."""

import os

import numpy as np
import pytest

from tests import ROOT
from tfdml import data as data_lib
from tfdml import pipeline, recipes
from tfdml.config import load_config
from tfdml.models import MultiLevelEmbedder

CONFIG_DIR = os.path.join(ROOT, "configs")


def _conv_widths(model):
    return [layer.filters for layer in model.backbone.layers if layer.name.endswith("_conv")]


def test_small_cnn_widths_reach_the_backbone_and_round_trip():
    section = {"backbone": "small_cnn", "embedding_dim": 4, "head_filters": 4, "head_units": 8, "widths": [4, 6, 10]}
    model = recipes.make_embedder(section, (16, 16, 1))
    assert _conv_widths(model) == [4, 6, 10]
    assert model.preprocessing == "unit"  # still recognised as the small CNN
    restored = MultiLevelEmbedder.from_config(model.get_config())
    restored.set_weights(model.get_weights())
    assert _conv_widths(restored) == [4, 6, 10]
    images = np.random.default_rng(0).uniform(size=(3, 16, 16, 1)).astype("float32")
    np.testing.assert_allclose(np.asarray(restored(images)), np.asarray(model(images)), atol=1e-6)


def test_default_widths_without_the_option():
    model = recipes.make_embedder(
        {"backbone": "small_cnn", "embedding_dim": 4, "head_filters": 4, "head_units": 8}, (16, 16, 1)
    )
    assert _conv_widths(model) == [8, 16, 32]


def test_augment_mapping_becomes_an_augment():
    augment = pipeline.augment_setting({"flip": False, "scale": [0.7, 1.0]})
    assert augment == data_lib.Augment(flip=False, scale=(0.7, 1.0))
    assert pipeline.augment_setting(True) is True and pipeline.augment_setting(False) is False
    with pytest.raises(ValueError, match=r"unknown configuration key 'data.augment.flips'"):
        pipeline.augment_setting({"flips": False})
    with pytest.raises(ValueError, match="scale"):
        pipeline.augment_setting({"scale": [0.0, 1.0]})


def test_job_augment_settings():
    assert load_config().data.augment is False  # the glyph images already vary: whole images
    augment = load_config(os.path.join(CONFIG_DIR, "digits_rll.yaml")).data.augment
    assert augment == data_lib.Augment(flip=False, scale=(0.7, 1.0))


def test_loss_params_reset_when_the_loss_changes():
    default = load_config().loss.params
    assert default == {"margin": 0.4, "alpha": 1.0, "tn": 10.0, "query_weighting": "uniform"}
    assert load_config(overrides=["loss.name=triplet"]).loss.params == {}
    assert load_config(overrides=["loss.name=triplet", "loss.params.margin=0.2"]).loss.params == {"margin": 0.2}
    # Same loss: a single parameter is merged into the defaults.
    assert load_config(overrides=["loss.params.margin=0.5"]).loss.params == {
        "margin": 0.5,
        "alpha": 1.0,
        "tn": 10.0,
        "query_weighting": "uniform",
    }
    # A configuration file for another loss sees none of the default job's RLL parameters.
    margin = load_config(os.path.join(CONFIG_DIR, "margin_cub.yaml")).loss.params
    assert "margin" not in margin and margin["alpha"] == 0.2
    pipeline.build_loss(load_config(overrides=["loss.name=triplet"]).loss)  # accepted by TripletLoss
