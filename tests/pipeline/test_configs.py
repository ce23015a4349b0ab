"""Every paper configuration under configs/ loads and runs end to end (tiny) through `tfdml.pipeline.run`.

The tfds datasets are mocked: `tfds.testing.mock_data` with an `as_data_source_fn` that serves a few
deterministic random images of 5 training classes and 5 evaluation classes (6 images each) under each
dataset's real label key and label ids (CUB/Cars: class-split halves; SOP: its own train/test split), read
through the real `tfdml.data.tfds_source` random-access path. The overrides keep each run to 2 steps of a
small CNN; everything else (loss, optimizer and schedule, multi-level heads, ALA, Group Loss pre-training,
frozen BatchNorm, augmentation, evaluation, report) comes from the configuration file.
"""

import glob
import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tests import ROOT
from tfdml import pipeline, recipes
from tfdml.config import LOSSES, ConfigError, load_config
from tfdml.data.sources import CLASS_SPLIT_DATASETS, LABEL_KEYS

CONFIG_DIR = os.path.join(ROOT, "configs")
CONFIGS = sorted(glob.glob(os.path.join(CONFIG_DIR, "*.yaml")))
IMAGES_PER_CLASS = 6

TINY = [
    "model.backbone=small_cnn",
    "model.weights=null",
    "model.embedding_dim=8",
    "model.head_filters=4",
    "model.head_units=8",
    "data.image_size=32",
    "data.classes_per_batch=3",
    "data.samples_per_class=2",
    "training.epochs=1",
    "training.steps_per_epoch=2",
    "training.eval_every=0",
    "export.enabled=false",
    "evaluation.batch_size=16",
    "evaluation.ks=[1,2]",
    "report.grid_queries=3",
    "report.grid_neighbours=2",
    "report.worst_queries=2",
]


def _class_ids(builder, split, label_key):
    """5 training and/or 5 evaluation class ids, as the real dataset numbers them."""
    num_classes = builder.info.features[label_key].num_classes
    first, last = list(range(5)), list(range(num_classes - 5, num_classes))
    if builder.name == "stanford_online_products":  # Ebay split: the test classes have the highest ids
        return first if split == "train" else last
    return first + last  # CUB / Cars: tfdml reads train+test and splits the classes in halves


def _fake_data_source(builder, split, decoders=None, **kwargs):
    label_key = LABEL_KEYS.get(builder.name, "label")
    rng = np.random.default_rng(len(builder.name))
    examples = []
    for label in _class_ids(builder, split, label_key):
        for _ in range(IMAGES_PER_CLASS):
            image = rng.integers(0, 256, size=(40, 30, 3), dtype=np.uint8)
            examples.append({"image": image, label_key: np.int64(label)})
    return examples


def _tiny(config):
    """Overrides for this configuration's optional parts (Group Loss pre-training, ALA episodes) and its data."""
    extra = []
    if config.data.source == "digits":  # 896 evaluation images: 7 batches of the model instead of 56
        extra.append("evaluation.batch_size=128")
    if config.training.pretrain_epochs:  # with the retrieval evaluation callback after the epoch
        extra += ["training.pretrain_epochs=1", "training.eval_every=1"]
    if config.loss.name == "group":
        extra.append("loss.params.num_anchors=1")
    if config.ala.enabled:
        extra += [
            "ala.params.assessor_units=4",
            "ala.params.assessor_layers=1",
            "ala.params.assessor_steps=1",
            "ala.episode.train_size=6",
            "ala.episode.val_size=4",
            "ala.episode.samples_per_class=2",
        ]
    return extra


def test_configs_exist():
    names = {os.path.basename(path)[:-5] for path in CONFIGS}
    expected = {"digits_rll", "triplet_cub", "triplet_ala_cub", "margin_cub", "margin_ala_cub"} | {
        f"{kind}_{data}" for kind in ("rll_simpler", "rll_lmh", "group_loss") for data in ("cub", "cars", "sop")
    }
    assert expected <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.basename(p)[:-5])
