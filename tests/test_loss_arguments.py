"""A loss's arguments are declared once (`tfdml.losses.arguments`): changing a default or a range in the
declaration changes `__init__`, `get_config`, the configuration's defaults and its range messages."""

import dataclasses
import inspect

import pytest

from tfdml import losses
from tfdml.config import ConfigError, load_config
from tfdml.losses.arguments import REQUIRED, Argument, declared
from tfdml.losses.base import MetricLoss

DECLARED = [losses.ContrastiveLoss, losses.TripletLoss, losses.MarginLoss, losses.RankedListLoss, losses.GroupLoss]


@pytest.mark.parametrize("cls", DECLARED)
def test_signature_and_config_follow_the_declaration(cls):
    parameters = inspect.signature(cls).parameters
    loss = cls(num_classes=5) if cls is losses.GroupLoss else cls()
    for argument in cls.ARGUMENTS:
        assert parameters[argument.name].default == argument.default
        if argument.default is not REQUIRED:
            assert loss.get_config()[argument.name] == argument.default
    assert cls.from_config(loss.get_config()).get_config() == loss.get_config()


def test_changed_default_and_range_reach_get_config_and_the_configuration(monkeypatch):
    declaration = list(losses.ContrastiveLoss.ARGUMENTS)
    declaration[1] = dataclasses.replace(declaration[1], default=0.7, maximum=2.5)

    @declared
    class Changed(MetricLoss):
        DEFAULT_NAME = "changed"
        ARGUMENTS = tuple(declaration)

    assert Changed().get_config()["neg_margin"] == 0.7
    with pytest.raises(ValueError, match=r"Changed: neg_margin must be in \[0, 2.5\], got 3.0"):
        Changed(neg_margin=3.0)
    monkeypatch.setattr(losses, "ContrastiveLoss", Changed)
    config = load_config(overrides=["loss.name=contrastive"])
    assert inspect.signature(losses.ContrastiveLoss).parameters["neg_margin"].default == 0.7
    config.loss.check_with_library("loss")  # the default passes its own range
    with pytest.raises(ConfigError, match=r"loss.params.neg_margin: must be a number in \[0, 2.5\], got 3.0"):
        load_config(overrides=["loss.name=contrastive", "loss.params.neg_margin=3.0"]).loss.check_with_library("loss")


def test_an_argument_states_its_range_and_choices():
    margin = Argument("margin", 0.2, "the margin", minimum=0.0, maximum=4.0)
    assert margin.convert(1, "Loss") == 1.0 and isinstance(margin.convert(1, "Loss"), float)
    with pytest.raises(ValueError, match=r"Loss: margin must be in \[0, 4\], got 5"):
        margin.convert(5, "Loss")
    mining = Argument("mining", "all", "which tuples", choices=("all", "hard"))
    with pytest.raises(ValueError, match=r"Loss: mining must be one of \('all', 'hard'\), got 'x'"):
        mining.convert("x", "Loss")
    assert Argument("scale", 1.0, "a scale", above=0.0).range_text() == "(0, inf]"
