"""Tuple listing (`tfdml.ops.tuples`) and the tuple losses' per-tuple terms against brute-force NumPy
references."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tfdml.losses import ContrastiveLoss, MarginLoss, TripletLoss
from tfdml.ops import pair_indices_with_targets, triplet_indices


def _brute_triplets(labels):
    n = len(labels)
    return [
        (a, p, q)
        for a in range(n)
        for p in range(n)
        for q in range(n)
        if a != p and labels[a] == labels[p] and labels[a] != labels[q]
    ]


def _brute_pairs(labels):
    return [(i, j) for i, j in itertools.combinations(range(len(labels)), 2)], [
        labels[i] == labels[j] for i, j in itertools.combinations(range(len(labels)), 2)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_triplet_indices_lists_every_valid_triplet_in_order(seed):
    labels = np.random.default_rng(seed).integers(0, 4, size=9)
    got = triplet_indices(tf.constant(labels)).numpy()
    assert got.dtype == np.int32
    assert [tuple(t) for t in got] == _brute_triplets(labels)


def test_pairs_list_every_unordered_pair_with_its_target():
    labels = np.array([0, 1, 0, 2, 1, 1])
    pairs, positive = pair_indices_with_targets(tf.constant(labels))
    expected_pairs, expected_positive = _brute_pairs(labels)
    assert [tuple(p) for p in pairs.numpy()] == expected_pairs
    assert positive.numpy().tolist() == expected_positive


def test_no_valid_tuple_gives_empty_index_arrays():
    assert triplet_indices(tf.constant([3, 3, 3])).shape == (0, 3)  # no negatives
    assert triplet_indices(tf.constant([0, 1, 2])).shape == (0, 3)  # no positives
    pairs, positive = pair_indices_with_targets(tf.constant([5]))
    assert pairs.shape == (0, 2) and positive.shape == (0,)


def test_capped_tuples_are_a_seeded_ordered_subset():
    labels = tf.constant(np.repeat(np.arange(4), 4))
    every = [tuple(t) for t in triplet_indices(labels).numpy()]
    capped = triplet_indices(labels, max_tuples=50, seed=(7, 3)).numpy()
    assert capped.shape == (50, 3)
    rows = [tuple(t) for t in capped]
    assert set(rows) <= set(every) and len(set(rows)) == 50
    assert rows == sorted(rows, key=every.index)  # original order kept
    again = triplet_indices(labels, max_tuples=50, seed=(7, 3)).numpy()
    other = triplet_indices(labels, max_tuples=50, seed=(7, 4)).numpy()
    np.testing.assert_array_equal(capped, again)
    assert not np.array_equal(capped, other)
    assert triplet_indices(labels, max_tuples=10_000, seed=1).shape[0] == len(every)
    with pytest.raises(ValueError, match="max_tuples"):
        triplet_indices(labels, max_tuples=0)


def _embeddings(seed, n=8, dim=3):
    x = np.random.default_rng(seed).normal(size=(n, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _terms_by_tuple(terms):
    return {tuple(t): v for t, v in zip(terms.indices.numpy(), terms.values.numpy())}


def test_triplet_and_margin_terms_match_numpy():
    f = _embeddings(0)
    labels = np.array([0, 0, 1, 1, 2, 2, 0, 1])
    triplets = np.array(_brute_triplets(labels))
    d = lambda i, j: np.linalg.norm(f[i] - f[j], axis=1)  # noqa: E731
    d_ap, d_an = d(triplets[:, 0], triplets[:, 1]), d(triplets[:, 0], triplets[:, 2])
    y, x = tf.constant(labels, tf.int32), tf.constant(f)
    for loss, expected in (
        (TripletLoss(margin=0.3), np.maximum(d_ap - d_an + 0.3, 0)),
        (TripletLoss(margin=0.3, squared=True), np.maximum(d_ap**2 - d_an**2 + 0.3, 0)),  # DML-ALA eq 4
        (
            MarginLoss(alpha=0.2, beta=1.1, sampling="all"),
            np.maximum(d_ap - 1.1 + 0.2, 0) + np.maximum(1.1 - d_an + 0.2, 0),
        ),
    ):
        got = _terms_by_tuple(loss.terms(y, x))
        assert set(got) == {tuple(t) for t in triplets}
        np.testing.assert_allclose([got[tuple(t)] for t in triplets], expected, atol=1e-7)  # squared: Gram form
        assert (expected > 0).any() and (expected == 0).any()


def test_contrastive_terms_match_numpy():
    f = _embeddings(1)
    labels = np.array([0, 0, 1, 1, 2, 2, 0, 1])
    pairs, positive = _brute_pairs(labels)
    pairs, positive = np.array(pairs), np.array(positive)
    d = np.linalg.norm(f[pairs[:, 0]] - f[pairs[:, 1]], axis=1)
    expected = np.where(positive, np.maximum(d - 0.1, 0), np.maximum(1.2 - d, 0))
    got = _terms_by_tuple(
        ContrastiveLoss(pos_margin=0.1, neg_margin=1.2).terms(tf.constant(labels, tf.int32), tf.constant(f))
    )
    np.testing.assert_allclose([got[tuple(p)] for p in pairs], expected, atol=1e-12)


def test_terms_have_finite_gradients_on_identical_embeddings():
    f = tf.constant(np.ones((4, 3)) / np.sqrt(3.0))
    labels = tf.constant([0, 0, 1, 1])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(f)
        values = [
            tf.reduce_sum(loss.terms(labels, f).values)
            for loss in (TripletLoss(), MarginLoss(sampling="all"), ContrastiveLoss(), TripletLoss(mining="hard"))
        ]
    for value in values:
        assert np.isfinite(value.numpy())
        assert np.isfinite(tape.gradient(value, f).numpy()).all()


def test_plot_ala_weights_writes_the_four_panels(tmp_path):
    from tfdml.plots import plot_ala_weights

    logs = [
        {
            "weight_mean": 0.5 - 0.01 * i,
            "weight_variance": 1e-4 * i,
            "hardness": 0.6 - 0.01 * i,
            "weighted_hardness": 0.3 - 0.004 * i,
        }
        for i in range(5)
    ]
    path = plot_ala_weights(logs, tmp_path / "fig4.png")
    assert (tmp_path / "fig4.png").stat().st_size > 1000 and str(path).endswith("fig4.png")
    with pytest.raises(ValueError, match="weight_variance"):
        plot_ala_weights({"loss": [1.0]}, tmp_path / "bad.png")


def test_plot_ala_weights_draws_weight_against_hardness(tmp_path):
    from tfdml.plots import plot_ala_weights

    rng = np.random.default_rng(0)
    hardness, weights = rng.uniform(0.2, 1.5, 50), rng.uniform(0.5, 1.5, 50)
    groups = np.where(rng.random(50) < 0.3, "corrupted", "clean")
    logs = {"weight_mean": [0.5, 0.5], "weight_variance": [0.01, 0.02]}
    plot_ala_weights(logs, tmp_path / "both.png", weights=weights, hardness=hardness, groups=groups)
    plot_ala_weights(None, tmp_path / "scatter.png", weights=weights, hardness=hardness)
    only_logs = tmp_path / "logs.png"
    plot_ala_weights(logs, only_logs)
    # One more panel: a wider figure than the two log panels alone.
    from PIL import Image

    widths = {}
    for name in ("both", "scatter", "logs"):
        with Image.open(tmp_path / f"{name}.png") as image:  # closed: an open file is a ResourceWarning
            widths[name] = image.size[0]
    assert widths["both"] > widths["logs"] > widths["scatter"] > 100
    with pytest.raises(ValueError, match="one value per tuple"):
        plot_ala_weights(None, tmp_path / "bad.png", weights=weights, hardness=hardness[:10])
    with pytest.raises(ValueError, match="both weights and hardness"):
        plot_ala_weights(None, tmp_path / "bad.png", weights=weights)
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_ala_weights(None, tmp_path / "bad.png")
