"""The typed configuration: every bad value is one `ConfigError` line naming the key and what is allowed
(checked before anything is built), YAML round trips, and the options other parts of tfdml rely on."""

import gc
import glob
import inspect
import os
import warnings

import pytest
import yaml

from tests import ROOT
from tfdml import config as config_lib
from tfdml.config import Config, ConfigError, folders, load_config

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))

BAD = [
    (
        ["loss.params.margn=0.1"],
        "unknown configuration key 'loss.params.margn' (did you mean 'margin'?); valid keys here: alpha, distance, "
        "lam, margin, query_weighting, stop_gallery_gradient, tn, tp",
    ),
    (["loss.params.margin=big"], "loss.params.margin: expected a number, got 'big'"),
    (["optimizer.learning_rate=abc"], "optimizer.learning_rate: expected a number, got 'abc'"),
    (["optimizer.learning_rate=-1"], "optimizer.learning_rate: must be a number in (0, 100], got -1.0"),
    (["optimizer.name=adagrad2"], "optimizer.name: must be one of sgd, adam, adamw, lamb, rmsprop, got 'adagrad2'"),
    (["optimizer.name=RAdam"], "optimizer.name: RAdam is not available in keras.optimizers"),
    (["training.epochs=two"], "training.epochs: expected an integer, got 'two'"),
    (["training.epochs=0"], "training.epochs: must be an integer in [1, 1000000], got 0"),
    (["training.epoch=2"], "unknown configuration key 'training.epoch' (did you mean 'epochs'?)"),
    (["seed=1.5"], "seed: expected an integer, got 1.5"),
    (["model.levels=H"], "model.levels: expected a list drawn from L, M, H (e.g. [H]), got 'H'"),
    (["model.levels=[H, X]"], "model.levels[1]: must be one of L, M, H, got 'X'"),
    (["model.level_weights=[1, 2]"], "model.level_weights: expected one weight per level (3), got 2"),
    (["model.embedding_dim=-4"], "model.embedding_dim: must be an integer in [1, 65536], got -4"),
    (["data.samples_per_class=-2"], "data.samples_per_class: must be an integer in [1, 10000], got -2"),
    (["data.image_size=0"], "data.image_size: must be an integer in [1, 4096], got 0"),
    (["data.source=imagenet"], "data.source: must be one of digits, tfds, folder, glyphs, got 'imagenet'"),
    (["data.augment.flips=false"], "unknown configuration key 'data.augment.flips' (did you mean 'flip'?)"),
    (["data.augment.scale=[0, 1]"], "data.augment: Augment.scale must satisfy 0 < low <= high <= 1"),
    (["data.source=folder"], "data.path: data.source=folder needs an image folder"),
    (["data.source=folder", "data.path=/no/such/dir"], "data.path: no such directory: /no/such/dir"),
    (
        ["data.source=tfds", "data.name=caltech_birds"],
        "data.name: unknown tfds data set 'caltech_birds'; did you mean caltech_birds2011",
    ),
    (["ala.episode.trian_size=10"], "unknown configuration key 'ala.episode.trian_size' (did you mean 'train_size'?)"),
    (["ala.episode.train_size=abc"], "ala.episode.train_size: expected an integer, got 'abc'"),
    (
        ["ala.episode.train_size=10", "ala.episode.train_classes=3"],
        "ala.episode.train_size: 10 images do not split evenly over 3 classes",
    ),
    (["ala.params.state=per_batch"], "ala.params.state: must be one of per_tuple, per_step, got 'per_batch'"),
    (
        ["ala.enabled=true"],
        "loss.name: DML-ALA (ala.enabled) weights triplet, margin, contrastive tuples, not ranked_list",
    ),
    (["ala.enabled=true", "loss.name=triplet", "loss.params.mining=semi_hrd"], "loss.params"),
    (["ala.params.weights=relu"], "ala.params.weights: must be one of softmax, sigmoid, got 'relu'"),
    (["loss.name=group"], "model.num_classes: the group loss needs the classifier head size"),
    (["loss.name=arcface_typo"], "loss.name: must be one of ranked_list, triplet"),
    (
        ["loss.name=triplet", "loss.dynamic_temperature={t1: 20, t2: 5}"],
        "loss.dynamic_temperature: applies to loss.name=ranked_list only, not triplet",
    ),
    (["training.pretrain_epochs=20"], "training.pretrain_epochs: must be <= training.epochs (10), got 20"),
    (["evaluation.metrics=[recall, map]"], "evaluation.metrics[1]: must be one of recall, map@r"),
    (["evaluation.ks=[]"], "evaluation.ks: expected a non-empty list"),
    (["export.match_mode=open_set"], "export.match_mode: must be one of auto, open, closed, got 'open_set'"),
    (["export.target_recall=1.5"], "export.target_recall: must be a number in (0, 1], got 1.5"),
    (["training"], "override 'training' must look like key.path=value"),
    (["training=3"], "training: expected a mapping, got 3"),
]


