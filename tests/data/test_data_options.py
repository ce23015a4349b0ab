"""The settings declared once as frozen dataclasses: `GlyphRendering` (taken by `glyphs`, `load_images`,
`render_images`), `StreamOptions` (taken by `class_balanced_dataset` and `episode_dataset`) and the declared
temperature of `SupConLoss` / `NTXentLoss`. Callers pass the same keyword names with the same defaults as
before; an unknown keyword is a `TypeError` naming it, a bad value a `ValueError` naming it."""

import dataclasses
import importlib
import inspect

import numpy as np
import pytest

from tfdml import data, losses

glyphs_lib = importlib.import_module("tfdml.data.glyphs")

# The keyword arguments and defaults the functions were written with before their settings were declared once.
GLYPH_DEFAULTS = dict(image_size=32, images_per_class=20, seed=0, max_rotation=12.0, scale=(0.55, 0.95), max_blur=0.8)
STREAM_DEFAULTS = dict(
    image_size=None,
    augment=False,
    preprocess=None,
    seed=None,
    epochs=None,
    drop_small_classes=False,
    parallel_batches=None,
    prefetch=True,
)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDML_CACHE", str(tmp_path / "cache"))


def _defaults(function):
    return {name: p.default for name, p in inspect.signature(function).parameters.items()}


def test_glyph_functions_take_the_rendering_keywords_with_their_former_defaults():
    assert dataclasses.asdict(data.GlyphRendering()) == GLYPH_DEFAULTS
    assert _defaults(data.glyphs) == {"split": "train", "classes": None, "cache": True, **GLYPH_DEFAULTS}


def test_the_cache_key_of_the_declared_settings_is_the_former_one():
    # The key load_images wrote before, from its own dict of the converted arguments: existing caches stay valid.
    former = dict(image_size=32, images_per_class=20, seed=0, max_rotation=12.0, scale=(0.55, 0.95), max_blur=0.8)
    declared = dataclasses.asdict(data.GlyphRendering(image_size=32.0, scale=[0.55, 0.95]))
    assert glyphs_lib._cache_key("AB", declared) == glyphs_lib._cache_key("AB", former)


@pytest.mark.parametrize(
    "function",
    [
        lambda **kw: data.glyphs("test", classes="AB", **kw),
        lambda **kw: glyphs_lib.load_images("AB", **kw),
        lambda **kw: glyphs_lib.render_images("AB", **kw),
    ],
    ids=["glyphs", "load_images", "render_images"],
)
def test_an_unknown_rendering_keyword_is_a_type_error_naming_it(function):
    with pytest.raises(TypeError, match="image_sise"):
        function(image_sise=16)


def test_a_setting_formerly_passed_by_position_is_refused_rather_than_taken_for_another():
    # image_size and the rendering settings used to follow split / classes by position
    with pytest.raises(TypeError, match="positional"):
        data.glyphs("test", 16)
    with pytest.raises(TypeError, match="positional"):
        glyphs_lib.load_images("AB", 16)
    with pytest.raises(TypeError, match="positional"):
        data.class_balanced_dataset(_source(), 2, 2, 4)


@pytest.mark.parametrize(
    "setting, message",
    [
        (dict(image_size=4), "image_size must be at least 8, got 4"),
        (dict(images_per_class=0), "images_per_class must be positive, got 0"),
        (dict(max_rotation=-1.0), "max_rotation must be at least 0 degrees, got -1.0"),
        (dict(scale=(0.9, 0.5)), r"scale must be \(low, high\) with 0 < low <= high <= 1"),
        (dict(scale=(0.0, 0.5)), "scale must be"),
        (dict(scale=(0.5,)), "scale must be"),
        (dict(max_blur=-0.5), "max_blur must be at least 0, got -0.5"),
    ],
)
def test_a_bad_rendering_value_is_a_value_error_naming_it(setting, message):
    with pytest.raises(ValueError, match=message):
        data.GlyphRendering(**setting)
    with pytest.raises(ValueError, match=message):  # before any image is drawn
        data.glyphs("test", classes="AB", **setting)


