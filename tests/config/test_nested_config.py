"""`loss.nested_dims` / `loss.nested_weights` in the job configuration: parsed and checked once at the edge
(messages naming the key), built into `NestedLoss` by the recipe (inside the cross-batch memory, which stores the
full vectors), shown by `tfdml train --print-config`, and a job that trains with it."""

import keras
import numpy as np
import pytest
import yaml

from tfdml import cli, losses
from tfdml.config import ConfigError, load_config
from tfdml.recipes import build_loss

SINGLE = ["model.type=single", "model.embedding_dim=32", "loss.name=contrastive"]


def test_the_recipe_wraps_the_loss_in_nested_loss():
    config = load_config(overrides=[*SINGLE, "loss.nested_dims=[8,16,32]", "loss.nested_weights=[1,1,2]"])
    assert (config.loss.nested_dims, config.loss.nested_weights) == ([8, 16, 32], [1.0, 1.0, 2.0])
    loss = build_loss(config.loss, embedding_dim=32)
    assert isinstance(loss, losses.NestedLoss) and isinstance(loss.loss, losses.ContrastiveLoss)
    assert (loss.dims, loss.weights) == ((8, 16, 32), (1.0, 1.0, 2.0))
    assert not isinstance(build_loss(load_config(overrides=SINGLE).loss), losses.NestedLoss)


def test_the_memory_goes_around_the_nested_loss_and_stores_full_vectors():
    overrides = [*SINGLE, "loss.nested_dims=[8,32]", "loss.cross_batch_memory.memory_size=128"]
    loss = build_loss(load_config(overrides=overrides).loss, embedding_dim=32)
    assert isinstance(loss, losses.CrossBatchMemory) and isinstance(loss.loss, losses.NestedLoss)
    assert loss.embedding_dim == 32 and loss.loss.weights == (1.0, 1.0)


def test_print_config_shows_the_nested_dims(capsys):
    assert cli.main(["train", "--print-config", *[f"--set={o}" for o in SINGLE], "--set=loss.nested_dims=[8,16]"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["loss"]
    assert printed["nested_dims"] == [8, 16] and printed["nested_weights"] is None
    assert cli.main(["train", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["loss"]["nested_dims"] is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["loss.nested_dims=[16,8]"], r"loss\.nested_dims: expected strictly increasing .* got \[16, 8\]"),
        (["loss.nested_dims=[8,8]"], r"loss\.nested_dims: expected strictly increasing"),
        (["loss.nested_dims=[0,8]"], r"loss\.nested_dims\[0\]: must be an integer in \[1, 65536\], got 0"),
        (
            ["loss.nested_dims=[8,64]"],
            r"loss\.nested_dims: 64 is wider than the embedding \(model\.embedding_dim = 32\)",
        ),
        (["loss.nested_dims=[8,16]", "loss.nested_weights=[1]"], r"loss\.nested_weights: 1 weights for the 2"),
        (
            ["loss.nested_dims=[8,16]", "loss.nested_weights=[1,0]"],
            r"loss\.nested_weights\[1\]: must be a number in \(0",
        ),
        (["loss.nested_weights=[1,2]"], r"loss\.nested_weights: applies with loss\.nested_dims only"),
        (["loss.nested_dims=[8,16]", "loss.name=proxy_anchor"], r"loss\.nested_dims: proxy_anchor learns parameters"),
        (["loss.nested_dims=[8,16]", "loss.label_noise.rate=0.2"], r"loss\.nested_dims: the small-loss heuristic"),
        (["loss.nested_dims=[8,16]", "model.type=multilevel"], r"loss\.nested_dims: prefixes of one embedding"),
        (["export.search_dims=32"], r"export\.search_dims: 32 is not a prefix of the 32-d embedding"),
        (["export.search_dims=0"], r"export\.search_dims: must be an integer in \[1, 65536\], got 0"),
        (["export.search_dims=8", "export.index=false"], r"export\.search_dims: .* applies with export\.index only"),
        (
            ["export.search_dims=12", "loss.nested_dims=[8,16,32]"],
            r"export\.search_dims: 12 is not one of the prefixes the loss trains \(loss\.nested_dims = \[8, 16, 32\]\)",
        ),
    ],
)
def test_bad_settings_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[*SINGLE, *overrides])


@pytest.mark.slow
def test_a_job_model_trains_with_nested_dims():
    from tfdml import pipeline

    overrides = [*SINGLE, "loss.nested_dims=[4,8,32]", "data.classes_per_batch=4", "data.samples_per_class=2"]
    config = load_config(overrides=overrides)
    keras.utils.set_random_seed(0)
    model, embedder = pipeline.build_model(config, (32, 32, 1), total_steps=2)
    assert isinstance(model.loss, losses.NestedLoss) and embedder.embedding_dim == 32
    rng = np.random.default_rng(0)
    x, y = rng.uniform(size=(16, 32, 32, 1)).astype(np.float32), np.repeat(np.arange(8), 2).astype(np.int32)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False).history["loss"]
    assert np.all(np.isfinite(history)) and history[0] > 0


def test_the_jobs_export_searches_the_prefix(tmp_path):
    """`export.search_dims` reaches the job's export: its index and `search` signature search the 8-d prefix and
    re-rank with the full vector, and the metadata records it with the shortlist's measured recall."""
    import tensorflow as tf

    from tfdml import data, export, pipeline
    from tfdml.pipeline import resolve_paths

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(6), 4)
    images = (rng.integers(0, 200, (24, 4, 4, 1)) + labels[:, None, None, None] * 10).astype(np.float32)
    batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    datasets = pipeline.Datasets(train=None, eval=batches, pixels=batches)
    inputs = keras.Input((4, 4, 1))
    embedder = keras.Model(inputs, keras.layers.UnitNormalization()(keras.layers.Flatten()(inputs)))
    overrides = [*SINGLE, "model.embedding_dim=16", "loss.nested_dims=[8,16]", "export.search_dims=8"]
    overrides += ["data.image_size=4", f"export.base_dir={tmp_path}"]
    config = resolve_paths(load_config(overrides=overrides))
    evaluation = pipeline.evaluate(config, embedder, datasets)
    source = data.array_source(images.astype(np.uint8), labels)
    added = pipeline.export(config, embedder, evaluation, eval_source=source)
    metadata = export.load_metadata(added["export_dir"])
    assert metadata["index"]["search_dims"] == 8 and metadata["search"]["prefix"]["search_dims"] == 8
