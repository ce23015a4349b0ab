"""DML-ALA's episodes: `episode_sizes` (the base loss's batch + a validation subset drawn in addition),
`episode_dataset(disjoint_labels=False)` (the random episodes of Table 1's ablation), and the documented
example, run as a user runs it."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tfdml.data as data
from tests import ROOT
from tfdml.ala_options import episode_sizes

GUIDE = os.path.join(ROOT, "docs", "guides", "dml-ala.md")


def test_episode_sizes_are_the_base_losses_batch_and_one_validation_class_per_five():
    assert episode_sizes(22, 3) == {"train_size": 66, "val_size": 12, "samples_per_class": 3}
    assert episode_sizes(20, 5) == {"train_size": 100, "val_size": 20, "samples_per_class": 5}  # the paper's
    assert episode_sizes(2, 4) == {"train_size": 8, "val_size": 4, "samples_per_class": 4}  # at least one class
    assert episode_sizes(8, 2, val_classes=3)["val_size"] == 6
    with pytest.raises(ValueError, match="samples_per_class must be a positive integer, got 0"):
        episode_sizes(8, 0)


def guide_example():
    """The first ```python block of the DML-ALA guide, as written."""
    with open(GUIDE) as f:
        return re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)


@pytest.mark.slow
def test_the_guides_example_runs_without_warnings():
    """The guide's `ala_training` + `model.fit` example, at 2 steps, in a fresh process: no "input ran out of
    data", no "shuffle=True ... ignored", no Python warning at all (every warning is an error)."""
    code = guide_example()
    assert "steps=600" in code and "model.fit(episodes)" in code
    code = code.replace("steps=600", "steps=2") + "\nassert len(history.history['loss']) == 1\n"
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for message in ("ran out of data", "shuffle=True", "Warning"):
        assert message not in result.stderr, result.stderr[-3000:]


def _source(num_classes=6, per_class=8):
    labels = np.repeat(np.arange(num_classes), per_class)
    # Each image is filled with its own item index, so an episode tells which items it holds.
    images = np.broadcast_to(np.arange(labels.size, dtype=np.uint8)[:, None, None, None], (labels.size, 4, 4, 1))
    return data.array_source(np.ascontiguousarray(images), labels)


def _episodes(ds, n):
    return [tuple(np.asarray(t) for t in episode) for episode in ds.take(n)]


@pytest.mark.slow
def test_random_episodes_may_share_labels_and_stay_class_balanced():
    source = _source()
    kwargs = dict(train_size=12, val_size=6, train_classes=4, val_classes=3, seed=0, preprocess=lambda x: x)
    random = _episodes(data.episode_dataset(source, disjoint_labels=False, **kwargs), 40)
    shared = 0
    for train_x, train_y, val_x, val_y in random:
        assert train_x.shape == (12, 4, 4, 1) and val_x.shape == (6, 4, 4, 1)
        assert np.unique(train_y, return_counts=True)[1].tolist() == [3] * 4
        assert np.unique(val_y, return_counts=True)[1].tolist() == [2] * 3
        items = train_x[:, 0, 0, 0].astype(int), val_x[:, 0, 0, 0].astype(int)
        np.testing.assert_array_equal(items[0] // 8, train_y)  # each image belongs to its label
        np.testing.assert_array_equal(items[1] // 8, val_y)
        shared += bool(set(train_y) & set(val_y))
    # 4 + 3 classes out of 6 always overlap; with 4 of 6 and 3 of 6 drawn independently, so do they here.
    assert shared == 40
    disjoint = _episodes(data.episode_dataset(_source(num_classes=10), **kwargs), 40)
    assert all(not set(e[1]) & set(e[3]) for e in disjoint)
    again = _episodes(data.episode_dataset(source, disjoint_labels=False, **kwargs), 3)
    for a, b in zip(random, again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_random_episodes_can_share_labels_that_disjoint_ones_cannot():
    source = _source(num_classes=10)
    kwargs = dict(train_size=8, val_size=4, train_classes=4, val_classes=2, seed=1, preprocess=lambda x: x)
    random = _episodes(data.episode_dataset(source, disjoint_labels=False, **kwargs), 60)
    overlaps = [len(set(e[1]) & set(e[3])) for e in random]
    assert 0 < sum(o > 0 for o in overlaps) < 60  # sometimes, not always
    with pytest.raises(ValueError, match="disjoint label sets"):
        data.episode_dataset(_source(num_classes=5), **kwargs)
    data.episode_dataset(_source(num_classes=5), disjoint_labels=False, **kwargs)  # 4 classes suffice


@pytest.mark.slow
def test_validation_subsets_from_a_verified_source():
    """`val_source`: the validation subsets come from another source (a verified set for label noise), the
    training subsets from `source`, both class-balanced; a source too small for its subset is refused by name."""
    source = _source(num_classes=10)
    verified_labels = np.repeat([1, 4, 7], 3)  # 3 verified images of classes 1, 4 and 7
    verified = data.array_source(np.full((9, 4, 4, 1), 200, np.uint8), verified_labels, name="verified")
    kwargs = dict(train_size=8, val_size=4, train_classes=4, val_classes=2, seed=3, preprocess=lambda x: x)
    episodes = _episodes(data.episode_dataset(source, val_source=verified, **kwargs), 20)
    for train_x, train_y, val_x, val_y in episodes:
        np.testing.assert_array_equal(train_x[:, 0, 0, 0].astype(int) // 8, train_y)  # from source
        assert np.all(val_x == 200) and set(val_y) <= {1, 4, 7}  # from the verified set
        assert np.unique(val_y, return_counts=True)[1].tolist() == [2, 2]
    assert len({tuple(e[3]) for e in episodes}) > 1  # the validation classes vary
    with pytest.raises(ValueError, match="verified has 3 usable classes, fewer than the 4 classes of one validation"):
        data.episode_dataset(source, val_source=verified, **dict(kwargs, val_size=8, val_classes=4))
    with pytest.raises(ValueError, match="with val_source they come from val_source"):
        data.episode_dataset(source, val_source=verified, disjoint_labels=False, **kwargs)


@pytest.mark.slow
def test_job_configuration_draws_the_validation_subsets_from_a_verified_folder(tmp_path):
    """`ala.val_path`: the job's episodes take their validation subsets from a folder of hand-checked images
    (decoded to the training images' channels), their training subsets from the job's data."""
    import tensorflow as tf

    from tfdml import pipeline
    from tfdml.config import ConfigError, load_config

    verified = tmp_path / "verified"
    for c in range(4):  # the default job's validation subset: 4 classes of 3 images
        (verified / f"class_{c}").mkdir(parents=True)
        for i in range(3):
            image = tf.io.encode_png(np.full((20, 24, 3), 200, np.uint8)).numpy()  # RGB: decoded to grey
            (verified / f"class_{c}" / f"{i}.png").write_bytes(image)
    job = ["ala.enabled=true", "loss.name=contrastive"]
    config = pipeline.resolve_paths(load_config(overrides=[*job, f"ala.val_path={verified}"]))
    assert config.ala.val_path == str(verified)
    train_source, eval_source = pipeline.load_sources(config.data)
    train = pipeline.make_datasets(config, train_source, eval_source).train
    for train_x, train_y, val_x, val_y in _episodes(train, 3):
        assert train_x.shape == (66, 32, 32, 1) and val_x.shape == (12, 32, 32, 1)
        np.testing.assert_allclose(val_x, 200)  # the verified images, resized
        assert not np.allclose(train_x, 200)  # glyphs
        assert np.unique(train_y, return_counts=True)[1].tolist() == [3] * 22
        assert sorted(np.unique(val_y, return_counts=True)[1]) == [3, 3, 3, 3]

    broken = tmp_path / "broken" / "class_0"
    broken.mkdir(parents=True)
    (broken / "0.png").write_bytes(b"not an image")  # a file: the configuration's cheap layout check passes
    config = load_config(overrides=[*job, f"ala.val_path={broken.parent}"])
    with pytest.raises(ConfigError, match="^ala.val_path: image folder .* none of its 1 image files can be decoded"):
        pipeline.make_datasets(config, train_source, eval_source)

    for overrides, message in [
        ([f"ala.val_path={verified}"], "ala.val_path: applies with ala.enabled=true only"),
        ([*job, f"ala.val_path={tmp_path / 'missing'}"], "ala.val_path: no such directory"),
        ([*job, f"ala.val_path={verified / 'class_0'}"], "ala.val_path: .*class_0 has no class sub-folders"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(overrides=overrides)
