"""The losses ported from pytorch-metric-learning (PML 2.9): values and gradients equal to PML's on the reference
vectors of `tests/references/pml_reference.json` (written by `tests/references/generators/pml_reference.py`),
NumPy readings of the papers' formulas where PML's choices differ, finite values on degenerate batches, clear
errors, configs, XLA and O(B^2) graphs."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdml.losses as losses
from tests import REFERENCES
from tests import loss_checks as checks

with open(os.path.join(REFERENCES, "pml_reference.json")) as _reference:
    REFERENCE = json.load(_reference)
# float64 on both sides: what is left is summation order and libm round-off.
VALUE_RTOL, GRAD_ATOL = 1e-10, 1e-10

PAIR = [
    "multi_similarity_mined",
    "multi_similarity_all_pairs",
    "circle",
    "lifted_structure",
    "n_pairs",
    "supcon",
    "ntxent",
]
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
PROXY_FUNCTIONS = {
    "proxy_anchor": losses.proxy_anchor_loss,
    "proxy_nca": losses.proxy_nca_loss,
    "normalized_softmax": losses.normalized_softmax_loss,
    "arcface": losses.arcface_loss,
    "cosface": losses.cosface_loss,
}


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


# ---------------------------------------------------------------- every loss: robustness, config, XLA, memory
def _all_losses(num_classes=4, embedding_dim=4):
    return {
        name: _make(name, num_classes, embedding_dim) if REFERENCE["losses"][name]["proxies"] else _make(name)
        for name in PAIR + PROXY
    }


@pytest.mark.parametrize("name", PAIR + PROXY)
@pytest.mark.parametrize("case", sorted(checks.DEGENERATE_BATCHES))
def test_degenerate_batches_are_finite(name, case):
    labels, embeddings = checks.DEGENERATE_BATCHES[case]
    loss = _all_losses(6, 4)[name]
    checks.assert_finite(loss, labels, embeddings)
    if REFERENCE["losses"][name]["proxies"]:
        with tf.GradientTape() as tape:
            value = loss(labels, embeddings.astype(np.float32))
        assert np.all(np.isfinite(tape.gradient(value, loss.proxies).numpy()))


@pytest.mark.parametrize(
    "name",
    [
        "circle",
        "supcon",
        "ntxent",
        "multi_similarity_all_pairs",
        "arcface",
        "cosface",
        "proxy_anchor",
        "normalized_softmax",
    ],
)
def test_extreme_scales_stay_finite(name):
    """Large scales / small temperatures (exp(1000 x)) on near-duplicate and opposite embeddings."""
    extreme = {
        "circle": {"gamma": 1000.0},
        "supcon": {"temperature": 1e-3},
        "ntxent": {"temperature": 1e-3},
        "multi_similarity_all_pairs": {"beta": 1000.0, "alpha": 1000.0},
        "arcface": {"scale": 1000.0},
        "cosface": {"scale": 1000.0},
        "proxy_anchor": {"alpha": 1000.0},
        "normalized_softmax": {"temperature": 1e-3},
    }[name]
    labels = np.array([0, 0, 1, 1, 2, 2], np.int32)
    embeddings = np.array([[1, 0, 0], [1, 1e-4, 0], [-1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1e-3]], np.float32)
    loss = _make(name, 3, 3, **extreme) if REFERENCE["losses"][name]["proxies"] else _make(name, **extreme)
    value, _ = checks.assert_finite(loss, labels, embeddings)
    assert value.numpy() >= 0


@pytest.mark.parametrize("name", PAIR + PROXY)
def test_bad_inputs_are_rejected(name):
    checks.assert_bad_inputs_rejected(_all_losses(4, 3)[name])


@pytest.mark.parametrize("name", PROXY)
def test_proxy_losses_reject_labels_outside_their_classes_and_wrong_dimensions(name):
    loss = _all_losses(3, 4)[name]
    x = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be < num_classes=3"):
        loss(np.array([0, 1, 2, 3], np.int32), x)
    with pytest.raises(tf.errors.InvalidArgumentError, match="labels must be >= 0"):
        loss(np.array([0, 1, -1, 2], np.int32), x)
    with pytest.raises(ValueError, match="embeddings have dimension 5 but the proxies have embedding_dim=4"):
        loss(np.array([0, 1, 2, 2], np.int32), np.zeros((4, 5), np.float32))


@pytest.mark.parametrize("name", PAIR + PROXY)
def test_config_round_trips(name):
    loss = _all_losses(5, 3)[name]
    restored = checks.assert_config_roundtrip(loss)
    assert restored.name == loss.name


def test_proxy_optimizer_and_initializer_round_trip_through_config():
    loss = losses.ProxyAnchorLoss(
        7,
        3,
        proxy_optimizer=keras.optimizers.AdamW(0.01),
        proxy_initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=1),
    )
    restored = checks.assert_config_roundtrip(loss)
    assert isinstance(restored.variable_optimizer, keras.optimizers.AdamW)
    assert float(restored.variable_optimizer.learning_rate) == pytest.approx(0.01)
    assert np.abs(restored.proxies.numpy()).max() <= 0.1


@pytest.mark.slow
@pytest.mark.parametrize("name", PAIR + PROXY)
def test_jit_compile_matches_eager(name):
    labels, x = checks.random_batch(4, 14, 4, dim=4)
    loss = _all_losses()[name]
    # float64: with scales such as gamma = 80 float32 round-off differs between XLA and eager kernels.
    checks.assert_jit_matches_eager(loss, labels, x, rtol=1e-7)


@pytest.mark.parametrize("name", ["multi_similarity_mined", "circle", "supcon", "proxy_anchor", "arcface"])
def test_float16_and_mixed_precision(name):
    checks.assert_float16_ok(_all_losses()[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", PAIR + PROXY)
def test_no_tensor_larger_than_batch_squared(name):
    """B = 64 samples of 16 classes, D = 8: no op output (gradient included) exceeds B^2 elements."""
    loss = _all_losses(16, 8)[name]
    largest, _ = checks.largest_tensor_in_graph(lambda y, x: loss(y, x), 64)
    assert largest <= 64 * 64


def test_proxy_initialisation_follows_pml():
    """Proxy-Anchor: Kaiming normal (fan-out = num_classes), the others N(0, 1), on [num_classes, D]."""
    anchor = losses.ProxyAnchorLoss(200, 300).proxies.numpy()
    assert anchor.shape == (200, 300)
    assert abs(anchor.std() - np.sqrt(2.0 / 200)) < 0.01 * np.sqrt(2.0 / 200) * 5
    for cls in (losses.ProxyNCALoss, losses.NormalizedSoftmaxLoss, losses.ArcFaceLoss, losses.CosFaceLoss):
        proxies = cls(200, 300).proxies.numpy()
        assert abs(proxies.std() - 1.0) < 0.02 and abs(proxies.mean()) < 0.02


# ------------------------------------------------- where PML's choices differ: NumPy readings of the papers
def _ms_paper(sim, pos, neg, alpha=2.0, beta=50.0, base=0.5):
    """Multi-Similarity, eq. 9 of Wang et al. 2019, averaged over all anchors (PML's MeanReducer)."""
    rows = []
    for i in range(len(sim)):
        p = np.log1p(np.sum(np.exp(-alpha * (sim[i, pos[i]] - base)))) / alpha
        n = np.log1p(np.sum(np.exp(beta * (sim[i, neg[i]] - base)))) / beta
        rows.append(p + n)
    return np.mean(rows)


def test_multi_similarity_keeps_a_single_mined_pair_where_pml_returns_zero():
    """Cosines S01 = 0.5, S02 = 0.45, S12 = 0: mining keeps (0, 1) and (0, 2) only. PML 2.9 returns 0 for a mined
    set of at most one positive and one negative pair (its `all(len(x) <= 1)` emptiness test); the paper's loss
    and tfdml's are not 0."""
    x2 = np.array([0.45, -0.225 / np.sqrt(0.75), 0.0])
    x2[2] = np.sqrt(1.0 - x2[0] ** 2 - x2[1] ** 2)
    x = np.array([[1.0, 0.0, 0.0], [0.5, np.sqrt(0.75), 0.0], x2])
    labels = np.array([0, 0, 1], np.int32)
    sim = x @ x.T
    pos = np.zeros((3, 3), bool)
    neg = np.zeros((3, 3), bool)
    pos[0, 1] = neg[0, 2] = True  # the mined pairs
    expected = _ms_paper(sim, pos, neg)
    assert expected > 0.1
    np.testing.assert_allclose(losses.multi_similarity_loss(labels, x).numpy(), expected, rtol=1e-12)


def test_ntxent_does_not_saturate_where_pml_adds_its_tiny_constant():
    """PML computes -log(ratio + tiny); when the ratio underflows (t = 1e-3, a positive pair at cosine -1 with a
    negative at cosine 1) it saturates at -log(tiny): 87.3 in float32, 708.4 in float64 (PML's mean: 44.01 and
    354.54). tfdml computes softplus(logsumexp(negatives) - positive), the formula's exact value."""
    x = np.array([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0]])
    labels = np.array([0, 0, 1], np.int32)
    t = 1e-3
    sim = x @ x.T
    pair_01 = np.logaddexp(0.0, (sim[0, 2] - sim[0, 1]) / t)  # -log(e^{s01/t} / (e^{s01/t} + e^{s02/t}))
    pair_10 = np.logaddexp(0.0, (sim[1, 2] - sim[1, 0]) / t)
    expected = (pair_01 + pair_10) / 2
    assert expected > 1000
    for dtype in (np.float32, np.float64):
        np.testing.assert_allclose(
            losses.ntxent_loss(labels, x.astype(dtype), temperature=t).numpy(), expected, rtol=1e-6
        )


