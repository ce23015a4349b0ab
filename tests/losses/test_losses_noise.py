"""Label-noise weightings (`tfdml.losses.noise`): the small-loss heuristic drops exactly the fraction of
positive pairs with the largest anchor-positive distance, and PRISM's selection equals a NumPy reading of the
paper's official code (`tests/references/numpy_noise.py`) on fixed memories and on a sequence of batches."""

import numpy as np
import pytest
import tensorflow as tf

from tests import loss_checks as checks
from tests.references import numpy_losses
from tests.references import numpy_noise as ref
from tfdml.losses import PRISM, ContrastiveLoss, MarginLoss, SmallLossWeighting, TripletLoss, TripletSemiHardLoss
from tfdml.losses.noise import (
    farthest_positive_pairs,
    positive_distance_quantile,
    positive_pairs_beyond,
    prism_clean_probability,
    prism_keep,
)
from tfdml.ops import reduce_terms


def _batch(classes=6, per_class=4, dim=8, seed=0, spread=0.3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    labels = np.repeat(np.arange(classes), per_class).astype(np.int32)
    embeddings = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return labels, embeddings


# ------------------------------------------------------------------------------------------------ heuristic
@pytest.mark.parametrize("quantile", [0.05, 0.5, 0.9, 1.0])
def test_distance_cut_threshold_is_the_nearest_rank_quantile_of_the_positive_pair_distances(quantile):
    labels, embeddings = _batch(classes=4, per_class=3, seed=1)  # 12 unordered positive pairs
    expected = ref.distance_cut_threshold(labels, embeddings, quantile)
    np.testing.assert_allclose(float(positive_distance_quantile(labels, embeddings, quantile)), expected, atol=1e-5)
    assert np.isinf(float(positive_distance_quantile(np.arange(4, dtype=np.int32), embeddings[:4], quantile)))


def test_distance_cut_takes_the_positive_pairs_beyond_the_threshold_and_no_other():
    labels, embeddings = _batch(seed=2, spread=0.6)
    positive = ref.positive_pair_distances(labels, embeddings)
    threshold = 0.5 * (positive[9] + positive[10])  # between two pairs: no pair within rounding of it
    expected = ref.pairs_beyond(labels, embeddings, threshold)
    assert expected.sum() == 2 * (len(positive) - 10)
    np.testing.assert_array_equal(np.asarray(positive_pairs_beyond(labels, embeddings, threshold)), expected)


@pytest.mark.parametrize("drop_rate", [0.0, 0.1, 0.25, 0.5, 0.9])
def test_heuristic_drops_exactly_the_farthest_positive_pairs(drop_rate):
    labels, embeddings = _batch(seed=1)
    mask = farthest_positive_pairs(tf.constant(labels), tf.constant(embeddings), drop_rate).numpy()
    np.testing.assert_array_equal(mask, mask.T)
    dropped = {(i, j) for i, j in zip(*np.nonzero(mask)) if i < j}
    assert dropped == ref.farthest_positive_pairs(labels, embeddings, drop_rate)
    positives = 6 * 4 * 3 // 2
    assert len(dropped) == int(np.floor(drop_rate * positives + 0.5))
    assert all(labels[i] == labels[j] for i, j in dropped)


@pytest.mark.parametrize("drop_rate", [0.1, 0.3, 0.5])
def test_heuristic_loss_leaves_out_the_terms_of_the_dropped_pairs(drop_rate):
    labels, embeddings = _batch(classes=5, per_class=3, seed=4, spread=0.9)
    dropped = ref.farthest_positive_pairs(labels, embeddings, drop_rate)
    assert dropped
    x = tf.constant(embeddings)
    contrastive = SmallLossWeighting(ContrastiveLoss(pos_margin=0.1, neg_margin=1.1), drop_rate=drop_rate)
    np.testing.assert_allclose(
        contrastive(labels, x).numpy(), ref.contrastive_without(labels, embeddings, dropped, 0.1, 1.1), rtol=1e-10
    )
    triplet = SmallLossWeighting(TripletLoss(margin=0.3), drop_rate=drop_rate)
    np.testing.assert_allclose(
        triplet(labels, x).numpy(), ref.triplet_all_without(labels, embeddings, dropped, 0.3), rtol=1e-10
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: ContrastiveLoss(pos_margin=0.1, neg_margin=1.1),
        lambda: TripletLoss(margin=0.3),
        lambda: MarginLoss(sampling="all"),
    ],
)
def test_heuristic_terms_are_the_kept_terms_and_reduce_to_its_value(make):
    """`terms` lists the wrapped loss's terms minus those on a dropped pair (what DML-ALA then weighs): no
    kept term touches a dropped pair, and their reduction is the heuristic's value, value and gradient."""
    labels, embeddings = _batch(classes=5, per_class=3, seed=4, spread=0.9)
    dropped = ref.farthest_positive_pairs(labels, embeddings, 0.5)
    loss = SmallLossWeighting(make(), drop_rate=0.5)
    assert loss.tuple_kind == make().tuple_kind
    x = tf.constant(embeddings)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        terms = loss.terms(tf.constant(labels), x)
        value, expected = reduce_terms(terms), loss(labels, x)
    pairs = {tuple(sorted(p)) for p in terms.indices.numpy()[:, :2].tolist()}
    assert not pairs & dropped
    assert len(terms.values) < len(make().terms(tf.constant(labels), x).values)
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-12)
    np.testing.assert_allclose(tape.gradient(value, x).numpy(), tape.gradient(expected, x).numpy(), rtol=1e-10)


