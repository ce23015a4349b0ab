"""Per-tuple terms of the tuple losses and the shared reduction (`tfdml.ops.terms`).

With every weight 1, `reduce_terms(loss.terms(...))` is the loss's own value and gradient (the losses' values
are checked against pytorch-metric-learning and tensorflow-addons elsewhere); with weights, the reduction is
the weighted mean of the module docstring, read here in NumPy from the listed terms.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfdml.losses import ContrastiveLoss, MarginLoss, TripletLoss
from tfdml.ops import TupleTerms, reduce_terms, term_coefficients

LOSSES = [
    ("contrastive", lambda: ContrastiveLoss(pos_margin=0.1, neg_margin=0.9)),
    ("contrastive_defaults", lambda: ContrastiveLoss()),
    ("triplet_all", lambda: TripletLoss(margin=0.3)),
    ("triplet_all_squared", lambda: TripletLoss(margin=0.3, squared=True)),
    ("triplet_all_soft", lambda: TripletLoss(margin=0.3, soft=True)),
    ("triplet_semi_hard", lambda: TripletLoss(margin=0.4, mining="semi_hard")),
    ("triplet_semi_hard_soft", lambda: TripletLoss(margin=0.4, mining="semi_hard", soft=True)),
    ("triplet_hard", lambda: TripletLoss(margin=0.3, mining="hard")),
    ("triplet_hard_soft", lambda: TripletLoss(margin=0.3, mining="hard", soft=True)),
    ("margin_all", lambda: MarginLoss(alpha=0.2, beta=1.1, sampling="all", nu=0.1)),
    ("margin_distance_weighted", lambda: MarginLoss(alpha=0.2, beta=1.1, seed=3, nu=0.1)),
    ("margin_per_class", lambda: MarginLoss(beta=1.0, num_classes=5, sampling="all", nu=0.05)),
    ("margin_fixed_beta", lambda: MarginLoss(beta=0.9, learn_beta=False, seed=4)),
]


def _batch(seed, classes=5, per_class=3, dim=6):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), per_class).astype(np.int32)
    rng.shuffle(labels)
    x = rng.normal(size=(labels.size, dim))
    return tf.constant(labels), tf.constant(x / np.linalg.norm(x, axis=1, keepdims=True))


@pytest.mark.parametrize("name, make", LOSSES, ids=[n for n, _ in LOSSES])
@pytest.mark.parametrize("seed", [0, 1])
def test_uniform_weights_give_the_loss_value_and_gradient(name, make, seed):
    loss = make()
    labels, embeddings = _batch(seed)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(embeddings)
        expected = loss.compute(labels, embeddings)
        terms = loss.terms(labels, embeddings)
        got = reduce_terms(terms)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        tape.gradient(got, embeddings).numpy(), tape.gradient(expected, embeddings).numpy(), rtol=1e-9, atol=1e-12
    )
    for variable in loss.trainable_variables:
        np.testing.assert_allclose(
            tape.gradient(got, variable).numpy(), tape.gradient(expected, variable).numpy(), rtol=1e-6, atol=1e-7
        )


def test_tuples_are_the_ones_the_mining_defines():
    labels, embeddings = _batch(2)
    y = labels.numpy()
    d = np.linalg.norm(embeddings.numpy()[:, None] - embeddings.numpy()[None], axis=-1)
    triplets = TripletLoss(mining="all").terms(labels, embeddings).indices.numpy()
    expected = {
        (a, p, n)
        for a in range(y.size)
        for p in range(y.size)
        for n in range(y.size)
        if a != p and y[a] == y[p] and y[a] != y[n]
    }
    assert {tuple(t) for t in triplets} == expected and len(triplets) == len(expected)
    semi = TripletLoss(margin=0.4, mining="semi_hard").terms(labels, embeddings).indices.numpy()
    assert {tuple(t) for t in semi} == {t for t in expected if d[t[0], t[1]] < d[t[0], t[2]] < d[t[0], t[1]] + 0.4}
    hard = TripletLoss(mining="hard").terms(labels, embeddings).indices.numpy()
    for a, p, n in hard:
        assert d[a, p] == max(d[a, q] for q in range(y.size) if q != a and y[q] == y[a])
        assert d[a, n] == min(d[a, q] for q in range(y.size) if y[q] != y[a])
    pairs = ContrastiveLoss().terms(labels, embeddings)
    assert {tuple(t) for t in pairs.indices.numpy()} == {(i, j) for i in range(y.size) for j in range(i + 1, y.size)}
    np.testing.assert_array_equal(
        pairs.groups.numpy(), np.where(y[pairs.indices[:, 0]] == y[pairs.indices[:, 1]], 0, 1)
    )


def _numpy_weighted(values, divisors, groups, weights):
    total = 0.0
    for g in np.unique(groups):
        inside = groups == g
        denominator = np.sum(weights[inside] * divisors[inside])
        total += np.sum(weights[inside] * values[inside]) / denominator if denominator else 0.0
    return total


@pytest.mark.parametrize("name, make", LOSSES, ids=[n for n, _ in LOSSES])
def test_weighted_reduction_is_the_weighted_mean(name, make):
    labels, embeddings = _batch(5)
    terms = make().terms(labels, embeddings)
    values = terms.values.numpy()
    divisors = terms.term_divisors().numpy()
    groups = np.zeros(values.size, int) if terms.groups is None else terms.groups.numpy()
    rng = np.random.default_rng(0)
    weights = rng.uniform(0.0, 2.0, values.size) * (rng.uniform(size=values.size) > 0.3)
    extra = 0.0 if terms.extra is None else float(terms.extra)
    expected = _numpy_weighted(values, divisors, groups, weights) + extra
    np.testing.assert_allclose(reduce_terms(terms, weights).numpy(), expected, rtol=1e-12)
    # A common scale of the weights changes nothing; a weight 0 removes the tuple from the sum and the count.
    np.testing.assert_allclose(reduce_terms(terms, 7.0 * weights).numpy(), expected, rtol=1e-12)
    kept = weights > 0
    expected_kept = _numpy_weighted(values[kept], divisors[kept], groups[kept], weights[kept]) + extra
    np.testing.assert_allclose(expected, expected_kept, rtol=1e-12)
    coefficients = term_coefficients(terms, weights).numpy()
    np.testing.assert_allclose(np.sum(coefficients * values) + extra, expected, rtol=1e-12)


def test_terms_reject_inconsistent_reductions_by_name():
    values, indices = tf.zeros([2]), tf.zeros([2, 2], tf.int32)
    with pytest.raises(ValueError, match="reduction must be one of"):
        TupleTerms(values, indices, "pair", "median")
    with pytest.raises(ValueError, match="kind must be one of"):
        TupleTerms(values, indices, "quadruplet", "mean")
    with pytest.raises(ValueError, match='divisors with reduction="divisor"'):
        TupleTerms(values, indices, "pair", "divisor")
    with pytest.raises(ValueError, match="weights must be one value per term"):
        reduce_terms(TupleTerms(values, indices, "pair", "mean"), tf.ones([2, 1]))


def test_losses_without_tuples_say_so():
    from tfdml.losses import RankedListLoss

    with pytest.raises(TypeError, match="RankedListLoss does not list per-tuple terms"):
        RankedListLoss().terms(*_batch(0))
