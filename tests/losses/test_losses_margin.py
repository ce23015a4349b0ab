"""Margin loss (Wu et al. 2017): values vs NumPy and the shared reference data, gradients vs finite
differences, the distance-weighted sampler's distribution, degenerate batches, errors, XLA, config."""

import hypothesis.extra.numpy as hnp
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st

from tests import loss_checks as checks
from tests.backend_neutral.reference_cases import PML_MARGIN_PER_CLASS_NU
from tests.references import numpy_margin_group as ref
from tests.references import official_reference_cases, shared_reference_cases
from tests.references.numpy_losses import numerical_gradient
from tfdml.losses import MarginLoss, margin_loss, margin_loss_for_triplets
from tfdml.losses.margin import (
    distance_weighted_log_weights,
    distance_weighted_probabilities,
    sample_distance_weighted_triplets,
)


def _batch(seed, batch=None, dim=6, classes=None, normalise=True):
    rng = np.random.default_rng(seed)
    batch = batch or int(rng.integers(5, 16))
    classes = classes or int(rng.integers(2, 5))
    labels = rng.integers(0, classes, size=batch).astype(np.int32)  # unequal class counts
    f = rng.normal(size=(batch, dim))
    if normalise:
        f /= np.linalg.norm(f, axis=1, keepdims=True)
    return labels, f


def _reference_cases():
    return shared_reference_cases("MarginLoss")


@pytest.mark.parametrize("case,expected", list(_reference_cases()))
def test_matches_shared_reference_data(case, expected):
    params = dict(expected["params"])
    loss = MarginLoss(**params)
    value = loss(np.array(case["labels"]), np.array(case["embeddings"], dtype=np.float64))
    np.testing.assert_allclose(value.numpy(), expected["value"], rtol=1e-9)


def test_per_class_regulariser_matches_pytorch_metric_learning():
    cases = [case for case, _ in shared_reference_cases("MarginLoss")]
    for case, expected in zip(cases, PML_MARGIN_PER_CLASS_NU):
        loss = MarginLoss(sampling="all", nu=0.1, num_classes=10, learn_beta=True)
        value = loss(np.array(case["labels"]), np.array(case["embeddings"], dtype=np.float64))
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6)


def test_constant_beta_is_not_regularised():
    """Official code and pytorch-metric-learning add nu * beta only for a learned beta."""
    labels, f = _batch(3, batch=12, classes=3)
    for num_classes in (None, 3):
        plain = MarginLoss(sampling="all", num_classes=num_classes, learn_beta=False)(labels, f).numpy()
        with_nu = MarginLoss(sampling="all", num_classes=num_classes, learn_beta=False, nu=0.5)(labels, f)
        assert with_nu.numpy() == plain
        learned = MarginLoss(sampling="all", num_classes=num_classes, nu=0.5)(labels, f).numpy()
        assert learned > plain + 0.1  # the learned beta (1.2) is regularised


# ------------------------------------------------------------------ distance-weighted sampling vs official


