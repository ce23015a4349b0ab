"""Losses with trainable proxies (Proxy-Anchor, ProxyNCA, NormSoftmax, ArcFace, CosFace) inside Keras: the proxies
train in `fit` (own optimizer or a learning-rate multiplier), are saved with the model, and the PML losses see the
global batch under `MirroredStrategy` (summed replica gradients, proxies included, equal one device's)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdml.losses as losses
from tests import loss_checks as checks
from tests.test_distribute import (
    EMB_DIM,
    NUM_CLASSES,
    _batch,
    _embeddings_head,
    _replica_gradients,
    _single_device_gradients,
)
from tfdml import distribute
from tfdml.models import MetricModel
from tfdml.optimizers import learning_rate_multipliers

PROXY_CLASSES = [
    losses.ProxyAnchorLoss,
    losses.ProxyNCALoss,
    losses.NormalizedSoftmaxLoss,
    losses.ArcFaceLoss,
    losses.CosFaceLoss,
]


def _embedder(seed=0, dim=4):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    embeddings = keras.layers.Dense(dim, name="embedding")(inputs)
    return MetricModel(inputs, keras.layers.UnitNormalization()(embeddings))


def _proxy_gradient(loss, model, x, labels):
    with tf.GradientTape() as tape:
        value = loss(labels, model(x))
    return tape.gradient(value, loss.proxies).numpy()


@pytest.mark.slow
def test_proxies_train_with_their_own_optimizer_and_are_saved_with_the_model(tmp_path):
    x, labels = checks.clustered_data(num_classes=4, per_class=4)
    model = _embedder()
    loss = losses.ProxyAnchorLoss(4, 4, proxy_optimizer=keras.optimizers.SGD(0.5))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    assert sum(v is loss.proxies for v in model.trainable_variables) == 1
    kernel = model.get_layer("embedding").kernel
    proxies0, kernel0 = loss.proxies.numpy().copy(), kernel.numpy().copy()
    grad0 = _proxy_gradient(loss, model, x, labels)
    model.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(loss.proxies.numpy(), proxies0 - 0.5 * grad0, rtol=1e-5, atol=1e-7)  # SGD(0.5)
    np.testing.assert_allclose(np.abs(kernel.numpy() - kernel0), 1e-3, rtol=1e-2)  # Adam's first step

    path = tmp_path / "proxy_anchor.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored.loss, losses.ProxyAnchorLoss)
    assert restored.loss.get_config() == loss.get_config()
    np.testing.assert_array_equal(restored.loss.proxies.numpy(), loss.proxies.numpy())
    model.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    restored.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(restored.loss.proxies.numpy(), loss.proxies.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_learning_rate_multiplier_trains_proxies_at_100x_the_network_rate(tmp_path):
    """Proxy-Anchor's recipe: one optimizer, the proxies' learning rate 100x the backbone's."""
    x, labels = checks.clustered_data(num_classes=4, per_class=4)
    model = _embedder(1)
    loss = losses.ProxyAnchorLoss(4, 4)
    optimizer = learning_rate_multipliers(keras.optimizers.SGD(0.001), [(loss.proxies, 100.0)])
    model.compile(optimizer=optimizer, loss=loss)
    kernel = model.get_layer("embedding").kernel
    proxies0, kernel0 = loss.proxies.numpy().copy(), kernel.numpy().copy()
    with tf.GradientTape() as tape:
        value = loss(labels, model(x))
    grad_p, grad_k = (g.numpy() for g in tape.gradient(value, [loss.proxies, kernel]))
    model.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(loss.proxies.numpy(), proxies0 - 0.1 * grad_p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(kernel.numpy(), kernel0 - 0.001 * grad_k, rtol=1e-5, atol=1e-7)

    path = tmp_path / "multiplier.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(restored.loss.proxies.numpy(), loss.proxies.numpy())
    before = restored.loss.proxies.numpy().copy()
    grad = _proxy_gradient(restored.loss, restored, x, labels)
    restored.fit(x, labels, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(restored.loss.proxies.numpy(), before - 0.1 * grad, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("cls", PROXY_CLASSES)
def test_fit_lowers_the_loss_and_moves_the_proxies(cls):
    x, labels = checks.clustered_data(num_classes=4, per_class=8)
    model = _embedder(2)
    loss = cls(4, 4)
    proxies0 = loss.proxies.numpy().copy()
    before = float(loss(labels, model(x)))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss, jit_compile=False)
    model.fit(x, labels, batch_size=len(x), epochs=15, shuffle=False, verbose=0)
    after = float(loss(labels, model(x)))
    assert np.isfinite(after) and after < 0.8 * before, (before, after)
    assert np.abs(loss.proxies.numpy() - proxies0).max() > 1e-2


# ------------------------------------------------------------------------------------------- MirroredStrategy
def _seeded(cls):
    def make(**kwargs):
        return cls(NUM_CLASSES, EMB_DIM, proxy_initializer=keras.initializers.RandomNormal(seed=3), **kwargs)

    return make


DISTRIBUTED = {
    "multi_similarity": lambda **kw: losses.MultiSimilarityLoss(**kw),
    "circle": lambda **kw: losses.CircleLoss(**kw),
    "lifted_structure": lambda **kw: losses.LiftedStructureLoss(**kw),
    "n_pairs": lambda **kw: losses.NPairsLoss(**kw),
    "supcon": lambda **kw: losses.SupConLoss(**kw),
    "ntxent": lambda **kw: losses.NTXentLoss(**kw),
    **{cls.__name__: _seeded(cls) for cls in PROXY_CLASSES},
}


@pytest.fixture(scope="module")
def two_replicas():
    return distribute.mirrored_strategy(["/cpu:0", "/cpu:1"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DISTRIBUTED))
def test_two_replicas_train_like_one_device_on_the_global_batch(two_replicas, name):
    """Summed replica gradients of the network and of the (mirrored) proxies equal the single-device ones."""
    make_loss = DISTRIBUTED[name]
    x, y = _batch(16, seed=2)
    expected_value, expected = _single_device_gradients(make_loss, EMB_DIM, _embeddings_head, x, y)
    value, gradients = _replica_gradients(two_replicas, make_loss, EMB_DIM, _embeddings_head, x, y)
    np.testing.assert_allclose(value, expected_value, rtol=1e-6, atol=1e-6)
    assert len(gradients) == len(expected) == (2 if name in {c.__name__ for c in PROXY_CLASSES} else 1)
    for got, want in zip(gradients, expected):
        assert np.abs(want).max() > 1e-3
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_per_replica_proxy_loss_differs_from_the_global_one(two_replicas):
    """With `cross_replica=False` the proxy losses do not reduce to the global batch: Proxy-Anchor's per-proxy
    logsumexp over the batch does not split into per-replica sums, so the global gather matters."""
    make_loss = DISTRIBUTED["ProxyAnchorLoss"]
    x, y = _batch(16, seed=2)
    _, expected = _single_device_gradients(make_loss, EMB_DIM, _embeddings_head, x, y)
    _, gradients = _replica_gradients(two_replicas, make_loss, EMB_DIM, _embeddings_head, x, y, cross_replica=False)
    assert max(np.abs(g - w).max() for g, w in zip(gradients, expected)) > 1e-3