def test_config_loads(path):
    config = load_config(path)
    assert config.name == os.path.basename(path)[:-5]
    assert config.loss.name in LOSSES
    if config.data.source == "tfds":
        assert config.data.name in set(CLASS_SPLIT_DATASETS) | set(LABEL_KEYS)
        assert config.paper_target, "paper configurations state the number they aim at"
    if config.loss.name == "group":
        assert config.model.num_classes and config.training.pretrain_epochs > 0
    resolved = pipeline.resolve_paths(config)
    assert resolved.report.dir == os.path.join("reports", config.name)
    with pytest.raises(ConfigError, match="unknown configuration key 'training.epoch'"):
        load_config(path, ["training.epoch=2"])


# glyphs_rll (the default job, see test_glyphs_rll_is_the_embedded_default) runs from its file in a
# subprocess in tests/cli/test_cli_train.py.
@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if not p.endswith("glyphs_rll.yaml")], ids=lambda p: os.path.basename(p)[:-5]
)
def test_config_runs_tiny(path, tmp_path):
    config = load_config(path, TINY + _tiny(load_config(path)) + [f"report.dir={tmp_path}"])
    with tfds.testing.mock_data(as_data_source_fn=_fake_data_source):
        summary = pipeline.run(config, verbose=0)

    assert summary["name"] == config.name
    unseen = (896, 5) if config.data.source == "digits" else (5 * IMAGES_PER_CLASS, 5)  # digits 5-9; mock tfds
    assert (summary["eval_items"], summary["eval_classes"]) == unseen
    for results in (summary["model"], summary["raw_pixels"]):
        assert set(results) == {"recall@1", "recall@2", "map@r", "r_precision", "nmi", "f1"}
        assert all(0.0 <= value <= 1.0 for value in results.values()), results
    losses = summary["history"]["loss"]
    assert len(losses) == 1 and np.isfinite(losses).all()
    with open(tmp_path / "metrics.json") as f:
        assert json.load(f)["model"] == summary["model"]
    # the report's config.yaml is the job: loading it again gives the same configuration
    assert load_config(str(tmp_path / "config.yaml")) == pipeline.resolve_paths(config)
    for name in ("config.yaml", "model.keras", "recall_at_k.png", "training_curves.png", "retrieval_grid.png"):
        assert (tmp_path / name).stat().st_size > 0, name


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.basename(p)[:-5])
def test_every_paper_configuration_can_name_the_pretrained_backbone_that_installs_offline(path):
    """`--set model.backbone=efficientnet_lite0` (ImageNet weights installed with tfdml, nothing downloaded) is a
    valid job for every recipe; the multi-level recipe reads the backbone's L, M and H taps."""
    config = load_config(path, ["model.backbone=efficientnet_lite0", "model.weights=imagenet"])
    assert (config.model.backbone, config.model.weights) == ("efficientnet_lite0", "imagenet")
    if config.name == "rll_lmh_cub":  # one build: each takes seconds
        model = recipes.make_embedder(config.model.to_dict() | {"weights": None}, (32, 32, 3))
        assert model.taps == ["block5c_out", "block7a_out", "top_activation"]


def test_classifier_head_too_small_for_the_labels(tmp_path):
    path = os.path.join(CONFIG_DIR, "group_loss_sop.yaml")
    config = load_config(path, TINY + ["training.pretrain_epochs=0", "model.num_classes=3", f"report.dir={tmp_path}"])
    with tfds.testing.mock_data(as_data_source_fn=_fake_data_source):
        with pytest.raises(ConfigError, match="model.num_classes=3 but the training labels go up to 4"):
            pipeline.run(config, verbose=0)


def test_glyphs_rll_is_the_embedded_default():
    """configs/glyphs_rll.yaml writes out the job `tfdml train` runs with no options."""
    written = pipeline.resolve_paths(load_config(os.path.join(CONFIG_DIR, "glyphs_rll.yaml")))
    default = pipeline.resolve_paths(load_config())
    assert pipeline.build_loss(written.loss).get_config() == pipeline.build_loss(default.loss).get_config()
    written, default = written.to_dict(), default.to_dict()
    for config in (written, default):
        del config["description"], config["loss"]["params"]
    assert written == default
