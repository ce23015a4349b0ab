"""DML-ALA's switches are declared once (`tfdml.ala_options.ALAOptions`): a default changed there is the default
of `ALAModel`, of its `get_config`, of the configuration's `ala.params` and of `tfdml train --print-config`."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tfdml import ala_options
from tfdml.config import ALAParams, ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a copy of the package whose ALAOptions declares assessor_steps=5 (3 in the real one).
PROBE = """
import contextlib, io, json, keras, yaml
from tfdml import cli
from tfdml.config import default_config
from tfdml.models import ALAModel

embedder = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3), keras.layers.UnitNormalization()])
model = ALAModel(embedder, base_loss="contrastive")
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    assert cli.main(["train", "--print-config"]) == 0
print(json.dumps({
    "model": model.options.assessor_steps,
    "get_config": model.get_config()["assessor_steps"],
    "config": default_config().ala.params.assessor_steps,
    "print_config": yaml.safe_load(printed.getvalue())["ala"]["params"]["assessor_steps"],
}))
"""


@pytest.mark.slow
def test_a_default_changed_in_its_declaration_is_seen_everywhere(tmp_path):
    shutil.copytree(os.path.join(ROOT, "tfdml"), tmp_path / "tfdml", ignore=shutil.ignore_patterns("__pycache__"))
    declaration = tmp_path / "tfdml" / "ala_options.py"
    source = declaration.read_text()
    line = "    assessor_steps: int | None = _option(3, minimum=0)"
    assert source.count(line) == 1
    declaration.write_text(source.replace(line, line.replace("_option(3,", "_option(5,")))
    environment = dict(os.environ, PYTHONPATH=str(tmp_path), CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"model": 5, "get_config": 5, "config": 5, "print_config": 5}


def test_the_configuration_section_is_the_declaration():
    declared = {f.name: f.default for f in ala_options.dataclasses.fields(ala_options.ALAOptions)}
    assert {f.name: f.default for f in ala_options.dataclasses.fields(ALAParams)} == declared
    assert load_config().ala.params.to_dict() == declared
    # the measured bound: the default variant's softmax weights are bounded at 1, the paper's are not
    assert ala_options.ALAOptions().resolved().weight_range == 1.0
    assert ala_options.ALAOptions(variant="paper", weights="softmax").resolved().weight_range is None


@pytest.mark.parametrize(
    "switches, message",
    [
        ({"weights": "relu"}, "weights must be one of ['softmax', 'sigmoid'], got 'relu'."),
        ({"temperature": 0.0}, "temperature must be > 0, got 0.0."),
        ({"weights": "sigmoid", "weight_range": 2.0}, 'weight_range must be > 0 and needs weights="softmax", got 2.0.'),
        ({"inner_learning_rate": 0.1, "lookahead": "optimizer"}, "inner_learning_rate sets the rate of an SGD"),
        ({"meta_interval": 0}, "meta_interval must be >= 1, got 0."),
        ({"lookahead_variables": "body"}, "lookahead_variables must be one of ['all', 'head'], got 'body'."),
        ({"output_penalty": -0.5}, "output_penalty must be >= 0, got -0.5."),
    ],
)
def test_bad_switches_are_named(switches, message):
    with pytest.raises(ValueError) as error:
        ala_options.ALAOptions(**switches).resolved()
    assert str(error.value).startswith(message)


def test_a_switch_set_in_the_configuration_reaches_the_model_arguments():
    """`ala.params.lookahead_variables: head` is what `tfdml train` passes to `ALAModel`; a bad value is named."""
    params = load_config(overrides=["ala.params.lookahead_variables=head"]).ala.params
    assert params.lookahead_variables == "head" and params.arguments() == {"lookahead_variables": "head"}
    assert ALAParams.from_dict(params.to_dict()) == params
    with pytest.raises(ConfigError, match="lookahead_variables: must be one of all, head, got 'body'"):
        load_config(overrides=["ala.params.lookahead_variables=body"])


def test_the_configurations_validation_loss_reaches_the_jobs_model():
    """`ala.validation_loss` and its arguments are what the job's `ALAModel` scores the look-ahead with; unset,
    the base loss."""
    from tfdml.losses import ContrastiveLoss
    from tfdml.pipeline.train import build_model

    job = ["ala.enabled=true", "loss.name=contrastive", "model.widths=[4,8]"]
    config = load_config(
        overrides=[*job, "ala.validation_loss=contrastive", "ala.validation_loss_params.neg_margin=1.4"]
    )
    model, _ = build_model(config, (32, 32, 1), total_steps=10)
    assert isinstance(model.validation_loss, ContrastiveLoss) and model.validation_loss is not model.base_loss
    assert model.validation_loss.get_config()["neg_margin"] == 1.4 != model.base_loss.get_config()["neg_margin"]
    model, _ = build_model(load_config(overrides=job), (32, 32, 1), total_steps=10)
    assert model.validation_loss is model.base_loss


ALA = ["ala.enabled=true", "loss.name=contrastive"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["loss.name=contrastive", "ala.validation_loss=contrastive"], "ala.validation_loss: applies with ala.enabled"),
        ([*ALA, "ala.validation_loss_params.neg_margin=1.4"], "ala.validation_loss_params: sets the arguments of"),
        ([*ALA, "ala.validation_loss=ranked_list"], "ala.validation_loss: must be one of triplet, margin, contrastive"),
        ([*ALA, "ala.validation_loss=contrastive", "ala.validation_loss_params.beta=1"], "unknown configuration key"),
        ([*ALA, "ala.validation_loss=contrastive", "ala.validation_loss_params.neg_margin=big"], "expected a number"),
        ([*ALA, "ala.validation_loss=margin"], "ala.validation_loss_params: validation_loss MarginLoss has trainable"),
    ],
)
def test_a_bad_validation_loss_is_named(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(overrides=overrides)
    assert message in str(error.value)
