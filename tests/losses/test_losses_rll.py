"""Ranked List Loss: values vs. NumPy references and the shared reference file, gradients vs. finite
differences (with and without the gallery stop-gradient), degenerate input, the temperature schedule in
`model.fit`, XLA, training and serialisation."""

import warnings

import hypothesis.extra.numpy as hnp
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import loss_checks as checks
from tests.references import numpy_losses as ref
from tests.references import official_reference_cases, shared_reference_cases
from tfdml.callbacks import DynamicTemperature
from tfdml.losses import LinearTemperature, RankedListLoss, ranked_list_loss
from tfdml.losses.ranked_list import ranked_list_weights
from tfdml.ops import pairwise_distance

# The NumPy reference and pytorch-metric-learning's values follow eq. 14 (mean over queries).
UNIFORM = dict(query_weighting="uniform")

PARAMS = [
    dict(),
    dict(margin=0.4, alpha=1.2, tn=10.0, tp=0.0, lam=0.5),
    dict(margin=0.2, alpha=1.1, tn=4.0, tp=5.0, lam=0.7),
    dict(margin=0.6, alpha=0.9, tn=50.0, tp=-3.0, lam=0.3),
    dict(margin=0.1, alpha=None, tn=0.0, tp=1.0, lam=1.0),
]


def _reference_cases():
    return [
        (case["labels"], case["embeddings"], expected["params"], expected["value"])
        for case, expected in shared_reference_cases("RankedListLoss")
    ]