@pytest.mark.parametrize("overrides, message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_value_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(overrides=overrides)
    text = str(error.value)
    assert text.startswith(message) or message in text, text
    assert "\n" not in text


def test_bad_yaml_file_is_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("training: {epochs: [\n")
    with pytest.raises(ConfigError, match="not valid YAML") as error:
        load_config(str(path))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.basename(p)[:-5])
def test_yaml_round_trip(path, tmp_path):
    config = load_config(path)
    assert isinstance(config.data, config_lib.DataConfig) and isinstance(config.optimizer.learning_rate, float)
    reloaded = Config.from_dict(yaml.safe_load(yaml.safe_dump(config.to_dict(), sort_keys=False)))
    assert reloaded == config
    # and as a configuration file (what the report's config.yaml is)
    written = tmp_path / "config.yaml"
    written.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    assert load_config(str(written)) == config


def test_values_other_parts_of_tfdml_rely_on():
    glyph_job = load_config(overrides=["data.source=glyphs", "data.images_per_class=10"])
    assert (glyph_job.data.source, glyph_job.data.images_per_class) == ("glyphs", 10)
    nulls = load_config(overrides=["model.embedding_dim=null", "training.steps_per_epoch=null"])
    assert nulls.model.embedding_dim is None and nulls.training.steps_per_epoch is None
    ala = load_config(
        overrides=[
            "ala.enabled=true",
            "loss.name=margin",
            "ala.params.state=per_step",
            "ala.episode.disjoint_labels=false",
        ]
    )
    assert ala.ala.params.arguments() == {"state": "per_step"}
    assert ala.ala.episode.arguments(ala.data)["disjoint_labels"] is False
    default = load_config()
    assert "disjoint_labels" not in default.ala.episode.arguments(default.data)  # unset: the library's default
    # The episode at the base loss's batch, 22 x 3 glyphs, and 4 x 3 validation images drawn in addition.
    sizes = {k: default.ala.episode.arguments(default.data)[k] for k in ("train_size", "val_size", "samples_per_class")}
    assert sizes == {"train_size": 66, "val_size": 12, "samples_per_class": 3}
    # tfdml train's export step calibrates `match` and tunes an approximate index as tfdml export would
    export = load_config(overrides=["export.match_mode=closed", "export.target_recall=null"]).export
    assert (export.match_mode, export.target_recall) == ("closed", None)
    assert (default.export.match_mode, default.export.target_recall) == ("auto", 0.95)
    # YAML 1.1 reads 1e-3 as a string; a number key takes it
    assert load_config(overrides=["optimizer.learning_rate=1e-3"]).optimizer.learning_rate == 1e-3


def test_every_loss_name_is_a_tfdml_loss():
    from tfdml import losses

    for name, class_name in config_lib.LOSSES.items():
        assert load_config(overrides=[f"loss.name={name}", "model.num_classes=5"]).loss.name == name
        # its parameters are the class's own arguments
        arguments = inspect.signature(getattr(losses, class_name)).parameters
        expected = sorted(a for a, p in arguments.items() if a != "name" and p.kind == p.POSITIONAL_OR_KEYWORD)
        with pytest.raises(ConfigError, match=f"valid keys here: {', '.join(expected)}$"):
            load_config(overrides=[f"loss.name={name}", "model.num_classes=5", "loss.params.bogus=1"])


