"""Paper configurations follow the authors' code: RLL with the Caffe layer's query weighting, Group Loss with
the official layout (pooled feature as embedding, classifier on it), epochs of one pass over the training
images and the paper's weight decay; run end to end on mocked tfds data without overriding those settings."""

import dataclasses
import os
import types

import keras
import pytest
import tensorflow_datasets as tfds

from tests.pipeline.test_configs import CONFIG_DIR, IMAGES_PER_CLASS, TINY, _fake_data_source
from tfdml import pipeline, recipes
from tfdml.config import load_config
from tfdml.losses import RankedListLoss

GROUP_WEIGHT_DECAY = {"cub": 1e-6, "cars": 1e-7, "sop": 1e-12}  # Group Loss paper, Sec. 4


@pytest.mark.parametrize("kind", ["rll_simpler", "rll_lmh"])
@pytest.mark.parametrize("data", ["cub", "cars", "sop"])
def test_rll_configs_use_the_official_query_weighting(kind, data):
    config = load_config(os.path.join(CONFIG_DIR, f"{kind}_{data}.yaml"))
    loss = pipeline.build_loss(config.loss)
    assert isinstance(loss, RankedListLoss) and loss.query_weighting == "official"


@pytest.mark.parametrize("data", sorted(GROUP_WEIGHT_DECAY))
def test_group_loss_configs_follow_the_official_code(data):
    config = load_config(os.path.join(CONFIG_DIR, f"group_loss_{data}.yaml"))
    assert config.model.embedding_dim is None and config.model.type == "single"
    assert config.training.steps_per_epoch is None  # one pass over the training images
    assert config.optimizer.weight_decay == GROUP_WEIGHT_DECAY[data]
    # The model section builds the official layout (small CNN in place of the ImageNet backbone).
    model_config = dataclasses.replace(config.model, backbone="small_cnn", weights=None, num_classes=4)
    model = recipes.make_embedder(model_config, (32, 32, 1))
    assert model.get_layer("head_H").projection is None
    assert model.classifiers[0].kernel.shape == (model.output_dim, 4)


def test_one_pass_epochs_are_computed_from_the_data_set_size():
    config = load_config(os.path.join(CONFIG_DIR, "group_loss_cub.yaml"))  # 6 x 9 batches

    def steps(num_images, overrides=()):
        source = types.SimpleNamespace(labels=[0] * num_images)
        return pipeline.steps_per_epoch(
            load_config(os.path.join(CONFIG_DIR, "group_loss_cub.yaml"), list(overrides)), source
        )

    assert config.training.steps_per_epoch is None
    assert steps(5864) == 109  # CUB train: 5864 images
    assert steps(54) == 1
    assert steps(5864, ["training.steps_per_epoch=200"]) == 200


@pytest.mark.slow
def test_group_loss_config_runs_with_the_official_layout_and_one_pass_epochs(tmp_path):
    path = os.path.join(CONFIG_DIR, "group_loss_cub.yaml")
    keep = ("model.embedding_dim", "training.steps_per_epoch")  # the settings under test stay as in the file
    tiny = [o for o in TINY if not o.startswith(keep)]
    config = load_config(
        path, tiny + ["loss.params.num_anchors=1", "training.pretrain_epochs=0", f"report.dir={tmp_path}"]
    )
    assert config.model.embedding_dim is None
    with tfds.testing.mock_data(as_data_source_fn=_fake_data_source):
        summary = pipeline.run(config, verbose=0)
    model = keras.saving.load_model(str(tmp_path / "model.keras"))
    assert model.get_config()["embedding_dim"] is None  # the pooled small-CNN feature is the embedding
    # 5 training classes x 6 images, batches of 3 x 2: one pass is 5 steps (not a fixed number)
    assert int(model.optimizer.iterations.numpy()) == 5 * IMAGES_PER_CLASS // 6
    assert len(summary["history"]["loss"]) == config.training.epochs == 1