def test_heuristic_at_rate_zero_is_the_wrapped_loss():
    labels, embeddings = _batch(seed=6)
    x = tf.constant(embeddings)
    for loss in (ContrastiveLoss(), TripletLoss(margin=0.2), MarginLoss(sampling="all")):
        np.testing.assert_allclose(
            SmallLossWeighting(loss, drop_rate=0.0)(labels, x).numpy(), loss(labels, x).numpy(), rtol=1e-12
        )


def _gradient(loss, labels, embeddings):
    x = tf.constant(embeddings)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = loss(tf.constant(labels), x)
    return tape.gradient(value, x).numpy().ravel()


def _cosine(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize(
    "make",
    [
        lambda: ContrastiveLoss(pos_margin=0.0, neg_margin=0.8),
        lambda: TripletLoss(margin=0.5),
        lambda: MarginLoss(alpha=0.2, beta=0.6, sampling="all"),
    ],
    ids=["contrastive", "triplet", "margin"],
)
def test_small_drop_rates_leave_a_clean_well_separated_batch_gradient_nearly_unchanged(make):
    """A clean batch of tight, well-separated classes: dropping 5 % of the positive pairs (heuristic) or the
    least likely clean of its 40 samples (PRISM at 2.5 %, its memory filled from the same clean classes) turns
    the gradient by little; dropping half of the pairs or a tenth of the samples turns it more. (A sample PRISM
    drops takes all its pairs with it, negatives too, and it is the batch's outlier: per unit of rate PRISM
    moves a clean gradient more than the heuristic.)"""
    labels, embeddings = _batch(classes=8, per_class=5, dim=16, seed=7, spread=0.15)
    base = _gradient(make(), labels, embeddings)
    small = _gradient(SmallLossWeighting(make(), drop_rate=0.05), labels, embeddings)
    large = _gradient(SmallLossWeighting(make(), drop_rate=0.5), labels, embeddings)
    assert _cosine(base, small) > 0.98
    assert _cosine(base, large) < _cosine(base, small)

    def prism_gradient(rate):
        loss = PRISM(make(), noise_rate=rate, memory_size=200, embedding_dim=16, dtype="float64")
        memory_labels, memory = _batch(classes=8, per_class=5, dim=16, seed=7, spread=0.15)
        loss(tf.constant(memory_labels), tf.constant(memory + 0.01))  # fills the memory, clean
        return _gradient(loss, labels, embeddings)

    assert _cosine(base, prism_gradient(0.025)) > 0.9
    assert _cosine(base, prism_gradient(0.1)) < _cosine(base, prism_gradient(0.025))


def test_heuristic_config_roundtrip_and_bad_arguments():
    loss = SmallLossWeighting(MarginLoss(alpha=0.25, sampling="all"), drop_rate=0.3)
    restored = checks.assert_config_roundtrip(loss)
    assert isinstance(restored.loss, MarginLoss) and restored.drop_rate == 0.3
    with pytest.raises(
        ValueError, match="SmallLossWeighting needs a loss that lists its per-tuple terms .* got TripletSemiHardLoss"
    ):
        SmallLossWeighting(TripletSemiHardLoss(), drop_rate=0.3)
    with pytest.raises(ValueError, match=r"drop_rate must be a number in \[0, 1\), got -0.1"):
        SmallLossWeighting(ContrastiveLoss(), drop_rate=-0.1)


@pytest.mark.slow
def test_heuristic_fit_lowers_the_wrapped_loss():
    checks.assert_fit_lowers_loss(SmallLossWeighting(ContrastiveLoss(), drop_rate=0.2), measure=ContrastiveLoss())


# ------------------------------------------------------------------------------------------------ PRISM
def _memory(seed, size=40, classes=6, dim=8, missing=()):
    labels, embeddings = _batch(classes=classes, per_class=size // classes + 1, dim=dim, seed=seed, spread=0.8)
    keep = ~np.isin(labels, missing)
    return labels[keep][:size], embeddings[keep][:size]


def test_prism_clean_probability_equals_the_papers_rule_on_a_fixed_memory():
    labels, embeddings = _batch(classes=7, per_class=3, seed=2, spread=0.5)
    memory_labels, memory_embeddings = _memory(3, classes=7, missing=(5,))
    # Invalid (empty) slots must not count: pad the memory with rows that are not valid.
    padded_labels = np.concatenate([memory_labels, np.full(5, 1, np.int32)])
    padded = np.concatenate([memory_embeddings, np.ones((5, 8))])
    valid = np.arange(len(padded_labels)) < len(memory_labels)
    got = prism_clean_probability(
        tf.constant(labels), tf.constant(embeddings), tf.constant(padded_labels), tf.constant(padded), valid
    ).numpy()
    expected = ref.clean_probability(labels, embeddings, memory_labels, memory_embeddings)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert np.all(got[labels == 5] == 1.0)  # class 5 has nothing in memory


def test_prism_selection_equals_the_papers_rule_over_a_sequence_of_batches():
    """The same batches through the TensorFlow rule (window and memory carried by hand) and the reference:
    the same keep masks at every step, window resets included (a low window mean keeps everybody, a batch of
    outliers falls back to the fixed fraction)."""
    rate, width = 0.25, 3
    reference = ref.Prism(rate, width)
    window, count = tf.zeros([width], tf.float64), tf.constant(0)
    memory_labels = np.zeros([0], np.int32)
    memory_embeddings = np.zeros([0, 8])
    rng = np.random.default_rng(5)
    flips = 0
    for step in range(8):
        labels, embeddings = _batch(classes=6, per_class=4, seed=10 + step, spread=0.6)
        noisy = labels.copy()
        flip = rng.random(len(labels)) < 0.3
        noisy[flip] = rng.integers(0, 6, flip.sum())
        flips += flip.sum()
        scores = prism_clean_probability(
            tf.constant(noisy),
            tf.constant(embeddings),
            tf.constant(memory_labels),
            tf.constant(memory_embeddings),
            np.ones(len(memory_labels), bool),
        )
        keep, window, count = prism_keep(scores, rate, window, count, has_memory=len(memory_labels) > 0)
        expected = reference.select(noisy, embeddings)
        np.testing.assert_array_equal(keep.numpy(), expected, err_msg=f"step {step}")
        assert int(count) == len(reference.window)
        np.testing.assert_allclose(window.numpy()[: int(count)], reference.window, rtol=1e-12)
        memory_labels = np.concatenate([memory_labels, noisy[keep.numpy()]])
        memory_embeddings = np.concatenate([memory_embeddings, embeddings[keep.numpy()]])
    assert flips > 0


def test_prism_falls_back_to_the_fixed_fraction_and_resets_the_window_when_nobody_clears_it():
    scores = tf.constant([0.01, 0.02, 0.03, 0.04], tf.float64)
    window, count = tf.constant([0.5, 0.6, 0.0], tf.float64), tf.constant(2)
    keep, window, count = prism_keep(scores, 0.5, window, count)
    np.testing.assert_array_equal(keep.numpy(), [False, False, True, True])
    assert int(count) == 1 and window.numpy()[0] == pytest.approx(0.02)


def test_prism_keeps_everybody_without_memory_and_leaves_the_window_alone():
    scores = tf.constant([1.0, 1.0, 1.0, 1.0], tf.float64)
    keep, window, count = prism_keep(scores, 0.5, tf.zeros([3], tf.float64), tf.constant(0), has_memory=False)
    assert keep.numpy().all() and int(count) == 0


def _noisy_batches(steps, seed=5, flip_rate=0.3):
    rng = np.random.default_rng(seed)
    for step in range(steps):
        labels, embeddings = _batch(classes=6, per_class=4, seed=10 + step, spread=0.6)
        flip = rng.random(len(labels)) < flip_rate
        labels[flip] = rng.integers(0, 6, flip.sum())
        yield labels, embeddings


def test_prism_loss_is_the_wrapped_loss_of_the_kept_samples_and_fills_its_memory():
    loss = PRISM(ContrastiveLoss(neg_margin=1.2), noise_rate=0.25, memory_size=500, embedding_dim=8, window_size=3)
    reference = ref.Prism(0.25, 3)
    for step, (labels, embeddings) in enumerate(_noisy_batches(8)):
        keep = reference.select(labels, embeddings)
        expected = numpy_losses.contrastive(labels[keep], embeddings[keep], 0.0, 1.2)
        value = loss(tf.constant(labels), tf.constant(embeddings, tf.float32))
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5, err_msg=f"step {step}")
    labels, _ = loss.stored()
    np.testing.assert_array_equal(labels, reference.memory_labels)


def test_prism_memory_is_a_ring_buffer_of_memory_size():
    """Past `memory_size` kept samples the oldest make room (the centres follow the last 30): the same
    selections as the reference's queue of 30, and the same stored samples."""
    loss = PRISM(ContrastiveLoss(), noise_rate=0.25, memory_size=30, embedding_dim=8, window_size=3)
    reference = ref.Prism(0.25, 3, memory_size=30)
    for step, (labels, embeddings) in enumerate(_noisy_batches(6)):
        keep = reference.select(labels, embeddings)
        expected = numpy_losses.contrastive(labels[keep], embeddings[keep])
        value = loss(tf.constant(labels), tf.constant(embeddings, tf.float32))
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5, err_msg=f"step {step}")
    assert int(loss.memory_count.value.numpy()) == reference.enqueued > 60
    labels, embeddings = loss.stored()
    order = np.argsort([(i - reference.enqueued) % 30 for i in range(30)])  # slot order -> oldest first
    np.testing.assert_array_equal(labels[order], reference.memory_labels)
    np.testing.assert_allclose(embeddings[order], reference.memory_embeddings, rtol=1e-6)