@pytest.mark.parametrize("labels, embeddings, params, expected", _reference_cases())
def test_matches_shared_reference_file(labels, embeddings, params, expected):
    labels, embeddings = np.array(labels), np.array(embeddings, np.float64)
    np.testing.assert_allclose(ranked_list_loss(labels, embeddings, **UNIFORM, **params).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(RankedListLoss(**UNIFORM, **params)(labels, embeddings).numpy(), expected, rtol=1e-6)


# ------------------------------------------------------------------ official query weighting (Caffe layer)


def _official_case_params(case):
    return {k: case[k] for k in ("margin", "alpha", "tn", "tp", "lam")}


@pytest.mark.parametrize(
    "case",
    official_reference_cases("rll_official_gradient"),
    ids=lambda case: f"B{len(case['labels'])}-tn{case['tn']}-tp{case['tp']}",
)
def test_gradient_matches_the_official_caffe_layer(case):
    """Gradient of the authors' DistanceWeightedValidPairLossV12 layer (its backward pass) on fixed float64
    inputs. (The layer adds 1e-6 to the distance in its gradient's denominator: ~1e-6 relative.)"""
    labels, embeddings = np.array(case["labels"]), tf.constant(np.array(case["embeddings"]))
    expected = np.array(case["gradient"])
    for loss_fn in (
        lambda y, x: ranked_list_loss(y, x, **_official_case_params(case)),
        lambda y, x: RankedListLoss(**_official_case_params(case))(y, x),
    ):  # official is the default
        _, grad = checks.value_and_gradient(loss_fn, labels, embeddings)
        assert np.abs(grad.numpy() - expected).max() <= 1e-5 * np.abs(expected).max()
    _, _, q = ranked_list_weights(tf.constant(labels), pairwise_distance(embeddings), **_official_case_params(case))
    np.testing.assert_allclose(q.numpy(), case["query_weights"], rtol=1e-6, atol=1e-12)
    # The uniform weighting (eq. 14) is a different gradient.
    _, uniform = checks.value_and_gradient(
        lambda y, x: ranked_list_loss(y, x, query_weighting="uniform", **_official_case_params(case)),
        labels,
        embeddings,
    )
    assert np.abs(uniform.numpy() - expected).max() > 0.05 * np.abs(expected).max()


@pytest.mark.parametrize("tn", [10.0, 20.0, 35.0, 50.0])
def test_official_weighting_is_finite_up_to_tn_50(tn):
    """q comes from log-sums: S(i) ~ exp(50 * 1.2) = 1e26 overflows float32's sums otherwise."""
    labels, x = checks.random_batch(3, 24, 6, dim=8)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    x[1] = -x[0]  # a far positive (d = 2) and a duplicate negative (d = 0): extreme exponents both ways
    x[5] = x[0]
    value64, grad64 = checks.value_and_gradient(lambda y, e: ranked_list_loss(y, e, tn=tn, tp=tn), labels, x)
    value32, grad32 = checks.assert_finite(RankedListLoss(tn=tn, tp=tn), labels, x.astype(np.float32))
    np.testing.assert_allclose(value32.numpy(), value64.numpy(), rtol=1e-4)
    np.testing.assert_allclose(grad32.numpy(), grad64.numpy(), rtol=1e-3, atol=1e-5)
    _, _, q = ranked_list_weights(tf.constant(labels), pairwise_distance(x.astype(np.float32)), tn=tn, tp=tn)
    assert np.all(np.isfinite(q.numpy())) and abs(float(tf.reduce_sum(q)) - 1.0) < 1e-5


def test_official_weighting_gives_hard_queries_most_of_the_gradient():
    """The effect of the Caffe layer's query weights: the quarter of the queries with the nearest negatives
    receives most of the gradient (measured on the gradient itself, ~0.45 of its norm), about twice its
    share under uniform weighting (~0.24)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(22, 32))
    labels = np.repeat(np.arange(22), 3)  # the paper's 22 x 3 batch
    x = centres[labels] / np.linalg.norm(centres[labels], axis=1, keepdims=True) + 0.25 * rng.normal(size=(66, 32))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    hardest = np.argsort(np.where(labels[:, None] != labels[None], d, np.inf).min(axis=1))[: 66 // 4]
    shares = {}
    for weighting in ("official", "uniform"):
        _, grad = checks.value_and_gradient(lambda y, e: ranked_list_loss(y, e, query_weighting=weighting), labels, x)  # noqa: B023
        norms = np.linalg.norm(grad.numpy(), axis=1)
        shares[weighting] = norms[hardest].sum() / norms.sum()
    assert shares["official"] > 0.33
    assert shares["official"] > 1.4 * shares["uniform"]


def test_official_value_is_the_query_weighted_mean():
    """Under "official" the value is sum_i q_i L(i) with q from ranked_list_weights (weights summing to 1):
    for a batch where every query mines the same weight sum it equals the uniform mean."""
    labels = np.array([0, 0, 1, 1])
    x = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])  # square: every query alike
    official = ranked_list_loss(labels, x).numpy()
    np.testing.assert_allclose(official, ranked_list_loss(labels, x, query_weighting="uniform").numpy(), rtol=1e-12)
    assert official > 0
    with pytest.raises(ValueError, match="query_weighting must be one of"):
        RankedListLoss(query_weighting="paper")
    with pytest.raises(ValueError, match="query_weighting must be one of"):
        ranked_list_loss(labels, x, query_weighting="mean")


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("seed, batch_size, num_classes", [(0, 7, 2), (1, 12, 3), (2, 15, 5), (3, 9, 4)])
def test_matches_numpy_reference(params, seed, batch_size, num_classes):
    labels, embeddings = checks.random_batch(seed, batch_size, num_classes)
    expected = ref.ranked_list_loss(labels, embeddings, **params)
    for stop in (True, False):
        value = ranked_list_loss(labels, embeddings, stop_gallery_gradient=stop, query_weighting="uniform", **params)
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(RankedListLoss(**UNIFORM, **params)(labels, embeddings).numpy(), expected, rtol=1e-6)


def test_unit_norm_embeddings_match_reference_over_many_seeds():
    for seed in range(10):
        labels, embeddings = checks.random_batch(seed, 11 + seed % 4, 3)
        embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
        np.testing.assert_allclose(
            ranked_list_loss(labels, embeddings, query_weighting="uniform").numpy(),
            ref.ranked_list_loss(labels, embeddings),
            rtol=1e-6,
        )


def test_default_alpha_is_one_plus_half_margin():
    labels, embeddings = checks.random_batch(5, 10, 3)
    np.testing.assert_allclose(
        ranked_list_loss(labels, embeddings, margin=0.3).numpy(),
        ranked_list_loss(labels, embeddings, margin=0.3, alpha=1.15).numpy(),
        rtol=1e-12,
    )


@pytest.mark.parametrize("params", [PARAMS[1], PARAMS[2], PARAMS[3]])
@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_with_gallery_stop_gradient(params, seed):
    labels, x0 = checks.random_batch(seed, 8, 3, dim=3)
    # Reference: only the query side moves; the gallery and the (constant) weights stay at x0.
    reference = lambda q: ref.ranked_list_loss(labels, q, gallery=x0, weights_from=x0, **params)  # noqa: E731
    checks.assert_gradient_matches(
        lambda y, x: ranked_list_loss(y, x, stop_gallery_gradient=True, **UNIFORM, **params), reference, labels, x0
    )


@pytest.mark.parametrize("params", [PARAMS[1], PARAMS[2], PARAMS[3]])
@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_through_both_ends(params, seed):
    labels, x0 = checks.random_batch(seed, 8, 3, dim=3)
    reference = lambda x: ref.ranked_list_loss(labels, x, weights_from=x0, **params)  # noqa: E731
    checks.assert_gradient_matches(
        lambda y, x: ranked_list_loss(y, x, stop_gallery_gradient=False, **UNIFORM, **params), reference, labels, x0
    )


def test_stop_gradient_changes_the_gradient_not_the_value():
    labels, x = checks.random_batch(4, 9, 3)
    v1, g1 = checks.value_and_gradient(lambda y, e: ranked_list_loss(y, e), labels, x)
    v2, g2 = checks.value_and_gradient(lambda y, e: ranked_list_loss(y, e, stop_gallery_gradient=False), labels, x)
    np.testing.assert_allclose(v1.numpy(), v2.numpy(), rtol=1e-12)
    assert np.abs(g1.numpy() - g2.numpy()).max() > 1e-3


@pytest.mark.parametrize("batch", sorted(checks.DEGENERATE_BATCHES))
@pytest.mark.parametrize("params", [dict(), dict(tn=50.0, tp=20.0), dict(stop_gallery_gradient=False, tn=50.0)])
@pytest.mark.parametrize("query_weighting", ["uniform", "official"])
def test_degenerate_batches_are_finite(batch, params, query_weighting):
    labels, embeddings = checks.DEGENERATE_BATCHES[batch]
    value, _ = checks.assert_finite(RankedListLoss(query_weighting=query_weighting, **params), labels, embeddings)
    if query_weighting == "uniform":
        np.testing.assert_allclose(
            value.numpy(),
            ref.ranked_list_loss(
                labels, embeddings, **{k: v for k, v in params.items() if k != "stop_gallery_gradient"}
            ),
            rtol=1e-6,
            atol=1e-7,
        )


def test_large_temperature_does_not_overflow_in_float32():
    labels, embeddings = checks.random_batch(0, 12, 3)
    embeddings = (embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)).astype(np.float32)
    value, _ = checks.assert_finite(RankedListLoss(tn=50.0, tp=50.0, query_weighting="uniform"), labels, embeddings)
    np.testing.assert_allclose(value.numpy(), ref.ranked_list_loss(labels, embeddings, tn=50.0, tp=50.0), rtol=1e-5)


def test_float16_and_mixed_precision():
    checks.assert_float16_ok(RankedListLoss(tn=50.0))


@pytest.mark.slow
@settings(max_examples=15)
@given(labels=hnp.arrays(np.int32, st.integers(1, 9), elements=st.integers(0, 3)), data=st.data())
def test_fuzzed_batches_are_finite(labels, data):
    embeddings = data.draw(
        hnp.arrays(np.float64, (labels.size, 3), elements=st.floats(-2, 2, allow_nan=False, width=32))
    )
    for loss in (RankedListLoss(tn=50.0), RankedListLoss(stop_gallery_gradient=False)):
        value, _ = checks.assert_finite(loss, labels, embeddings)
        assert value.numpy() >= 0.0


def test_bad_inputs_are_rejected():
    checks.assert_bad_inputs_rejected(RankedListLoss())
    with pytest.raises(ValueError, match=r"RankedListLoss: lam must be in \[0, 1\], got 1.5"):
        RankedListLoss(lam=1.5)
    with pytest.raises(ValueError, match=r"RankedListLoss: tn must be in \[0, 10000\], got -1.0"):
        RankedListLoss(tn=-1.0)
    with pytest.raises(ValueError, match=r"RankedListLoss: margin must be in \[0, 180\], got -0.1"):
        RankedListLoss(margin=-0.1)


@pytest.mark.slow
def test_jit_compile_matches():
    labels, embeddings = checks.random_batch(6, 13, 4)
    checks.assert_jit_matches_eager(RankedListLoss(tp=2.0), labels, embeddings)
    checks.assert_jit_matches_eager(RankedListLoss(stop_gallery_gradient=False), labels, embeddings)


# ------------------------------------------------------------------------------------------ temperature


def test_linear_temperature_follows_eq_15_and_clamps():
    schedule = LinearTemperature(t1=20.0, t2=5.0, max_steps=10)
    for step in (0, 1, 4, 10, 11, 1000):
        np.testing.assert_allclose(float(schedule(step)), ref.linear_temperature(20.0, 5.0, 10, step), rtol=1e-7)
    with pytest.raises(ValueError, match="max_steps > 0"):
        LinearTemperature(1.0, 2.0, 0)


def test_bound_step_variable_drives_the_temperature():
    labels, embeddings = checks.random_batch(7, 10, 3)
    step = tf.Variable(0, dtype=tf.int64)
    loss = RankedListLoss(tn=LinearTemperature(30.0, 2.0, 8), query_weighting="uniform").bind_step(step)
    for value in (0, 3, 8, 20):
        step.assign(value)
        tn = ref.linear_temperature(30.0, 2.0, 8, value)
        np.testing.assert_allclose(
            loss(labels, embeddings).numpy(), ref.ranked_list_loss(labels, embeddings, tn=tn), rtol=1e-6
        )


def test_unbound_schedule_warns_and_uses_t1():
    labels, embeddings = checks.random_batch(8, 10, 3)
    with pytest.warns(UserWarning, match="no step counter"):
        value = RankedListLoss(tn=LinearTemperature(7.0, 1.0, 5), query_weighting="uniform")(labels, embeddings)
    np.testing.assert_allclose(value.numpy(), ref.ranked_list_loss(labels, embeddings, tn=7.0), rtol=1e-6)


def test_temperature_follows_eq_15_during_fit():
    """With a frozen model (learning rate 0) and one step per epoch, each epoch's loss is the loss at the
    temperature of that step; the callback logs the same temperature."""
    x, y = checks.clustered_data(per_class=4)
    model = checks.tiny_embedder()
    t1, t2, max_steps = 40.0, 4.0, 4
    loss = RankedListLoss(alpha=1.8, tn=LinearTemperature(t1, t2, max_steps), query_weighting="uniform")
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss)
    embeddings = model.predict(x, verbose=0).astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the bound loss must not warn about a missing step counter
        history = model.fit(
            x, y, batch_size=len(y), epochs=6, shuffle=False, verbose=0, callbacks=[DynamicTemperature()]
        )
    expected_tn = [ref.linear_temperature(t1, t2, max_steps, step) for step in range(6)]
    np.testing.assert_allclose(history.history["tn"], expected_tn, rtol=1e-6)
    expected_loss = [ref.ranked_list_loss(y, embeddings, alpha=1.8, tn=tn) for tn in expected_tn]
    np.testing.assert_allclose(history.history["loss"], expected_loss, rtol=1e-4)
    assert len(set(np.round(expected_loss, 6))) > 2  # the temperature really changes the loss here
    assert loss.bound_step is model.optimizer.iterations


def test_callback_retraces_a_train_function_built_before_binding():
    x, y = checks.clustered_data(per_class=4)
    model = checks.tiny_embedder()
    loss = RankedListLoss(alpha=1.8, tn=LinearTemperature(40.0, 4.0, 2), query_weighting="uniform")
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss)
    embeddings = model.predict(x, verbose=0).astype(np.float64)
    with pytest.warns(UserWarning, match="no step counter"):
        model.fit(x, y, batch_size=len(y), epochs=1, verbose=0)  # traced with the step-0 temperature
    history = model.fit(x, y, batch_size=len(y), epochs=2, shuffle=False, verbose=0, callbacks=[DynamicTemperature()])
    np.testing.assert_allclose(history.history["tn"], [22.0, 4.0], rtol=1e-6)
    np.testing.assert_allclose(
        history.history["loss"],
        [ref.ranked_list_loss(y, embeddings, alpha=1.8, tn=tn) for tn in (22.0, 4.0)],
        rtol=1e-4,
    )


def test_callback_without_ranked_list_loss_is_an_error():
    model = checks.tiny_embedder()
    model.compile(optimizer="sgd", loss="mse")
    x, y = checks.clustered_data(per_class=2)
    with pytest.raises(ValueError, match="DynamicTemperature found no loss"):
        model.fit(x, np.zeros((len(y), 4)), epochs=1, verbose=0, callbacks=[DynamicTemperature()])


# ------------------------------------------------------------------------------------------ Keras


@pytest.mark.slow
def test_fit_lowers_the_loss():
    checks.assert_fit_lowers_loss(RankedListLoss())
    scheduled = RankedListLoss(alpha=1.2, tn=LinearTemperature(20.0, 5.0, 100))
    checks.assert_fit_lowers_loss(
        scheduled, callbacks=[DynamicTemperature()], measure=RankedListLoss(alpha=1.2, tn=20.0)
    )


def test_config_roundtrip():
    loss = RankedListLoss(
        margin=0.3,
        alpha=1.1,
        tn=LinearTemperature(15.0, 3.0, 500),
        tp=2.0,
        lam=0.6,
        stop_gallery_gradient=False,
        query_weighting="uniform",
        name="rll",
    )
    restored = checks.assert_config_roundtrip(loss)
    assert isinstance(restored.tn, LinearTemperature)
    assert (restored.tn.t1, restored.tn.t2, restored.tn.max_steps) == (15.0, 3.0, 500)
    assert restored.stop_gallery_gradient is False and restored.alpha == 1.1
    assert restored.query_weighting == "uniform" and RankedListLoss().query_weighting == "official"
    schedule = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss.tn))
    assert schedule.get_config() == loss.tn.get_config()
    checks.assert_config_roundtrip(RankedListLoss())


@pytest.mark.filterwarnings("ignore:RankedListLoss has a temperature schedule")
def test_keras_saving_roundtrip(tmp_path):
    loss = RankedListLoss(margin=0.3, tn=LinearTemperature(15.0, 3.0, 500), tp=1.0)
    loaded = checks.assert_saving_roundtrip(loss, tmp_path)
    assert isinstance(loaded.loss.tn, LinearTemperature)
