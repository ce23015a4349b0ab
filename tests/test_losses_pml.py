"""The losses ported from pytorch-metric-learning (PML 2.9): values and gradients equal to PML's on the reference
vectors of `tests/data/pml_reference.json` (written by `scripts/pml_reference.py`), NumPy readings of the papers'
formulas where PML's choices differ, finite values on degenerate batches, clear errors, configs, XLA and
O(B^2) graphs."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdml.losses as losses
from tests import loss_checks as checks
from tests.references import numpy_losses as ref
from tests.test_losses_triplet import _largest_tensor_in_graph

REFERENCE = json.load(open(os.path.join(os.path.dirname(__file__), "data", "pml_reference.json")))
# float64 on both sides: what is left is summation order and libm round-off.
VALUE_RTOL, GRAD_ATOL = 1e-10, 1e-10

PAIR = ["multi_similarity_mined", "multi_similarity_all_pairs", "circle", "lifted_structure", "n_pairs", "supcon",
        "ntxent"]
PROXY = ["proxy_anchor", "proxy_nca", "normalized_softmax", "arcface", "cosface"]
CASES = [(name, batch) for name in PAIR + PROXY for batch in REFERENCE["batches"]]


def _make(name, num_classes=None, embedding_dim=None, **kwargs):
    spec = REFERENCE["losses"][name]
    cls = getattr(losses, spec["tfdml"])
    args = dict(spec["args"], **kwargs)
    if spec["proxies"]:
        return cls(num_classes, embedding_dim, **args)
    return cls(**args)


# The pure functions take float64 proxies; the classes hold a float32 variable (tested against the functions).
PROXY_FUNCTIONS = {"proxy_anchor": losses.proxy_anchor_loss, "proxy_nca": losses.proxy_nca_loss,
                   "normalized_softmax": losses.normalized_softmax_loss, "arcface": losses.arcface_loss,
                   "cosface": losses.cosface_loss}


def _tfdml_value_and_grads(name, batch):
    labels = np.asarray(batch["labels"], np.int32)
    embeddings = tf.constant(batch["embeddings"], tf.float64)
    watched = [embeddings]
    if REFERENCE["losses"][name]["proxies"]:
        proxies = tf.constant(batch["proxies"], tf.float64)
        watched.append(proxies)
        loss = lambda y, x: PROXY_FUNCTIONS[name](y, x, proxies)  # noqa: E731
    else:
        loss = _make(name)
    with tf.GradientTape() as tape:
        tape.watch(watched)
        value = loss(labels, embeddings)
    grads = tape.gradient(value, watched)
    return value.numpy(), [np.zeros(w.shape) if g is None else g.numpy() for g, w in zip(grads, watched)]


@pytest.mark.parametrize("name,batch_name", CASES)
def test_value_and_gradients_equal_pytorch_metric_learning(name, batch_name):
    expected = REFERENCE["losses"][name]["cases"][batch_name]
    batch = REFERENCE["batches"][batch_name]
    value, grads = _tfdml_value_and_grads(name, batch)
    np.testing.assert_allclose(value, expected["value"], rtol=VALUE_RTOL, atol=1e-12)
    np.testing.assert_allclose(grads[0], expected["grad_embeddings"], rtol=0, atol=GRAD_ATOL)
    if REFERENCE["losses"][name]["proxies"]:
        np.testing.assert_allclose(grads[1], expected["grad_proxies"], rtol=0, atol=GRAD_ATOL)


def test_reference_file_is_from_pml_2_9_and_covers_every_loss():
    assert REFERENCE["pml_version"].startswith("2.9")
    assert sorted(REFERENCE["losses"]) == sorted(PAIR + PROXY)
    nonzero = [c["value"] for spec in REFERENCE["losses"].values() for c in spec["cases"].values() if c["value"]]
    assert len(nonzero) >= 40  # the cases are not all trivial zeros


@pytest.mark.parametrize("name", PROXY)
def test_loss_class_with_its_proxy_variable_equals_the_function(name):
    batch = REFERENCE["batches"]["class_balanced"]
    expected = REFERENCE["losses"][name]["cases"]["class_balanced"]
    labels, embeddings = np.asarray(batch["labels"], np.int32), tf.constant(batch["embeddings"], tf.float32)
    loss = _make(name, batch["num_classes"], embeddings.shape[1])
    loss.proxies.assign(np.asarray(batch["proxies"], np.float32))
    with tf.GradientTape() as tape:
        tape.watch(embeddings)
        value = loss(labels, embeddings)
    grad_x, grad_p = tape.gradient(value, [embeddings, loss.proxies])
    np.testing.assert_allclose(value.numpy(), expected["value"], rtol=2e-6)
    np.testing.assert_allclose(grad_x.numpy(), expected["grad_embeddings"], rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(grad_p.numpy(), expected["grad_proxies"], rtol=1e-4, atol=2e-5)