def test_embedded_source_passes_the_rendering_keywords_and_ignores_other_settings():
    source = data.embedded_source("glyphs", "test", image_size=8, images_per_class=1, classes_per_batch=22)
    assert source.image_shape == (8, 8, 1)
    assert np.bincount(source.labels).max() == 1


def test_stream_functions_take_the_stream_keywords_with_their_former_defaults():
    options = data.StreamOptions()
    assert {f.name: f.default for f in dataclasses.fields(options)} == STREAM_DEFAULTS
    assert options.augment is None and options.image_size is None  # False resolves to no augmentation
    assert data.StreamOptions(image_size=(24, 32), augment=True).image_size == (24, 32)
    balanced = _defaults(data.class_balanced_dataset)
    assert balanced == {
        "source": inspect.Parameter.empty,
        "classes_per_batch": inspect.Parameter.empty,
        "samples_per_class": inspect.Parameter.empty,
        "num_replicas": None,
        **STREAM_DEFAULTS,
    }
    episodes = _defaults(data.episode_dataset)
    assert episodes == {
        "source": inspect.Parameter.empty,
        "train_size": 100,
        "val_size": 20,
        "samples_per_class": 5,
        "train_classes": None,
        "val_classes": None,
        "disjoint_labels": True,
        "val_source": None,
        **STREAM_DEFAULTS,
    }


def _source():
    return data.array_source(np.zeros((24, 4, 4), np.uint8), np.repeat(np.arange(6), 4))


@pytest.mark.parametrize(
    "function",
    [
        lambda **kw: data.class_balanced_dataset(_source(), 2, 2, **kw),
        lambda **kw: data.episode_dataset(_source(), train_size=4, val_size=2, samples_per_class=2, **kw),
    ],
    ids=["class_balanced_dataset", "episode_dataset"],
)
def test_stream_keywords_are_checked_by_name(function):
    with pytest.raises(TypeError, match="parallel_batch"):
        function(parallel_batch=2)
    with pytest.raises(ValueError, match="epochs must be a positive integer, got 0"):
        function(epochs=0)
    with pytest.raises(ValueError, match="parallel_batches must be a positive integer, got 0"):
        function(parallel_batches=0)
    with pytest.raises(TypeError, match="seed must be an int or None"):
        function(seed="0")
    with pytest.raises(TypeError, match="augment must be True, False"):
        function(augment="yes")
    with pytest.raises(ValueError, match="image_size must be a positive int"):
        function(image_size=0)


@pytest.mark.parametrize(
    "cls, default, name", [(losses.SupConLoss, 0.1, "supcon_loss"), (losses.NTXentLoss, 0.07, "ntxent_loss")]
)
def test_temperature_losses_keep_their_defaults_and_check_the_temperature(cls, default, name):
    assert _defaults(cls) == {"temperature": default, "name": name, "kwargs": inspect.Parameter.empty}
    loss = cls(temperature=0.5)
    assert loss.temperature == 0.5 and loss.get_config()["temperature"] == 0.5
    assert cls.from_config(loss.get_config()).temperature == 0.5
    with pytest.raises(ValueError, match=r"temperature must be in \(0, 10000\], got 0"):
        cls(temperature=0)
    with pytest.raises(TypeError, match="temprature"):
        cls(temprature=0.5)


def test_n_pairs_keeps_its_default_and_its_config():
    expected = {"normalize": True, "name": "n_pairs_loss", "kwargs": inspect.Parameter.empty}
    assert _defaults(losses.NPairsLoss) == expected
    loss = losses.NPairsLoss(normalize=False)
    assert loss.normalize is False and losses.NPairsLoss.from_config(loss.get_config()).normalize is False
