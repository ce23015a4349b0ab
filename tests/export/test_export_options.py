"""`export_saved_model`'s keyword settings (tfdml.export.options): each is a field of one of `ServingOptions`,
`IndexOptions` and `SearchOptions`, reaches the group that declares it, and is checked before anything is
built or written."""

import dataclasses
import inspect
import os

import keras
import numpy as np
import pytest

from tfdml import export as E
from tfdml.export.options import split_options


def _model():
    inputs = keras.Input((8, 8, 3))
    return keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Flatten()(inputs)), name="tiny")


def test_every_setting_reaches_the_one_group_that_declares_it():
    groups = (E.ServingOptions, E.IndexOptions, E.SearchOptions)
    names = [field.name for group in groups for field in dataclasses.fields(group)]
    assert len(names) == len(set(names)), "a setting declared in two groups"
    explicit = set(inspect.signature(E.export_saved_model).parameters)
    assert not explicit & set(names), "a setting that is both a parameter and a group field"
    serving, index, _ = split_options({"image_size": (5, 6), "resize": 7, "index_mode": "exact"})
    assert (serving.image_size, serving.resize, index.index_mode) == ((5, 6), 7, "exact")
    search = split_options({"top_k": 3, "match_mode": "closed", "search_dims": 4})[2]
    assert (search.top_k, search.match_mode, search.search_dims) == (3, "closed", 4)
    assert split_options({}) == (E.ServingOptions(), E.IndexOptions(), E.SearchOptions())


def test_an_unknown_setting_is_a_type_error_that_names_it(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword arguments: gallery_dtypes, topk"):
        E.export_saved_model(_model(), tmp_path, topk=3, gallery_dtypes="int8")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"top_k": True}, "top_k must be a positive integer"),
        ({"search_block_rows": 0}, "search_block_rows must be at least 1"),
        ({"match_mode": "half"}, "match_mode must be one of"),
        ({"query_expansion": -1}, "query_expansion"),
        ({"database_augmentation": 2, "expansion_alpha": float("nan")}, "expansion_alpha"),
    ],
)
def test_search_settings_are_checked_before_anything_is_written(tmp_path, bad, message):
    with pytest.raises(ValueError, match=message):
        E.SearchOptions(**bad)
    with pytest.raises(ValueError, match=message):
        E.export_saved_model(_model(), tmp_path, name="bad", **bad)
    assert not os.path.exists(tmp_path / "bad")


def test_checked_values_are_the_ones_kept():
    options = E.SearchOptions(query_expansion=np.int64(2), database_augmentation=np.int64(1), expansion_alpha=3)
    assert (options.query_expansion, options.database_augmentation, options.expansion_alpha) == (2, 1, 3.0)
    assert type(options.query_expansion) is int and type(options.expansion_alpha) is float
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.top_k = 5