def test_prism_evaluation_calls_use_the_whole_batch_and_leave_the_state_alone():
    loss = PRISM(ContrastiveLoss(), noise_rate=0.4, memory_size=100, embedding_dim=8)
    batches = list(_noisy_batches(2))
    for labels, embeddings in batches:
        loss(tf.constant(labels), tf.constant(embeddings, tf.float32))
    state = [v.value.numpy().copy() for v in loss.non_trainable_variables]
    loss.training = False
    labels, embeddings = batches[0]
    value = loss(tf.constant(labels), tf.constant(embeddings, tf.float32))
    np.testing.assert_allclose(value.numpy(), numpy_losses.contrastive(labels, embeddings), rtol=1e-5)
    for before, variable in zip(state, loss.non_trainable_variables):
        np.testing.assert_array_equal(before, variable.value.numpy())


def test_prism_config_roundtrip_and_bad_arguments():
    loss = PRISM(TripletSemiHardLoss(margin=0.3), noise_rate=0.2, memory_size=64, embedding_dim=8, window_size=5)
    restored = checks.assert_config_roundtrip(loss)
    assert isinstance(restored.loss, TripletSemiHardLoss) and restored.loss.margin == 0.3
    with pytest.raises(ValueError, match=r"noise_rate must be a number in \[0, 1\), got 1.5"):
        PRISM(ContrastiveLoss(), noise_rate=1.5, memory_size=64, embedding_dim=8)
    with pytest.raises(ValueError, match="memory_size must be an integer >= 1"):
        PRISM(ContrastiveLoss(), noise_rate=0.2, memory_size=0, embedding_dim=8)
    with pytest.raises(TypeError, match="PRISM wraps a tfdml MetricLoss, got str"):
        PRISM("contrastive", noise_rate=0.2, memory_size=64, embedding_dim=8)
    with pytest.raises(ValueError, match="a \\(global\\) batch of 24 exceeds memory_size=10"):
        PRISM(ContrastiveLoss(), noise_rate=0.2, memory_size=10, embedding_dim=8)(*_batch()[:1], _batch()[1])


