"""Cross-replica losses: N replicas of a `MirroredStrategy` train like one device on the same global batch.

For every tfdml loss the gradient summed over 2 and 4 replicas (what Keras' optimizers apply) must equal
the single-device gradient of the same loss on the whole batch, including the margin loss' mirrored
`beta`; with `cross_replica=False` it must not (each replica then ranks its own share only).
The logical CPU devices come from `tests/conftest.py`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdml import distribute
from tfdml.losses import (
    ContrastiveLoss,
    GroupLoss,
    MarginLoss,
    RankedListLoss,
    TripletHardLoss,
    TripletLoss,
    TripletSemiHardLoss,
)
from tfdml.training import replica_slice

NUM_CLASSES = 4
IN_DIM, EMB_DIM = 6, 5
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def strategies():
    return {n: distribute.mirrored_strategy([f"/cpu:{i}" for i in range(n)]) for n in (2, 4)}


def _batch(size, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.resize(np.arange(NUM_CLASSES), size)
    rng.shuffle(labels)
    return rng.normal(size=(size, IN_DIM)), labels.astype(np.int32)


def _kernel(width, seed=1):
    return np.random.default_rng(seed).normal(size=(IN_DIM, width)) * 0.7


def _make_model(width):
    """A linear float64 model with a fixed kernel: identical on one device and on every replica."""
    model = keras.Sequential(
        [keras.Input((IN_DIM,), dtype="float64"), keras.layers.Dense(width, use_bias=False, dtype="float64")]
    )
    model.set_weights([_kernel(width)])
    return model


def _embeddings_head(outputs):
    return tf.math.l2_normalize(outputs, axis=1)


def _group_head(outputs):
    """Group Loss' y_pred: `concat([unit embeddings, logits])`, the loss gathers the whole width."""
    return tf.concat([tf.math.l2_normalize(outputs[:, :EMB_DIM], axis=1), outputs[:, EMB_DIM:]], axis=1)


# name -> (loss factory, output width, head)
LOSSES = {
    "ranked_list": (lambda **kw: RankedListLoss(**kw), EMB_DIM, _embeddings_head),
    "ranked_list_both_ends": (
        lambda **kw: RankedListLoss(stop_gallery_gradient=False, tn=20.0, **kw),
        EMB_DIM,
        _embeddings_head,
    ),
    "triplet_hard": (lambda **kw: TripletHardLoss(**kw), EMB_DIM, _embeddings_head),
    "triplet_semi_hard": (lambda **kw: TripletSemiHardLoss(**kw), EMB_DIM, _embeddings_head),
    "triplet_all": (lambda **kw: TripletLoss(margin=0.5, mining="all", **kw), EMB_DIM, _embeddings_head),
    "contrastive": (lambda **kw: ContrastiveLoss(neg_margin=1.2, **kw), EMB_DIM, _embeddings_head),
    "margin_all_triplets": (lambda **kw: MarginLoss(sampling="all", nu=0.1, **kw), EMB_DIM, _embeddings_head),
    # Stateless draw: every replica samples the same negatives on the same gathered batch.
    "margin_distance_weighted_per_class_beta": (
        lambda **kw: MarginLoss(num_classes=NUM_CLASSES, seed=7, **kw),
        EMB_DIM,
        _embeddings_head,
    ),
    "group": (lambda **kw: GroupLoss(NUM_CLASSES, temperature=2.0, **kw), EMB_DIM + NUM_CLASSES, _group_head),
}


def _single_device_gradients(make_loss, width, head, x, y):
    model, loss = _make_model(width), make_loss()
    variables = model.trainable_variables + loss.trainable_variables
    with tf.GradientTape() as tape:
        value = loss(y, head(model(x)))
    return value.numpy(), [g.numpy() for g in tape.gradient(value, variables)]


def _replica_gradients(strategy, make_loss, width, head, x, y, **loss_kwargs):
    """Gradients and loss values summed over replicas (what the optimizer's all-reduce applies).

    Runs eagerly (replica threads): tracing every loss for every replica count would cost far more than
    these tiny computations; the traced path is covered by `tests/test_distribute_training.py`.
    """
    with strategy.scope():
        model, loss = _make_model(width), make_loss(**loss_kwargs)
        variables = model.trainable_variables + loss.trainable_variables  # beta: a mirrored variable
    replicas = strategy.num_replicas_in_sync
    batch = strategy.experimental_distribute_values_from_function(
        lambda context: replica_slice((tf.constant(x), tf.constant(y)), context.replica_id_in_sync_group, replicas)
    )

    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            value = loss(labels, head(model(features)))
        return value, tape.gradient(value, variables)

    values, gradients = strategy.run(replica_step, args=batch)
    value, gradients = strategy.reduce("SUM", values, axis=None), strategy.reduce("SUM", gradients, axis=None)
    return value.numpy(), [g.numpy() for g in gradients]


# The losses of the issue on 2 and 4 replicas; the other variants on 4.
CORE = ["ranked_list", "triplet_hard", "triplet_semi_hard", "margin_all_triplets", "group"]
CASES = [(name, n) for name in CORE for n in (2, 4)] + [(name, 4) for name in sorted(set(LOSSES) - set(CORE))]


