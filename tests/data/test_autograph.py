"""tfdml traces its own dataset and serving functions without AutoGraph (`tfdml.data.tracing`); a user's
function that branches on a tensor in Python (a source's loader, a preprocessing function) is still
converted where it was: in `eval_dataset` and the exported signatures."""

import numpy as np
import pytest
import tensorflow as tf

import tfdml
from tfdml.data import tracing


def _branching_load(table):
    def load(i):
        image = tf.gather(table, i)
        if tf.reduce_max(image) > 100:  # a tensor condition: needs AutoGraph
            image = image // 2
        return image

    return load


def _branching_preprocess(image):
    if tf.reduce_mean(image) > 1e9:  # a tensor condition: needs AutoGraph
        return image * 0.0
    return image / 255.0


def _user_source():
    images = np.stack([np.full([4, 4, 1], value, np.uint8) for value in (10, 200, 30, 250)])
    source = tfdml.data.Source([0, 0, 1, 1], _branching_load(tf.constant(images)), 1, (4, 4, 1), name="user")
    return source, images


def test_only_the_users_functions_need_autograph():
    source, _ = _user_source()
    own = tfdml.data.array_source(np.zeros([2, 4, 4, 1], np.uint8), [0, 1])
    assert not tracing.autograph_needed(None, own.load, tf.math.l2_normalize)
    assert tracing.autograph_needed(source.load)
    assert tracing.autograph_needed(own.load, _branching_preprocess)
    # A subset runs its parent's loader: the parent's decides.
    assert tracing.autograph_needed(source.subset([1, 2]).load)
    assert not tracing.autograph_needed(own.subset([1]).load)
    anonymous = lambda image: image  # noqa: E731
    anonymous.__module__ = None  # nothing says whose it is: converted, as before
    assert tracing.autograph_needed(anonymous)


@pytest.mark.slow
def test_eval_dataset_converts_a_users_branching_loader_and_preprocessing():
    source, images = _user_source()
    expected = np.where(images > 100, images // 2, images).astype(np.float32)
    evaluated = tfdml.data.eval_dataset(source, 4, preprocess=_branching_preprocess)
    np.testing.assert_allclose(next(iter(evaluated))[0].numpy(), expected / 255.0)
    evaluated = tfdml.data.eval_dataset(source.subset([3, 0]), 2)
    np.testing.assert_array_equal(next(iter(evaluated))[0].numpy(), expected[[3, 0]])