@pytest.mark.slow
def test_prism_fit_lowers_the_wrapped_loss():
    loss = PRISM(TripletSemiHardLoss(margin=0.2), noise_rate=0.2, memory_size=64, embedding_dim=4)
    checks.assert_fit_lowers_loss(loss, measure=TripletSemiHardLoss(margin=0.2))


# ------------------------------------------------------------------------------------------------ job configuration
def _job(overrides):
    from tfdml.config import load_config

    small = ["loss.name=contrastive", "data.classes_per_batch=4", "data.samples_per_class=2"]
    return load_config(overrides=[*small, *overrides])


@pytest.mark.slow
def test_job_configuration_wraps_the_loss_for_label_noise_and_trains():
    import keras

    from tfdml import pipeline

    rng = np.random.default_rng(0)
    x, y = rng.uniform(size=(16, 32, 32, 1)).astype(np.float32), np.repeat(np.arange(8), 2).astype(np.int32)

    keras.utils.set_random_seed(0)
    model, _ = pipeline.build_model(_job(["loss.label_noise.rate=0.25"]), (32, 32, 1), total_steps=2)
    assert isinstance(model.loss, SmallLossWeighting) and isinstance(model.loss.loss, ContrastiveLoss)
    assert model.loss.drop_rate == 0.25
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"]).all()

    prism = [f"loss.label_noise.{k}" for k in ("method=prism", "rate=0.2", "memory_size=16", "window_size=5")]
    model, embedder = pipeline.build_model(_job(prism), (32, 32, 1), total_steps=2)
    loss = model.loss
    assert isinstance(loss, PRISM) and isinstance(loss.loss, ContrastiveLoss)
    assert (loss.noise_rate, loss.memory_size, loss.embedding_dim, loss.window_size) == (
        0.2,
        16,
        embedder.embedding_dim,
        5,
    )
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    # The first batch meets an empty memory and keeps all 8; the second drops floor(0.2 x 8) = 1.
    assert int(loss.memory_count.numpy()) == 15