def test_n_pairs_with_plain_inner_products_follows_the_paper():
    """`normalize=False`: Sohn 2016's (N+1)-tuplet loss on raw inner products (PML's default normalises);
    l_i = log(1 + sum_{j != i} exp(f_i . f_j+ - f_i . f_i+)) with one (anchor, positive) per class."""
    rng = np.random.default_rng(7)
    labels = np.array([2, 0, 1, 0, 2, 1, 1, 3], np.int32)  # class 3 has a single sample: no tuple
    x = rng.normal(size=(8, 5))
    anchors, positives = [0, 1, 2], [4, 3, 5]  # first and second sample of classes 2, 0, 1
    expected = np.mean(
        [
            np.log1p(sum(np.exp(x[a] @ x[p] - x[a] @ x[positives[i]]) for p in positives if p != positives[i]))
            for i, a in enumerate(anchors)
        ]
    )
    np.testing.assert_allclose(losses.n_pairs_loss(labels, x, normalize=False).numpy(), expected, rtol=1e-12)
    checks.assert_gradient_matches(
        lambda y, e: losses.n_pairs_loss(y, e, normalize=False),
        lambda e: np.mean(
            [
                np.log1p(sum(np.exp(e[a] @ e[p] - e[a] @ e[positives[i]]) for p in positives if p != positives[i]))
                for i, a in enumerate(anchors)
            ]
        ),
        labels,
        x,
    )


def test_arcface_gradient_is_finite_for_an_embedding_on_its_class_weight():
    """PML's arccos gives NaN gradients at cos = 1 (an embedding equal to its class weight); tfdml's
    `cos m cos - sin m sqrt(1 - cos^2)` has the same value and a finite gradient."""
    proxies = np.eye(2, 3)
    x = tf.constant(np.eye(2, 3))
    labels = np.array([0, 1], np.int32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = losses.arcface_loss(labels, x, proxies)
    grad = tape.gradient(value, x).numpy()
    m = np.radians(28.6)
    logits = 64 * np.array([np.cos(m), 0.0])
    np.testing.assert_allclose(value.numpy(), np.logaddexp.reduce(logits) - logits[0], rtol=1e-9, atol=1e-20)
    assert np.all(np.isfinite(grad))
