"""A loss's arguments are declared once (`tfdml.losses.arguments`): changing a default or a range in the
declaration changes `__init__`, `get_config`, the pure functions' defaults, the configuration's defaults and its
range messages, and the losses guide's table of arguments."""

import dataclasses
import inspect
import os
import sys

import numpy as np
import pytest

from tests import ROOT
from tfdml import losses
from tfdml.config import ConfigError, load_config
from tfdml.loss_names import LOSSES
from tfdml.losses.arguments import DECLARED, REQUIRED, Argument, declared
from tfdml.losses.base import MetricLoss
from tfdml.losses.ranked_list import ranked_list_weights
from tfdml.ops import pairwise_distance

sys.path.insert(0, os.path.join(ROOT, "docs"))

import hooks  # noqa: E402  (docs/hooks.py: the losses guide's generated table)

# Every loss the configuration names (`loss.name`).
CLASSES = [getattr(losses, class_name) for class_name in LOSSES.values()]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_signature_and_config_follow_the_declaration(cls):
    assert vars(cls).get("_declared"), f"{cls.__name__} writes its __init__ by hand instead of declaring ARGUMENTS"
    parameters = inspect.signature(cls).parameters
    loss = cls(**_required(cls))
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


def _required(cls):
    """Values for the arguments a class declares without a default (`num_classes`, `embedding_dim`)."""
    return {a.name: 5 for a in cls.ARGUMENTS if a.default is REQUIRED}


def _pure_functions():
    """`(function, its class)` of every function of `tfdml.losses` whose defaults come from a declaration."""
    found = []
    for module_name in sorted(m for m in sys.modules if m.startswith("tfdml.losses.")):
        module = sys.modules[module_name]
        for value in vars(module).values():
            if inspect.isfunction(value) and value.__module__ == module_name and hasattr(value, "defaults_from"):
                found.append((value, getattr(module, value.defaults_from)))
    return found


def test_the_pure_functions_restate_no_declared_default():
    functions = _pure_functions()
    names = {function.__name__ for function, _ in functions}
    assert {"ranked_list_loss", "ranked_list_weights", "multi_similarity_loss", "proxy_anchor_loss"} <= names
    for function, cls in functions:
        declared_names = {a.name for a in cls.ARGUMENTS}
        parameters = inspect.signature(function).parameters
        from_declaration = {name for name, p in parameters.items() if p.default is DECLARED}
        assert from_declaration and from_declaration <= declared_names, function.__name__
        restated = {
            name
            for name, p in parameters.items()
            if name in declared_names and p.default is not DECLARED and p.default is not inspect.Parameter.empty
        }
        assert not restated, f"{function.__name__} restates the defaults of {sorted(restated)}"


def test_one_changed_default_reaches_the_class_the_function_the_configuration_and_the_guide(monkeypatch):
    declaration = {a.name: a for a in losses.RankedListLoss.ARGUMENTS}
    changed = dataclasses.replace(declaration["tn"], default=12.0, maximum=15.0)
    monkeypatch.setattr(
        losses.RankedListLoss, "ARGUMENTS", tuple(changed if a.name == "tn" else a for a in declaration.values())
    )
    # the class: its signature, the value it keeps, its config
    assert inspect.signature(losses.RankedListLoss).parameters["tn"].default == 12.0
    loss = losses.RankedListLoss()
    assert loss.tn == 12.0 and loss.get_config()["tn"] == 12.0
    with pytest.raises(ValueError, match=r"RankedListLoss: tn must be in \[0, 15\], got 20"):
        losses.RankedListLoss(tn=20.0)
    # the pure functions: called without tn, they use 12
    labels = np.array([0, 0, 1, 1, 2, 2])
    x = np.random.default_rng(0).normal(size=(6, 4)).astype("float32")
    value = float(losses.ranked_list_loss(labels, x))
    assert value == float(losses.ranked_list_loss(labels, x, tn=12.0)) == float(loss(labels, x))
    assert value != float(losses.ranked_list_loss(labels, x, tn=10.0))
    distances = pairwise_distance(x)
    weights = ranked_list_weights(labels, distances)[1].numpy()
    np.testing.assert_array_equal(weights, ranked_list_weights(labels, distances, tn=12.0)[1].numpy())
    # the configuration's check: the declared range
    assert load_config(overrides=["loss.params.tn=15"]).loss.params["tn"] == 15.0
    with pytest.raises(ConfigError, match=r"^loss.params.tn: must be a number in \[0, 15\], got 20.0$"):
        load_config(overrides=["loss.params.tn=20"])
    # the losses guide's table of arguments, generated from the declarations
    assert (
        "|  | `tn` | `12.0` | `[0, 15]` | negative temperature, or a LinearTemperature |"
        in hooks.loss_arguments_table()
    )


def test_the_configuration_refuses_what_the_loss_refuses():
    """Multi-Similarity's scales must be > 0: `alpha: 0` fails when the configuration is checked, with the
    range the loss states, not when the loss is built."""
    with pytest.raises(ValueError, match=r"MultiSimilarityLoss: alpha must be in \(0, 10000\], got 0"):
        losses.MultiSimilarityLoss(alpha=0)
    with pytest.raises(ConfigError, match=r"^loss.params.alpha: must be a number in \(0, 10000\], got 0.0$"):
        load_config(overrides=["loss.name=multi_similarity", "loss.params.alpha=0"])


def test_the_guide_shows_the_generated_table_of_arguments():
    with open(os.path.join(ROOT, "docs", "guides", "losses.md")) as f:
        guide = f.read()
    assert "\n<!-- generated: loss_arguments -->\n" in guide
    table = hooks.loss_arguments_table()
    for name, class_name in LOSSES.items():
        assert f"| `{name}`: `{class_name}` |" in table


def test_a_subclass_with_its_own_init_keeps_its_signature_and_hyper_parameters():
    class Wider(losses.ContrastiveLoss):
        def __init__(self, width=2.0, **kwargs):
            super().__init__(neg_margin=width, **kwargs)

    assert list(inspect.signature(Wider).parameters) == ["width", "kwargs"]
    assert Wider().neg_margin == 2.0

    class Scaled(losses.ProxyLoss):
        """A proxy loss written the way `ProxyLoss` describes for an undeclared subclass."""

        loss_fn = staticmethod(lambda labels, embeddings, proxies, scale: scale)

        def __init__(self, num_classes, embedding_dim, scale=2.0, **kwargs):
            super().__init__(num_classes, embedding_dim, **kwargs)
            self.scale = scale

        def hyper_parameters(self):
            return {"scale": self.scale}

    assert list(inspect.signature(Scaled).parameters) == ["num_classes", "embedding_dim", "scale", "kwargs"]
    config = Scaled(3, 4, name="scaled").get_config()
    assert (config["num_classes"], config["embedding_dim"], config["scale"]) == (3, 4, 2.0)