@pytest.mark.slow
@pytest.mark.parametrize("name,replicas", CASES)
def test_summed_replica_gradient_equals_single_device_gradient(strategies, name, replicas):
    make_loss, width, head = LOSSES[name]
    x, y = _batch(16)
    expected_value, expected = _single_device_gradients(make_loss, width, head, x, y)
    value, gradients = _replica_gradients(strategies[replicas], make_loss, width, head, x, y)
    # Each replica holds L / N: the summed value is the global loss.
    np.testing.assert_allclose(value, expected_value, rtol=0, atol=TOLERANCE)
    assert len(gradients) == len(expected)
    for got, want in zip(gradients, expected):
        assert np.abs(want).max() > 1e-3, f"{name}: degenerate test, zero gradient"
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)


@pytest.mark.slow
def test_uneven_replica_shares_still_give_the_single_device_gradient(strategies):
    """14 samples on 4 replicas (shares 3, 4, 3, 4): the gather concatenates shares of different sizes."""
    make_loss, width, head = LOSSES["triplet_semi_hard"]
    x, y = _batch(14, seed=3)
    _, expected = _single_device_gradients(make_loss, width, head, x, y)
    _, gradients = _replica_gradients(strategies[4], make_loss, width, head, x, y)
    for got, want in zip(gradients, expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("name", ["ranked_list", "triplet_semi_hard", "margin_all_triplets", "group"])
def test_per_replica_option_ranks_each_share_alone(strategies, name):
    """`cross_replica=False` equals the replica-mean of single-device losses on each share."""
    make_loss, width, head = LOSSES[name]
    x, y = _batch(16, seed=5)
    value, gradients = _replica_gradients(strategies[2], make_loss, width, head, x, y, cross_replica=False)
    halves = [_single_device_gradients(make_loss, width, head, x[s], y[s]) for s in (slice(0, 8), slice(8, 16))]
    np.testing.assert_allclose(value, np.mean([h[0] for h in halves]), rtol=0, atol=TOLERANCE)
    for i, got in enumerate(gradients):
        np.testing.assert_allclose(got, np.mean([h[1][i] for h in halves], axis=0), rtol=0, atol=TOLERANCE)
    _, global_gradients = _single_device_gradients(make_loss, width, head, x, y)
    assert max(np.abs(g - w).max() for g, w in zip(gradients, global_gradients)) > 1e-3


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_cross_replica_option_round_trips_through_config(name):
    make_loss = LOSSES[name][0]
    assert make_loss().get_config()["cross_replica"] is True
    loss = make_loss(cross_replica=False)
    config = loss.get_config()
    assert config["cross_replica"] is False
    restored = type(loss).from_config(config)
    assert restored.cross_replica is False
    assert keras.losses.deserialize(keras.losses.serialize(loss)).cross_replica is False


def test_helpers_are_identities_outside_a_multi_replica_step(strategies):
    tensor = tf.constant([[1.0, 2.0]])
    assert distribute.num_replicas() == 1
    assert not distribute.is_cross_replica_step()
    assert distribute.gather_replicas(tensor) is tensor
    assert distribute.scale_for_replicas(tensor) is tensor
    with strategies[2].scope():  # cross-replica context: no replica to gather from
        assert distribute.num_replicas() == 1
        assert distribute.gather_replicas(tensor) is tensor


def test_gather_replicas_concatenates_shares_in_replica_order(strategies):
    strategy = strategies[4]
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.fill([context.replica_id_in_sync_group + 1, 2], context.replica_id_in_sync_group)
    )

    @tf.function
    def gather(values):
        return strategy.run(lambda v: (distribute.gather_replicas(v), distribute.num_replicas()), args=(values,))

    gathered, counts = gather(values)
    for replica_value, count in zip(
        strategy.experimental_local_results(gathered), strategy.experimental_local_results(counts)
    ):
        np.testing.assert_array_equal(replica_value.numpy()[:, 0], [0, 1, 1, 2, 2, 2, 3, 3, 3, 3])
        assert int(count) == 4


def test_replica_slice_splits_contiguously():
    batch = (tf.range(10), tf.reshape(tf.range(20), [10, 2]))
    shares = [replica_slice(batch, r, 4) for r in range(4)]
    np.testing.assert_array_equal(np.concatenate([s[0].numpy() for s in shares]), np.arange(10))
    assert [int(tf.shape(s[0])[0]) for s in shares] == [2, 3, 2, 3]
    np.testing.assert_array_equal(shares[1][1].numpy(), [[4, 5], [6, 7], [8, 9]])


def test_float_labels_are_only_cast_back_during_keras_symbolic_build(strategies):
    float_labels = tf.constant([0.0, 1.0])
    assert distribute.labels_for_symbolic_build(float_labels).dtype == tf.float32  # eager: unchanged
    with strategies[2].scope():
        cast = tf.function(distribute.labels_for_symbolic_build)(float_labels)
    assert cast.dtype == tf.int32
    with pytest.raises(TypeError, match="integer class ids"):
        RankedListLoss()(float_labels, tf.eye(2))


def test_mirrored_strategy_helper_keeps_strategies_of_different_sizes_apart(strategies):
    """Plain MirroredStrategy()s of 4 then 2 devices in one process fail ("joining a group with size")."""
    sizes = {}
    for strategy in (
        strategies[4],
        distribute.mirrored_strategy(["/cpu:0", "/cpu:1"]),
        tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"]),
    ):  # plain, created after
        total = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(1.0)))
        sizes[strategy.num_replicas_in_sync] = float(strategy.experimental_local_results(total)[0])
    assert sizes == {4: 4.0, 2: 2.0, 3: 3.0}