def test_differences_name_nested_keys():
    old = load_config().to_dict()
    new = load_config(overrides=["optimizer.learning_rate=0.01", "model.embedding_dim=32"]).to_dict()
    assert config_lib.differences(old, new) == ["model.embedding_dim", "optimizer.learning_rate"]


def test_given_keys_are_what_the_file_and_the_overrides_set(tmp_path):
    from tfdml.config import given_keys

    path = tmp_path / "job.yaml"
    path.write_text("data:\n  samples_per_class: 2\n  augment: {flip: true}\nseed: 3\n")
    keys = given_keys(str(path), ["training.epochs=2", ("data.classes_per_batch", 4)])
    assert keys == {"data.samples_per_class", "data.augment.flip", "seed", "training.epochs", "data.classes_per_batch"}
    assert "data.classes_per_batch" not in given_keys(str(path))


def test_output_folders_with_a_file_in_the_way_are_refused(tmp_path):
    from tfdml.config import output_dir_problem

    (tmp_path / "file").write_text("x")
    assert output_dir_problem(tmp_path / "new" / "deeper") is None
    assert output_dir_problem(tmp_path / "file") == f"{tmp_path / 'file'} is a file, not a folder"
    assert "is a file, so the folder" in output_dir_problem(tmp_path / "file" / "sub")
    with pytest.raises(ConfigError, match="^report.dir: .* is a file, not a folder"):
        load_config(overrides=[f"report.dir={tmp_path / 'file'}"])
    with pytest.raises(ConfigError, match="^export.base_dir: .* is a file, so the folder"):
        load_config(overrides=[f"export.base_dir={tmp_path / 'file'}"])
    assert load_config(overrides=[f"export.base_dir={tmp_path / 'file'}", "export.enabled=false"])
    with pytest.raises(ConfigError, match="is a directory; give a YAML file"):
        load_config(str(tmp_path))


def test_image_folder_layout_is_checked_with_the_configuration(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.png").write_bytes(b"")
    with pytest.raises(ConfigError, match="^data.path: .*flat has no class sub-folders"):
        load_config(overrides=["data.source=folder", f"data.path={tmp_path / 'flat'}"])
    (tmp_path / "hollow" / "a").mkdir(parents=True)
    with pytest.raises(ConfigError, match="^data.eval_path: none of the 1 class sub-folders of .*hollow holds a file"):
        load_config(overrides=["data.source=folder", f"data.path={tmp_path}", f"data.eval_path={tmp_path / 'hollow'}"])


def test_backbone_names_are_checked():
    expected = "^model.backbone: unknown backbone 'resnet5O' \\(did you mean 'resnet50'\\?\\); valid: small_cnn, "
    with pytest.raises(ConfigError, match=expected):
        load_config(overrides=["model.backbone=resnet5O"])
    assert load_config(overrides=["model.backbone=ResNet50", "model.weights=imagenet"]).model.backbone == "ResNet50"


def test_image_folder_check_closes_the_folder_it_stops_in(tmp_path):
    """It stops at the first class folder holding a file: the scandir iterator is closed, not left to the
    garbage collector (a ResourceWarning, an error under the suite's warnings-as-errors)."""
    for name in ("ant", "bee"):
        (tmp_path / name).mkdir()
        for i in range(3):
            (tmp_path / name / f"{i}.png").write_bytes(b"")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert folders.image_folder_problem(str(tmp_path)) is None
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_match_modes_are_the_calibration_modes():
    """Written out in the configuration (no TensorFlow to parse it): the same as `tfdml.retrieval`'s."""
    from tfdml.retrieval.calibration import MODES

    assert config_lib.MATCH_MODES == MODES