def test_job_configuration_gives_dml_ala_the_pairs_the_heuristic_keeps():
    from tfdml import pipeline
    from tfdml.models import ALAModel

    config = _job(["ala.enabled=true", "loss.label_noise.rate=0.5"])
    model, _ = pipeline.build_model(config, (32, 32, 1), total_steps=2)
    assert isinstance(model, ALAModel) and isinstance(model.base_loss, SmallLossWeighting)
    assert isinstance(model.base_loss.loss, ContrastiveLoss) and model.base_loss.drop_rate == 0.5


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["loss.label_noise.method=prism"], "memory_size: prism needs the size of its memory"),
        (["loss.label_noise.rate=1"], r"rate: must be a number in \[0, 0.99\], got 1.0"),
        (["loss.label_noise.rate=-0.1"], r"rate: must be a number in \[0, 0.99\], got -0.1"),
        (["loss.label_noise.memory_size=16"], "memory_size: applies to method=prism only, not small_loss"),
        (["loss.label_noise.method=coteaching"], "loss.label_noise.method: .*coteaching"),
        (
            ["loss.name=triplet_semihard", "loss.label_noise.rate=0.3"],
            "triplet_semihard does not list its terms; it works with contrastive, margin, triplet",
        ),
        (
            ["ala.enabled=true", "loss.label_noise.method=prism", "loss.label_noise.memory_size=16"],
            "DML-ALA .* which prism does not list; use method=small_loss",
        ),
        (
            ["loss.label_noise.method=prism", "loss.label_noise.memory_size=7"],
            r"memory_size: 7 is less than a batch .* = 8\)",
        ),
        (
            ["model.type=multilevel", "model.levels=[L,H]", "loss.label_noise.method=prism"]
            + ["loss.label_noise.memory_size=16"],
            "prism's memory holds one embedding per image; model.levels",
        ),
        (
            ["loss.label_noise.rate=0.3", "loss.cross_batch_memory.memory_size=16"],
            "label_noise: one wrapper around the loss at a time",
        ),
    ],
)
def test_job_configuration_refuses_label_noise_settings_that_cannot_work(overrides, message):
    from tfdml.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        _job(overrides)
