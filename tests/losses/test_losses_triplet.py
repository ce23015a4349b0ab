"""Triplet losses (`TripletLoss` all / hard / semi-hard, soft and squared variants, and the
tensorflow-addons drop-ins): values vs. NumPy references and the shared reference file, gradients vs.
finite differences, O(B^2) memory, degenerate input, XLA, training and serialisation."""

import hypothesis.extra.numpy as hnp
import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import loss_checks as checks
from tests.references import numpy_losses as ref
from tests.references import shared_reference_cases, tfa_triplet
from tfdml.losses import (
    TripletHardLoss,
    TripletLoss,
    TripletSemiHardLoss,
    triplet_hard_loss,
    triplet_loss,
    triplet_semihard_loss,
)

MINING_REFERENCES = {"all": ref.triplet_all, "hard": ref.triplet_batch_hard, "semi_hard": ref.triplet_semi_hard}
BATCHES = [(0, 7, 2), (1, 12, 3), (2, 15, 5), (3, 10, 4), (4, 16, 3)]


def _reference_cases():
    return [
        (case["labels"], case["embeddings"], expected["loss"], expected["params"], expected["value"])
        for case, expected in shared_reference_cases("TripletLoss", "TripletSemiHardLoss")
    ]


@pytest.mark.parametrize("labels, embeddings, loss_name, params, expected", _reference_cases())
def test_matches_shared_reference_file(labels, embeddings, loss_name, params, expected):
    labels, embeddings = np.array(labels), np.array(embeddings, np.float64)
    if loss_name == "TripletLoss":
        values = [triplet_loss(labels, embeddings, **params), TripletLoss(**params)(labels, embeddings)]
    else:
        values = [
            triplet_semihard_loss(labels, embeddings, **params),
            TripletSemiHardLoss(**params)(labels, embeddings),
        ]
    for value in values:
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("mining", sorted(MINING_REFERENCES))
@pytest.mark.parametrize(
    "soft, squared, margin", [(False, False, 0.2), (False, True, 0.5), (True, False, 0.3), (False, False, 1.0)]
)
@pytest.mark.parametrize("seed, batch_size, num_classes", BATCHES)
def test_triplet_loss_matches_numpy_reference(mining, soft, squared, margin, seed, batch_size, num_classes):
    labels, embeddings = checks.random_batch(seed, batch_size, num_classes)
    expected = MINING_REFERENCES[mining](labels, embeddings, margin=margin, soft=soft, squared=squared)
    value = TripletLoss(margin=margin, mining=mining, soft=soft, squared=squared)(labels, embeddings)
    np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("margin", [0.1, 1.0, 2.5])
@pytest.mark.parametrize("seed, batch_size, num_classes", BATCHES)
def test_tfa_dropins_match_numpy_reference(margin, seed, batch_size, num_classes):
    labels, embeddings = checks.random_batch(seed, batch_size, num_classes)
    np.testing.assert_allclose(
        TripletSemiHardLoss(margin)(labels, embeddings).numpy(),
        ref.tfa_triplet_semihard(labels, embeddings, margin),
        rtol=1e-6,
        atol=1e-12,
    )
    for soft in (False, True):
        np.testing.assert_allclose(
            TripletHardLoss(margin, soft=soft)(labels, embeddings).numpy(),
            ref.tfa_triplet_hard(labels, embeddings, margin, soft=soft),
            rtol=1e-6,
        )