@pytest.mark.parametrize(
    "case", official_reference_cases("margin_sampling_probabilities"), ids=lambda case: f"dim{case['dim']}"
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sampling_probabilities_match_official_sampler(case, dtype):
    """Wu et al.'s DistanceWeightedSampling (MXNet), per-anchor probabilities on fixed inputs."""
    expected = np.array(case["probabilities"])
    labels, f = np.array(case["labels"]), np.array(case["embeddings"], dtype)
    assert f.shape[1] == case["dim"]
    probabilities = distance_weighted_probabilities(labels, f, case["cutoff"], case["nonzero_loss_cutoff"])
    np.testing.assert_allclose(probabilities.numpy(), expected, atol=1e-6 if dtype == np.float64 else 2e-5)


@pytest.mark.parametrize(
    "case", official_reference_cases("margin_sampling_probabilities"), ids=lambda case: f"dim{case['dim']}"
)
def test_sampler_draws_follow_official_probabilities(case):
    """The in-graph draws (tf.random.categorical) of the sampler follow the official distribution."""
    expected = np.array(case["probabilities"])
    labels, f = np.array(case["labels"], np.int32), np.array(case["embeddings"])
    triplets, valid = sample_distance_weighted_triplets(
        tf.constant(labels), tf.constant(ref.distances(f)), case["dim"], seed=11
    )
    assert valid.numpy().all()
    anchors = triplets.numpy()[:, 0]
    draws = 400
    logits = distance_weighted_log_weights(
        tf.constant(ref.distances(f)), tf.constant(labels[:, None] != labels[None, :]), case["dim"]
    )
    samples = tf.random.stateless_categorical(logits, draws, seed=[5, 6]).numpy()
    counts = np.stack([np.bincount(row, minlength=len(labels)) for row in samples]) / draws
    total_variation = 0.5 * np.abs(counts - expected).sum(axis=1)
    assert total_variation.mean() < 0.1  # sampling noise at 400 draws: ~0.05; inverted weights give ~0.45
    assert all(expected[a, n] > 0 for a, n in zip(anchors, triplets.numpy()[:, 2]))


def _random_unit_batch(seed, classes=32, per_class=4, dim=128):
    rng = np.random.default_rng(seed)
    f = rng.normal(size=(classes * per_class, dim))
    return np.repeat(np.arange(classes), per_class).astype(np.int32), f / np.linalg.norm(f, axis=1, keepdims=True)


def test_sampled_negatives_lean_towards_near_ones_in_high_dimension():
    """Sampling matters (Wu et al. Fig. 3): in 128-D, uniform points sit near sqrt(2) from each other; 1/q
    weights spread the draws over [0.5, 1.4) and favour the NEAR eligible negatives. Measured on the drawn
    triplets only (no probability formula): the mean distance of the sampled negatives lies below the mean
    of the eligible ones, and most draws fall in the nearer half of each anchor's eligible negatives
    (official sampler: 0.79 of the mass; drawing ~ q(d) instead gives 0.33)."""
    labels, f = _random_unit_batch(0)
    d = ref.distances(f)
    eligible = (labels[:, None] != labels[None, :]) & (d < 1.4)
    sampled, uniform, nearer_half = [], [], []
    for seed in range(10):
        triplets, valid = sample_distance_weighted_triplets(tf.constant(labels), tf.constant(d), 128, seed=seed)
        for a, _, n in triplets.numpy()[valid.numpy()]:
            assert eligible[a, n]
            sampled.append(d[a, n])
            uniform.append(d[a][eligible[a]].mean())
            nearer_half.append(d[a, n] <= np.median(d[a][eligible[a]]))
    assert np.mean(sampled) < np.mean(uniform) - 0.005
    assert np.mean(nearer_half) > 0.65


@pytest.mark.parametrize("seed", range(12))
def test_all_triplets_matches_numpy(seed):
    labels, f = _batch(seed)
    rng = np.random.default_rng(100 + seed)
    beta, alpha, nu = rng.uniform(0.6, 1.4), rng.uniform(0.05, 0.4), rng.uniform(0, 0.3)
    value = margin_loss(tf.constant(labels), f, beta, alpha=alpha, nu=nu, sampling="all").numpy()
    expected = ref.margin_loss_all(labels, f, beta, alpha=alpha, nu=nu)
    np.testing.assert_allclose(value, expected, rtol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_per_class_beta_matches_numpy(seed):
    labels, f = _batch(seed, classes=4)
    beta = np.random.default_rng(seed).uniform(0.8, 1.4, size=4)
    value = margin_loss(tf.constant(labels), f, beta, nu=0.1, sampling="all").numpy()
    np.testing.assert_allclose(value, ref.margin_loss_all(labels, f, beta, nu=0.1), rtol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_distance_weighted_value_matches_numpy_on_its_triplets(seed):
    labels, f = _batch(seed, batch=13, dim=8)
    distances = tf.constant(ref.distances(f))
    triplets, valid = sample_distance_weighted_triplets(tf.constant(labels), distances, 8, seed=seed)
    triplets, valid = triplets.numpy(), valid.numpy()
    ordered_pairs = [(a, p) for a in range(13) for p in range(13) if a != p and labels[a] == labels[p]]
    assert [tuple(t[:2]) for t in triplets] == ordered_pairs  # one negative per anchor-positive pair
    kept = [tuple(t) for t, v in zip(triplets, valid) if v]
    for a, _, n in kept:
        assert labels[n] != labels[a]
    value = margin_loss(tf.constant(labels), f, 1.1, nu=0.05, seed=seed).numpy()
    np.testing.assert_allclose(value, ref.margin_loss_triplets(labels, f, kept, 1.1, nu=0.05), rtol=1e-6)


def test_sampler_distribution_matches_inverse_density_weights():
    # Anchor 0 with negatives spread over [0.2, 1.9]: some below the 0.5 clip, some beyond the 1.4 cutoff.
    dim, target = 8, np.array([0.2, 0.45, 0.7, 0.9, 1.1, 1.3, 1.5, 1.9])
    angles = 2 * np.arcsin(target / 2)
    f = np.zeros((len(target) + 2, dim))
    f[:2, 0] = 1.0  # anchor and its positive
    f[2:, 0], f[2:, 1] = np.cos(angles), np.sin(angles)
    labels = np.array([0, 0] + list(range(1, len(target) + 1)), dtype=np.int32)
    distances = tf.constant(ref.distances(f))
    logits = distance_weighted_log_weights(distances, tf.constant(labels[:, None] != labels[None, :]), dim)
    draws = 40000
    samples = tf.random.stateless_categorical(logits[:1], draws, seed=[3, 4]).numpy()[0]
    counts = np.bincount(samples, minlength=len(labels))
    expected = ref.distance_weighted_probabilities(labels, f, 0)
    assert counts[0] == counts[1] == 0  # never the anchor or a positive
    assert np.all(counts[expected == 0] == 0)  # nothing at d >= 1.4
    support = expected > 0
    chi2 = np.sum((counts[support] - draws * expected[support]) ** 2 / (draws * expected[support]))
    assert chi2 < 25.0  # 5 degrees of freedom: p ~ 1e-4
    # Distances below the cutoff share the weight of the cutoff itself.
    np.testing.assert_allclose(expected[2], expected[3])


def test_sampler_falls_back_to_uniform_when_all_negatives_are_far():
    f = np.array([[1.0, 0, 0], [1.0, 0, 0], [-1.0, 0, 0], [-1.0, 0.01, 0], [-1.0, 0, 0.01]])
    labels = np.array([0, 0, 1, 2, 3], dtype=np.int32)
    logits = distance_weighted_log_weights(
        tf.constant(ref.distances(f)), tf.constant(labels[:, None] != labels[None, :]), 3
    )
    samples = tf.random.stateless_categorical(logits[:1], 6000, seed=[1, 2]).numpy()[0]
    counts = np.bincount(samples, minlength=5)
    assert counts[0] == counts[1] == 0
    np.testing.assert_allclose(counts[2:] / 6000, [1 / 3] * 3, atol=0.03)
    value = margin_loss(tf.constant(labels), f, 1.2, seed=0)
    assert np.isfinite(value.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_gradients_match_finite_differences(seed):
    labels, f = _batch(seed, batch=9, dim=4)
    beta = np.random.default_rng(seed).uniform(0.9, 1.3, size=4)

    graph_loss = tf.function(lambda emb, b: margin_loss(tf.constant(labels), emb, b, nu=0.2, sampling="all"))

    def loss_np(emb, b):
        return float(graph_loss(tf.constant(emb), tf.constant(b)).numpy())

    ft, bt = tf.constant(f), tf.constant(beta)
    with tf.GradientTape() as tape:
        tape.watch([ft, bt])
        value = margin_loss(tf.constant(labels), ft, bt, nu=0.2, sampling="all")
    grad_f, grad_b = tape.gradient(value, [ft, bt])
    np.testing.assert_allclose(grad_f.numpy(), numerical_gradient(lambda x: loss_np(x, beta), f), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad_b.numpy(), numerical_gradient(lambda b: loss_np(f, b), beta), rtol=1e-5, atol=1e-7)


def test_gradients_for_fixed_sampled_triplets_match_finite_differences():
    labels, f = _batch(7, batch=10, dim=5)
    triplets, valid = sample_distance_weighted_triplets(tf.constant(labels), tf.constant(ref.distances(f)), 5, seed=7)

    def loss_tf(emb):
        return margin_loss_for_triplets(tf.constant(labels), emb, triplets, 1.0, valid=valid)

    ft = tf.constant(f)
    with tf.GradientTape() as tape:
        tape.watch(ft)
        value = loss_tf(ft)
    grad = tape.gradient(value, ft).numpy()
    graph_loss = tf.function(loss_tf)
    np.testing.assert_allclose(
        grad, numerical_gradient(lambda x: float(graph_loss(tf.constant(x)).numpy()), f), rtol=1e-5, atol=1e-7
    )


@pytest.mark.parametrize("sampling", ["all", "distance_weighted"])
@pytest.mark.parametrize("case", sorted(checks.DEGENERATE_BATCHES) + ["float16"])
def test_degenerate_batches_are_finite(sampling, case):
    labels, f = checks.DEGENERATE_BATCHES["duplicates" if case == "float16" else case]
    dtype = tf.float16 if case == "float16" else tf.float64
    ft = tf.constant(f, dtype=dtype)
    loss = MarginLoss(sampling=sampling, num_classes=6, nu=0.1)
    with tf.GradientTape() as tape:
        tape.watch(ft)
        value = loss(labels, ft)
    grads = tape.gradient(value, [ft] + loss.trainable_variables)
    assert np.isfinite(value.numpy())
    for grad in grads:
        assert grad is None or np.all(np.isfinite(tf.convert_to_tensor(grad).numpy()))
    if case in ("one_class", "all_distinct", "single_sample"):  # no triplet at all
        assert value.numpy() == 0.0


@pytest.mark.slow
@given(
    labels=hnp.arrays(np.int32, st.integers(1, 12), elements=st.integers(0, 3)),
    data=st.data(),
    sampling=st.sampled_from(["all", "distance_weighted"]),
)
def test_fuzz_finite_nonnegative_with_finite_gradients(labels, data, sampling):
    f = data.draw(hnp.arrays(np.float64, (len(labels), 3), elements=st.floats(-2, 2, width=32)))
    ft = tf.constant(f)
    with tf.GradientTape() as tape:
        tape.watch(ft)
        value = margin_loss(tf.constant(labels), ft, 1.2, nu=0.0, sampling=sampling, seed=0)
    grad = tape.gradient(value, ft)
    assert np.isfinite(value.numpy()) and value.numpy() >= 0
    assert np.all(np.isfinite(grad.numpy()))


def test_bad_inputs_raise_clear_errors():
    labels, f = np.array([0, 0, 1, 1]), np.eye(4)
    with pytest.raises(ValueError, match="sampling must be one of"):
        MarginLoss(sampling="hard")
    with pytest.raises(ValueError, match="cutoff"):
        MarginLoss(cutoff=1.5, nonzero_loss_cutoff=1.4)
    with pytest.raises(ValueError, match="num_classes"):
        MarginLoss(num_classes=0)
    with pytest.raises(ValueError, match="sampling must be one of"):
        margin_loss(tf.constant(labels), f, 1.2, sampling="semi")
    with pytest.raises(TypeError, match="integer class ids"):
        MarginLoss()(labels.astype(np.float32), f)
    with pytest.raises(ValueError, match="must match"):
        MarginLoss()(labels[:3], f)
    with pytest.raises(ValueError, match="sample_weight"):
        MarginLoss()(labels, f, sample_weight=np.ones(4))
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_classes=2"):
        MarginLoss(num_classes=2)(np.array([0, 0, 2, 2]), f)
    with pytest.raises(ValueError, match="scalar or a \\[num_classes\\] vector"):
        margin_loss(tf.constant(labels), f, np.ones((2, 2)), sampling="all")
    # The public function validates its input like every loss.
    with pytest.raises(TypeError, match="integer class ids"):
        margin_loss(labels.astype(np.float32), f, 1.2)
    with pytest.raises(ValueError, match="labels has 3 entries but embeddings has 4 rows"):
        margin_loss(labels[:3], f, 1.2, sampling="all")
    with pytest.raises(ValueError, match="embeddings must have shape \\[batch, dim\\]"):
        margin_loss(labels, np.ones(4), 1.2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="embeddings contain NaN"):
        margin_loss(labels, np.full((4, 4), np.nan), 1.2)


@pytest.mark.slow
def test_jit_compile_gives_the_same_values():
    labels, f = _batch(5, batch=11, dim=6, classes=5)
    loss = MarginLoss(sampling="all", num_classes=5, learn_beta=False)
    compiled = tf.function(lambda y, x: loss(y, x), jit_compile=True)(tf.constant(labels), tf.constant(f))
    np.testing.assert_allclose(compiled.numpy(), loss(labels, f).numpy(), rtol=1e-9)

    # XLA has its own random-number generator: compare on the triplets it drew.
    @tf.function(jit_compile=True)
    def sampled(y, x):
        triplets, valid = sample_distance_weighted_triplets(y, tf.constant(ref.distances(f)), 6, seed=3)
        return triplets, valid, margin_loss_for_triplets(y, x, triplets, 1.2, valid=valid)

    triplets, valid, value = sampled(tf.constant(labels), tf.constant(f))
    kept = [tuple(t) for t, v in zip(triplets.numpy(), valid.numpy()) if v]
    assert kept and all(labels[a] == labels[p] != labels[n] for a, p, n in kept)
    np.testing.assert_allclose(value.numpy(), ref.margin_loss_triplets(labels, f, kept, 1.2), rtol=1e-9)


def test_config_round_trips():
    loss = MarginLoss(
        alpha=0.3,
        beta=1.1,
        nu=0.01,
        num_classes=7,
        learn_beta=False,
        beta_learning_rate=0.05,
        sampling="all",
        cutoff=0.4,
        nonzero_loss_cutoff=1.3,
        seed=5,
        name="m",
    )
    clone = keras.losses.deserialize(keras.losses.serialize(loss))
    assert type(clone) is MarginLoss and clone.get_config() == loss.get_config()
    labels, f = _batch(1, batch=9, classes=7)
    np.testing.assert_allclose(clone(labels, f).numpy(), loss(labels, f).numpy())


def test_learnable_beta_variables_and_optimizer():
    loss = MarginLoss(num_classes=3, beta_learning_rate=0.05)
    (beta,) = loss.trainable_variables
    assert beta.shape == (3,) and beta.trainable
    np.testing.assert_allclose(beta.numpy(), 1.2)
    optimizer = loss.variable_optimizer
    assert isinstance(optimizer, keras.optimizers.SGD) and optimizer is loss.variable_optimizer
    assert np.isclose(float(optimizer.learning_rate), 0.05) and optimizer.momentum == 0.9
    fixed = MarginLoss(learn_beta=False)
    assert fixed.trainable_variables == [] and fixed.variable_optimizer is None