def test_tfa_semantics_on_anchors_without_negatives_or_positives():
    # Class 0 has negatives; anchor 4 (class 2) has no positive; all classes have negatives except none.
    labels = np.array([0, 0, 0, 1, 2, 1])
    embeddings = checks.random_batch(9, 6, 3)[1]
    np.testing.assert_allclose(
        triplet_semihard_loss(labels, embeddings).numpy(), ref.tfa_triplet_semihard(labels, embeddings), rtol=1e-6
    )
    np.testing.assert_allclose(
        triplet_hard_loss(labels, embeddings).numpy(), ref.tfa_triplet_hard(labels, embeddings), rtol=1e-6
    )
    # One class: no negatives at all. tfa: semi-hard uses d_an = 0; hard uses the row maximum -> margin.
    one_class = np.zeros(5, np.int32)
    x = embeddings[:5]
    d = ref.distance_matrix(x)
    expected = np.mean([1.0 + d[a, p] for a in range(5) for p in range(5) if a != p])
    np.testing.assert_allclose(triplet_semihard_loss(one_class, x).numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(triplet_hard_loss(one_class, x, margin=0.7).numpy(), 0.7, rtol=1e-6)
    # No positive pair at all: 0 instead of tfa's NaN.
    distinct = np.arange(5)
    assert triplet_semihard_loss(distinct, x).numpy() == 0.0
    assert triplet_hard_loss(distinct, x).numpy() == 0.0


def test_no_active_triplet_gives_zero():
    labels = np.array([0, 0, 1, 1])
    embeddings = np.array([[0.0, 0.0], [0.0, 0.01], [5.0, 0.0], [5.0, 0.01]])
    for mining in ("all", "hard", "semi_hard"):
        assert triplet_loss(labels, embeddings, mining=mining).numpy() == 0.0


@pytest.mark.parametrize("mining", sorted(MINING_REFERENCES))
@pytest.mark.parametrize("soft, squared", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_triplet_gradient_matches_finite_differences(mining, soft, squared, seed):
    labels, x = checks.random_batch(seed, 9, 3, dim=3)
    reference = lambda e: MINING_REFERENCES[mining](labels, e, margin=0.4, soft=soft, squared=squared)  # noqa: E731
    checks.assert_gradient_matches(
        lambda y, e: triplet_loss(y, e, margin=0.4, mining=mining, soft=soft, squared=squared), reference, labels, x
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tfa_dropin_gradients_match_finite_differences(seed):
    labels, x = checks.random_batch(seed, 9, 3, dim=3)
    checks.assert_gradient_matches(
        lambda y, e: triplet_semihard_loss(y, e, margin=0.5),
        lambda e: ref.tfa_triplet_semihard(labels, e, 0.5),
        labels,
        x,
    )
    for soft in (False, True):
        checks.assert_gradient_matches(
            lambda y, e, soft=soft: triplet_hard_loss(y, e, margin=0.5, soft=soft),
            lambda e, soft=soft: ref.tfa_triplet_hard(labels, e, 0.5, soft=soft),
            labels,
            x,
        )


# ------------------------------------------------------- tensorflow-addons' own test cases (distance metrics)

# tfa's `assert_allclose_according_to_type`: tolerances follow the dtype of the returned loss.
TFA_TOLERANCE = {tf.float32: 1e-6, tf.float16: 1e-3, tf.bfloat16: 1e-2}


def _tfa_batch(seed, num_data):
    """tfa's test inputs: uniform [0, 1) embeddings of dim 6 (not normalised), labels from 4 classes."""
    rng = np.random.RandomState(seed)
    return rng.randint(0, 4, size=num_data), rng.rand(num_data, 6).astype(np.float32)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("distance_metric", sorted(tfa_triplet.DISTANCES))
@pytest.mark.parametrize("seed", range(3))
def test_tfa_semihard_test_cases(dtype, distance_metric, seed):
    labels, embeddings = _tfa_batch(seed, 10)
    if not any(labels[i] == labels[j] for i in range(10) for j in range(i)):
        pytest.skip("no positive pair (tfa's reference divides by 0)")
    expected = tfa_triplet.semihard(labels, embeddings, 1.0, tfa_triplet.DISTANCES[distance_metric])
    loss = TripletSemiHardLoss(distance_metric=distance_metric)(tf.constant(labels), tf.constant(embeddings, dtype))
    assert loss.dtype == dtype
    tol = TFA_TOLERANCE[dtype]
    np.testing.assert_allclose(float(loss.numpy()), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16], ids=lambda d: d.name)
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("distance_metric", sorted(tfa_triplet.DISTANCES))
@pytest.mark.parametrize("seed", range(3))
def test_tfa_hard_test_cases(dtype, soft, distance_metric, seed):
    labels, embeddings = _tfa_batch(seed, 20)
    expected = tfa_triplet.hard(labels, embeddings, 1.0, tfa_triplet.DISTANCES[distance_metric], soft)
    loss = TripletHardLoss(soft=soft, distance_metric=distance_metric)(
        tf.constant(labels), tf.constant(embeddings, dtype)
    )
    assert loss.dtype == dtype
    tol = TFA_TOLERANCE[dtype]
    np.testing.assert_allclose(float(loss.numpy()), expected, rtol=tol, atol=tol)


@keras.saving.register_keras_serializable(package="tfdml_tests")
def one_minus_dot(batch):
    """tfa's docstring example of a custom distance: `1 - batch @ batch.T`."""
    return 1.0 - tf.matmul(batch, batch, transpose_b=True)


def test_tfa_callable_distance_metric():
    labels, embeddings = _tfa_batch(7, 12)
    numpy_metric = lambda f: 1.0 - np.asarray(f, np.float64) @ np.asarray(f, np.float64).T  # noqa: E731
    np.testing.assert_allclose(
        triplet_semihard_loss(labels, embeddings, distance_metric=one_minus_dot).numpy(),
        tfa_triplet.semihard(labels, embeddings, 1.0, numpy_metric),
        rtol=1e-5,
    )
    for soft in (False, True):
        np.testing.assert_allclose(
            triplet_hard_loss(labels, embeddings, soft=soft, distance_metric=one_minus_dot).numpy(),
            tfa_triplet.hard(labels, embeddings, 1.0, numpy_metric, soft),
            rtol=1e-5,
        )
    # Gradients flow through the callable's matrix.
    _, grad = checks.assert_finite(TripletSemiHardLoss(distance_metric=one_minus_dot), labels, embeddings)
    assert np.abs(grad.numpy()).max() > 0
    restored = checks.assert_config_roundtrip(TripletHardLoss(distance_metric=one_minus_dot))
    assert restored.distance_metric is one_minus_dot
    restored = checks.assert_config_roundtrip(TripletSemiHardLoss(0.5, distance_metric="angular"))
    assert restored.distance_metric == "angular"
    with pytest.raises(ValueError, match="distance_metric must be one of"):
        TripletHardLoss(distance_metric="L1")
    with pytest.raises(ValueError, match="distance_metric must be one of 'euclidean', .*'angular' or a callable"):
        triplet_semihard_loss(labels, embeddings, distance_metric="L1")


@pytest.mark.parametrize("distance_metric", ["squared-L2", "angular"])
def test_tfa_distance_metric_gradients_match_finite_differences(distance_metric):
    labels, x = checks.random_batch(4, 9, 3, dim=3)
    metric = tfa_triplet.DISTANCES[distance_metric]
    checks.assert_gradient_matches(
        lambda y, e: triplet_semihard_loss(y, e, margin=0.5, distance_metric=distance_metric),
        lambda e: tfa_triplet.semihard(labels, e, 0.5, metric),
        labels,
        x,
    )
    checks.assert_gradient_matches(
        lambda y, e: triplet_hard_loss(y, e, margin=0.5, distance_metric=distance_metric),
        lambda e: tfa_triplet.hard(labels, e, 0.5, metric),
        labels,
        x,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss",
    [
        TripletLoss(mining="all"),
        TripletLoss(mining="semi_hard"),
        TripletLoss(mining="all", soft=True),
        TripletSemiHardLoss(),
    ],
)
def test_no_cubic_tensor_is_built(loss):
    batch_size = 64
    largest, num_loop_bodies = checks.largest_tensor_in_graph(loss, batch_size)
    assert num_loop_bodies >= 1  # the slot loop body was inspected too
    assert largest <= batch_size * batch_size


def test_the_scan_counts_a_cubic_tensor_built_with_dynamic_shapes():
    """The scan itself: a [B, B, B] tensor whose shape the graph leaves open (after a boolean mask) counts."""

    def cubic(labels, embeddings):
        kept = tf.boolean_mask(embeddings, labels >= 0)[:, 0]  # [None]: the mask hides the static size
        return tf.reduce_sum(kept[:, None, None] + kept[None, :, None] + kept[None, None, :])

    largest, _ = checks.largest_tensor_in_graph(cubic, 16)
    assert largest >= 16**3


def test_all_triplets_at_batch_1024():
    """3 million triplets, computed without a [B, B, B] tensor, against a per-anchor NumPy sum."""
    labels = np.repeat(np.arange(256), 4).astype(np.int32)
    embeddings = np.random.default_rng(0).normal(size=(1024, 8))
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    value, grad = checks.value_and_gradient(TripletLoss(margin=0.2, mining="all"), labels, embeddings)
    total, count = 0.0, 0
    for anchor in range(1024):
        dist = np.linalg.norm(embeddings - embeddings[anchor], axis=1)
        same = labels == labels[anchor]
        same[anchor] = False
        hinge = 0.2 + dist[same][:, None] - dist[labels != labels[anchor]][None, :]
        total += hinge[hinge > 0].sum()
        count += int((hinge > 0).sum())
    np.testing.assert_allclose(value.numpy(), total / count, rtol=1e-6)
    assert np.all(np.isfinite(grad.numpy()))


@pytest.mark.parametrize("batch", sorted(checks.DEGENERATE_BATCHES))
def test_degenerate_batches_are_finite(batch):
    labels, embeddings = checks.DEGENERATE_BATCHES[batch]
    for mining in ("all", "hard", "semi_hard"):
        for soft in (False, True):
            value, _ = checks.assert_finite(TripletLoss(mining=mining, soft=soft), labels, embeddings)
            np.testing.assert_allclose(
                value.numpy(), MINING_REFERENCES[mining](labels, embeddings, soft=soft), rtol=1e-6, atol=1e-7
            )
    for loss, reference in (
        (TripletSemiHardLoss(), ref.tfa_triplet_semihard),
        (TripletHardLoss(), ref.tfa_triplet_hard),
    ):
        value, _ = checks.assert_finite(loss, labels, embeddings)
        np.testing.assert_allclose(value.numpy(), reference(labels, embeddings), rtol=1e-6, atol=1e-7)


def test_float16_and_mixed_precision():
    for loss in (TripletLoss(mining="all"), TripletLoss(mining="semi_hard"), TripletLoss(mining="hard")):
        checks.assert_float16_ok(loss)
    for loss in (TripletSemiHardLoss(), TripletHardLoss()):  # tfa returns the input dtype
        checks.assert_float16_ok(loss, value_dtype=tf.float16)


@pytest.mark.slow
@settings(max_examples=15)
@given(labels=hnp.arrays(np.int32, st.integers(1, 9), elements=st.integers(0, 3)), data=st.data())
def test_fuzzed_batches_are_finite(labels, data):
    embeddings = data.draw(
        hnp.arrays(np.float64, (labels.size, 3), elements=st.floats(-2, 2, allow_nan=False, width=32))
    )
    for loss in (
        TripletLoss(mining="all"),
        TripletLoss(mining="semi_hard", soft=True),
        TripletLoss(mining="hard"),
        TripletSemiHardLoss(),
        TripletHardLoss(soft=True),
    ):
        value, _ = checks.assert_finite(loss, labels, embeddings)
        assert value.numpy() >= 0.0


def test_bad_inputs_are_rejected():
    checks.assert_bad_inputs_rejected(TripletLoss())
    checks.assert_bad_inputs_rejected(TripletSemiHardLoss())
    with pytest.raises(ValueError, match="mining must be one of"):
        TripletLoss(mining="hardest")
    with pytest.raises(ValueError, match=r"TripletLoss: margin must be in \[0, 180\], got -1.0"):
        TripletLoss(margin=-1.0)
    with pytest.raises(ValueError, match="mining must be one of"):
        triplet_loss([0, 0], [[0.0], [1.0]], mining="batch_hard")


@pytest.mark.slow
def test_jit_compile_matches():
    labels, embeddings = checks.random_batch(6, 13, 4)
    for loss in (
        TripletLoss(mining="all"),
        TripletLoss(mining="semi_hard", soft=True),
        TripletLoss(mining="hard"),
        TripletSemiHardLoss(),
    ):
        checks.assert_jit_matches_eager(loss, labels, embeddings)


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss",
    [
        TripletLoss(mining="all"),
        TripletLoss(mining="semi_hard", margin=0.5),
        TripletSemiHardLoss(),
        TripletHardLoss(soft=True),
    ],
    ids=["all", "semi_hard", "tfa_semihard", "tfa_hard"],
)
def test_fit_lowers_the_loss(loss):
    checks.assert_fit_lowers_loss(loss)


def test_config_roundtrip():
    restored = checks.assert_config_roundtrip(TripletLoss(margin=0.3, mining="semi_hard", soft=True, squared=True))
    assert (restored.margin, restored.mining, restored.soft, restored.squared) == (0.3, "semi_hard", True, True)
    checks.assert_config_roundtrip(TripletSemiHardLoss(margin=0.7))
    restored = checks.assert_config_roundtrip(TripletHardLoss(margin=0.4, soft=True))
    assert restored.soft is True and restored.margin == 0.4


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss", [TripletLoss(margin=0.3, mining="hard"), TripletSemiHardLoss(0.6), TripletHardLoss(soft=True)]
)
def test_keras_saving_roundtrip(loss, tmp_path):
    checks.assert_saving_roundtrip(loss, tmp_path)
