"""CrossBatchMemory (XBM): values, gradients and the queue equal pytorch-metric-learning's `CrossBatchMemory`
around the same loss on the same sequence of batches (`tests/references/xbm_reference.json`, written by
`tests/references/generators/xbm_reference.py`); RLL (which PML cannot
wrap) against a NumPy reading of the formula; warm-up,
refused losses and bad input; `fit` (evaluation leaves the queue alone), `model.save` and checkpoint resume;
MirroredStrategy (same queue on every replica, summed gradients equal one device)."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdml.losses as losses
from tests import REFERENCES
from tests import loss_checks as checks
from tests.references import numpy_losses as ref
from tfdml import distribute
from tfdml.losses import CrossBatchMemory
from tfdml.models import MetricModel

with open(os.path.join(REFERENCES, "xbm_reference.json")) as _reference:
    REFERENCE = json.load(_reference)
MEMORY, DIM = REFERENCE["memory_size"], REFERENCE["embedding_dim"]
VALUE_RTOL, GRAD_ATOL = 1e-10, 1e-10


def _batches():
    return [(np.asarray(b["labels"], np.int32), np.asarray(b["embeddings"], np.float64)) for b in REFERENCE["batches"]]


def _inner(name):
    spec = REFERENCE["losses"][name]
    return getattr(losses, spec["tfdml"])(**spec["args"])


def _run(loss, batches):
    """`[(value, gradient wrt the batch)]` of successive calls."""
    out = []
    for labels, embeddings in batches:
        x = tf.constant(embeddings)
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(labels, x)
        grad = tape.gradient(value, x)
        out.append((value.numpy(), np.zeros(x.shape) if grad is None else grad.numpy()))
    return out


# ------------------------------------------------------------------------------ parity with PML
@pytest.mark.parametrize("name", sorted(REFERENCE["losses"]))
def test_values_gradients_and_queue_equal_pytorch_metric_learning(name):
    spec = REFERENCE["losses"][name]
    loss = CrossBatchMemory(_inner(name), memory_size=MEMORY, embedding_dim=DIM, dtype="float64")
    for step, ((value, grad), expected) in enumerate(zip(_run(loss, _batches()), spec["steps"])):
        np.testing.assert_allclose(value, expected["value"], rtol=VALUE_RTOL, atol=1e-12, err_msg=f"step {step}")
        np.testing.assert_allclose(grad, expected["grad_embeddings"], rtol=0, atol=GRAD_ATOL, err_msg=f"step {step}")
    queue = spec["queue"]
    assert queue["has_been_filled"]
    assert int(loss.memory_count.numpy()) % MEMORY == queue["queue_idx"]
    np.testing.assert_array_equal(loss.memory_labels.numpy(), queue["labels"])
    np.testing.assert_array_equal(loss.memory_embeddings.numpy(), queue["embeddings"])


def test_reference_file_is_from_pml_2_9_and_not_trivial():
    assert REFERENCE["pml_version"].startswith("2.9")
    assert {"contrastive", "triplet_all", "margin_all_triplets", "multi_similarity_mined"} <= set(REFERENCE["losses"])
    sizes = [len(b["labels"]) for b in REFERENCE["batches"]]
    assert sum(sizes) > 2 * MEMORY and sum(sizes) % MEMORY != 0  # the ring buffer wraps, mid-batch
    for spec in REFERENCE["losses"].values():
        assert all(step["value"] > 0 for step in spec["steps"])
        assert all(np.abs(step["grad_embeddings"]).max() > 1e-4 for step in spec["steps"])


def test_memory_changes_the_loss_after_the_first_step():
    """With the first batch alone in memory XBM computes the plain loss; from the second batch on it does not."""
    batches = _batches()
    loss = CrossBatchMemory(losses.ContrastiveLoss(), memory_size=MEMORY, embedding_dim=DIM, dtype="float64")
    values = [v for v, _ in _run(loss, batches[:2])]
    plain = losses.ContrastiveLoss(dtype="float64")
    np.testing.assert_allclose(values[0], plain(*batches[0]).numpy(), rtol=1e-12)
    assert abs(values[1] - plain(*batches[1]).numpy()) > 1e-3


SUPPORTED = {
    "contrastive": lambda: losses.ContrastiveLoss(),
    "triplet_all": lambda: losses.TripletLoss(mining="all"),
    "triplet_hard": lambda: losses.TripletLoss(mining="hard"),
    "triplet_semi_hard": lambda: losses.TripletLoss(mining="semi_hard", margin=0.5),
    "margin_all": lambda: losses.MarginLoss(sampling="all", learn_beta=False),
    "ranked_list": lambda: losses.RankedListLoss(),
    "ranked_list_uniform": lambda: losses.RankedListLoss(query_weighting="uniform"),
    "multi_similarity": lambda: losses.MultiSimilarityLoss(),
    "circle": lambda: losses.CircleLoss(),
    "supcon": lambda: losses.SupConLoss(),
    "ntxent": lambda: losses.NTXentLoss(),
}


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_first_step_equals_the_plain_loss_on_the_batch(name):
    """The memory then holds the batch only: the same pairs as the plain loss (value; for RLL, whose gallery is
    a constant by default, the gradient too)."""
    labels, embeddings = _batches()[0]
    loss = CrossBatchMemory(SUPPORTED[name](), memory_size=MEMORY, embedding_dim=DIM, dtype="float64")
    [(value, grad)] = _run(loss, [(labels, embeddings)])
    plain = SUPPORTED[name]()
    plain_value, plain_grad = checks.value_and_gradient(
        lambda y, x: plain.compute(*plain_inputs(y, x)), labels, tf.constant(embeddings)
    )
    np.testing.assert_allclose(value, plain_value.numpy(), rtol=1e-10, atol=1e-12)
    if name.startswith("ranked_list"):
        np.testing.assert_allclose(grad, plain_grad.numpy(), rtol=0, atol=1e-10)


def plain_inputs(labels, embeddings):
    return tf.constant(labels, tf.int32), tf.convert_to_tensor(embeddings)


def _numpy_rll_to_references(
    labels, queries, ref_labels, references, self_columns, weights_from, margin=0.4, tn=10.0, lam=0.5
):
    """RLL with uniform query weights (eq. 14), each query ranked against the references, its own copy
    excluded; the mined sets and weights come from `weights_from` (constants, as the official layer)."""
    alpha, total = 1.0 + margin / 2.0, 0.0
    boundary = alpha - margin
    for i in range(len(labels)):
        pos_terms, pos_logits, neg_terms, neg_logits = [], [], [], []
        for j in range(len(ref_labels)):
            if j == self_columns[i]:
                continue
            d, d_w = ref.distance(queries[i], references[j]), ref.distance(weights_from[i], references[j])
            if ref_labels[j] == labels[i] and d_w > boundary:
                pos_terms.append(d - boundary)
                pos_logits.append(0.0)
            elif ref_labels[j] != labels[i] and d_w < alpha:
                neg_terms.append(alpha - d)
                neg_logits.append(tn * (alpha - d_w))
        total += (1 - lam) * ref._weighted_sum(pos_terms, pos_logits) + lam * ref._weighted_sum(neg_terms, neg_logits)
    return total / len(labels)


def test_ranked_list_loss_with_memory_equals_numpy_on_every_step():
    """PML cannot wrap its RLL (no reference set): tfdml's is checked against the formula, value and gradient
    (finite differences on the queries), at every step of the sequence, wrap-around included."""
    loss = CrossBatchMemory(
        losses.RankedListLoss(query_weighting="uniform"), memory_size=MEMORY, embedding_dim=DIM, dtype="float64"
    )
    count = 0
    for labels, embeddings in _batches():
        [(value, grad)] = _run(loss, [(labels, embeddings)])
        slots = (count + np.arange(len(labels))) % MEMORY
        count += len(labels)
        ref_labels, references = loss.stored()

        def fn(x, labels=labels, ref_labels=ref_labels, references=references, slots=slots, fixed=embeddings):
            return _numpy_rll_to_references(labels, x, ref_labels, references, slots, fixed)

        np.testing.assert_allclose(value, fn(embeddings), rtol=1e-10)
        np.testing.assert_allclose(grad, ref.numerical_gradient(fn, embeddings), rtol=0, atol=1e-6)


def test_warm_up_uses_the_batch_alone_then_a_memory_that_starts_empty():
    batches = _batches()
    warm = CrossBatchMemory(losses.TripletLoss(), memory_size=MEMORY, embedding_dim=DIM, start_step=2, dtype="float64")
    got = _run(warm, batches)
    plain = losses.TripletLoss(dtype="float64")
    for (value, grad), (labels, embeddings) in zip(got[:2], batches[:2]):
        want_value, want_grad = checks.value_and_gradient(plain, labels, tf.constant(embeddings))
        np.testing.assert_allclose(value, want_value.numpy(), rtol=1e-12)
        np.testing.assert_allclose(grad, want_grad.numpy(), atol=1e-12)
    fresh = CrossBatchMemory(losses.TripletLoss(), memory_size=MEMORY, embedding_dim=DIM, dtype="float64")
    for (value, grad), (want_value, want_grad) in zip(got[2:], _run(fresh, batches[2:])):
        np.testing.assert_allclose(value, want_value, rtol=1e-12)
        np.testing.assert_allclose(grad, want_grad, atol=1e-12)
    assert int(warm.steps.numpy()) == len(batches)
    assert int(warm.memory_count.numpy()) == sum(len(b[0]) for b in batches[2:])


@pytest.mark.slow
def test_traced_and_xla_calls_equal_eager_calls():
    batches = _batches()
    eager = _run(
        CrossBatchMemory(
            losses.MultiSimilarityLoss(), memory_size=MEMORY, embedding_dim=DIM, start_step=1, dtype="float64"
        ),
        batches,
    )
    for jit in (False, True):
        loss = CrossBatchMemory(
            losses.MultiSimilarityLoss(), memory_size=MEMORY, embedding_dim=DIM, start_step=1, dtype="float64"
        )
        _ = loss.non_trainable_variables  # created outside the function

        @tf.function(jit_compile=jit, reduce_retracing=True)
        def step(labels, x, loss=loss):
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = loss(labels, x)
            return value, tape.gradient(value, x)

        for (labels, embeddings), (want_value, want_grad) in zip(batches, eager):
            value, grad = step(tf.constant(labels), tf.constant(embeddings))
            np.testing.assert_allclose(value.numpy(), want_value, rtol=1e-10)
            np.testing.assert_allclose(grad.numpy(), want_grad, atol=1e-10)


# ------------------------------------------------------------------------------ errors and config
@pytest.mark.parametrize(
    "inner",
    [
        losses.NPairsLoss(),
        losses.LiftedStructureLoss(),
        losses.ProxyAnchorLoss(4, 5),
        losses.GroupLoss(4),
        losses.TripletSemiHardLoss(),
        losses.NormalizedSoftmaxLoss(4, 5),
        losses.SmoothAPLoss(),
    ],
)
def test_losses_without_pairs_to_references_are_refused(inner):
    with pytest.raises(ValueError, match=f"{type(inner).__name__} cannot use a cross-batch memory"):
        CrossBatchMemory(inner, memory_size=16, embedding_dim=5)


@pytest.mark.slow
def test_bad_arguments_and_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="wraps a tfdml MetricLoss"):
        CrossBatchMemory(keras.losses.MeanSquaredError(), embedding_dim=4)
    with pytest.raises(ValueError, match="needs embedding_dim"):
        CrossBatchMemory(losses.ContrastiveLoss())
    with pytest.raises(ValueError, match="memory_size must be an integer >= 1"):
        CrossBatchMemory(losses.ContrastiveLoss(), memory_size=0, embedding_dim=4)
    with pytest.raises(ValueError, match="start_step must be an integer >= 0"):
        CrossBatchMemory(losses.ContrastiveLoss(), embedding_dim=4, start_step=-1)
    with pytest.raises(ValueError, match="cross_replica=True"):
        CrossBatchMemory(losses.ContrastiveLoss(), embedding_dim=4, cross_replica=False)
    loss = CrossBatchMemory(losses.ContrastiveLoss(), memory_size=6, embedding_dim=4)
    with pytest.raises(ValueError, match="width 3, the memory stores embedding_dim=4"):
        loss(np.zeros(4, np.int32), np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match="more than memory_size=6"):
        loss(np.zeros(8, np.int32), np.ones((8, 4), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than memory_size=6"):
        tf.function(loss, input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, 4])])(
            np.zeros(8, np.int32), np.ones((8, 4), np.float32)
        )
    checks.assert_bad_inputs_rejected(CrossBatchMemory(losses.ContrastiveLoss(), memory_size=64, embedding_dim=4))


def test_config_round_trip_keeps_the_wrapped_loss():
    loss = CrossBatchMemory(
        losses.RankedListLoss(margin=0.3, tn=losses.LinearTemperature(20.0, 5.0, 100)),
        memory_size=48,
        embedding_dim=4,
        start_step=7,
    )
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert restored.get_config() == loss.get_config()
    assert isinstance(restored.loss, losses.RankedListLoss) and restored.loss.margin == 0.3
    assert (restored.memory_size, restored.embedding_dim, restored.start_step) == (48, 4, 7)
    assert restored.has_schedule  # the schedule's step binding is passed through to the wrapped loss


# ------------------------------------------------------------------------------ training, saving, resuming
def _embedder(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    outputs = keras.layers.UnitNormalization(axis=-1)(keras.layers.Dense(4)(hidden))
    return MetricModel(inputs, outputs)


@pytest.mark.slow
def test_fit_trains_and_only_training_steps_enter_the_memory():
    x, y = checks.clustered_data(per_class=8)  # 32 samples: 4 batches of 8
    model = _embedder()
    loss = CrossBatchMemory(losses.MultiSimilarityLoss(), memory_size=24, embedding_dim=4, start_step=2)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=loss, jit_compile=False)
    assert sum(v is loss.memory_embeddings for v in model.non_trainable_variables) == 1
    exact = losses.MultiSimilarityLoss()
    before = float(exact(y, model(x)))
    order = np.random.default_rng(0).permutation(len(y))
    history = model.fit(
        x[order], y[order], batch_size=8, epochs=6, shuffle=False, verbose=0, validation_data=(x[:16], y[:16])
    )
    assert np.all(np.isfinite(history.history["loss"]))
    assert float(exact(y, model(x))) < 0.8 * before
    assert int(loss.steps.numpy()) == 24 and int(loss.memory_count.numpy()) == 8 * 22  # 2 warm-up steps
    stored = loss.memory_embeddings.numpy().copy()
    model.evaluate(x, y, batch_size=8, verbose=0)
    np.testing.assert_array_equal(loss.memory_embeddings.numpy(), stored)
    assert int(loss.steps.numpy()) == 24
    # The stored embeddings are the model's outputs on the last 3 training batches (24 slots, 8 per batch).
    last = order[-24:]
    slots = (8 * 22 - 24 + np.arange(24)) % 24  # the last 24 of the 176 enqueued items
    np.testing.assert_array_equal(loss.memory_labels.numpy()[slots], y[last])


def _trained(epochs=2):
    x, y = checks.clustered_data(per_class=6)
    model = _embedder(1)
    loss = CrossBatchMemory(losses.ContrastiveLoss(), memory_size=20, embedding_dim=4)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, jit_compile=False)
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    return model, loss, x, y


@pytest.mark.slow
def test_model_save_and_load_keep_the_queue_and_training_continues_identically(tmp_path):
    model, loss, x, y = _trained()
    path = str(tmp_path / "xbm.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    restored_loss = restored.loss
    assert isinstance(restored_loss, CrossBatchMemory)
    for got, want in zip(restored_loss.non_trainable_variables, loss.non_trainable_variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert int(restored_loss.memory_count.numpy()) == 2 * len(y)
    for m in (model, restored):
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(restored_loss.memory_embeddings.numpy(), loss.memory_embeddings.numpy(), atol=1e-6)
    np.testing.assert_allclose(restored.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


@pytest.mark.slow
def test_fit_distributed_checkpoint_resumes_with_the_queue(tmp_path):
    """`tfdml.training.fit_distributed`'s checkpoints hold the queue: 1 epoch + a resumed epoch in a new model
    equals 2 uninterrupted epochs, queue included."""
    from tfdml.training import fit_distributed

    x, y = checks.clustered_data(per_class=6)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)

    def make():  # eager: the checkpoint is the point here (the traced fit_distributed step is tested elsewhere)
        model = _embedder(3)
        loss = CrossBatchMemory(losses.ContrastiveLoss(), memory_size=20, embedding_dim=4, start_step=2)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, run_eagerly=True)
        return model, loss

    straight, straight_loss = make()
    fit_distributed(straight, dataset, epochs=2, verbose=0)
    first, _ = make()
    fit_distributed(first, dataset, epochs=1, verbose=0, checkpoint_dir=str(tmp_path))
    resumed, resumed_loss = make()
    fit_distributed(resumed, dataset, epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    assert int(resumed_loss.steps.numpy()) == 2 * 3
    for got, want in zip(resumed_loss.non_trainable_variables, straight_loss.non_trainable_variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(resumed.predict(x, verbose=0), straight.predict(x, verbose=0), atol=1e-6)


class _Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("interrupted")


class _MemoryAtStart(keras.callbacks.Callback):
    def __init__(self, loss):
        super().__init__()
        self.loss, self.state = loss, None

    def on_train_begin(self, logs=None):
        self.state = [v.numpy().copy() for v in self.loss.non_trainable_variables]


@pytest.mark.slow
def test_backup_and_restore_resumes_with_the_queue(tmp_path):
    """A job killed after epoch 2 resumes (a new model, `BackupAndRestore`) with the queue of that epoch."""
    x, y = checks.clustered_data(per_class=6)
    backup = str(tmp_path / "backup")

    def make():
        model = _embedder(2)
        loss = CrossBatchMemory(losses.TripletLoss(), memory_size=20, embedding_dim=4)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, jit_compile=False)
        return model, loss

    model, loss = make()
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(
            x,
            y,
            batch_size=8,
            epochs=4,
            shuffle=False,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(backup), _Interrupt()],
        )
    at_interrupt = [v.numpy().copy() for v in loss.non_trainable_variables]
    assert int(loss.memory_count.numpy()) == 2 * len(y)
    resumed, resumed_loss = make()
    probe = _MemoryAtStart(resumed_loss)
    resumed.fit(
        x,
        y,
        batch_size=8,
        epochs=4,
        shuffle=False,
        verbose=0,
        callbacks=[keras.callbacks.BackupAndRestore(backup), probe],
    )
    for got, want in zip(probe.state, at_interrupt):
        np.testing.assert_array_equal(got, want)
    assert int(resumed_loss.memory_count.numpy()) == 4 * len(y)


# ------------------------------------------------------------------------------ MirroredStrategy
def _global_batches(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(4):
        labels = np.resize(np.arange(4), 12)
        rng.shuffle(labels)
        out.append((rng.normal(size=(12, 6)), labels.astype(np.int32)))
    return out


def _linear_model():
    model = keras.Sequential(
        [keras.Input((6,), dtype="float64"), keras.layers.Dense(DIM, use_bias=False, dtype="float64")]
    )
    model.set_weights([np.random.default_rng(1).normal(size=(6, DIM)) * 0.7])
    return model


def _make_xbm():
    return CrossBatchMemory(
        losses.MultiSimilarityLoss(), memory_size=30, embedding_dim=DIM, start_step=1, dtype="float64"
    )


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [2])
def test_replicas_hold_the_same_queue_and_sum_to_the_single_device_gradient(replicas):
    from tfdml.training import replica_slice

    def head(outputs):
        return tf.math.l2_normalize(outputs, axis=1)

    model, loss = _linear_model(), _make_xbm()
    single = []
    for x, y in _global_batches():
        with tf.GradientTape() as tape:
            value = loss(y, head(model(x)))
        single.append((value.numpy(), tape.gradient(value, model.trainable_variables)[0].numpy()))

    strategy = distribute.mirrored_strategy([f"/cpu:{i}" for i in range(replicas)])
    with strategy.scope():
        replica_model, replica_loss = _linear_model(), _make_xbm()
        _ = replica_loss.non_trainable_variables  # mirrored variables, created in the scope
    for step, (x, y) in enumerate(_global_batches()):
        batch = strategy.experimental_distribute_values_from_function(
            lambda context, x=x, y=y: replica_slice(
                (tf.constant(x), tf.constant(y)), context.replica_id_in_sync_group, replicas
            )
        )

        def replica_step(features, labels):
            with tf.GradientTape() as tape:
                value = replica_loss(labels, head(replica_model(features)))
            return value, tape.gradient(value, replica_model.trainable_variables)[0]

        values, grads = strategy.run(replica_step, args=batch)
        value = strategy.reduce("SUM", values, axis=None).numpy()
        grad = strategy.reduce("SUM", grads, axis=None).numpy()
        np.testing.assert_allclose(value, single[step][0], rtol=0, atol=1e-10, err_msg=f"step {step}")
        assert np.abs(single[step][1]).max() > 1e-3
        np.testing.assert_allclose(grad, single[step][1], rtol=0, atol=1e-10, err_msg=f"step {step}")
    for variable, want in zip(replica_loss.non_trainable_variables, loss.non_trainable_variables):
        components = strategy.experimental_local_results(variable.value)  # the tf.distribute variable
        assert len(components) == replicas
        for component in components:  # every replica holds the global batches, in the same order
            np.testing.assert_array_equal(np.asarray(component), want.numpy())


def _xbm_model(run_eagerly=False):
    class Embedder(MetricModel):
        def __init__(self):
            super().__init__(name="xbm_embedder", dtype="float64")
            self.embedding = keras.layers.Dense(
                DIM, dtype="float64", name="embedding", kernel_initializer=keras.initializers.GlorotUniform(seed=2)
            )
            self.unit = keras.layers.UnitNormalization(dtype="float64")

        def call(self, inputs):
            return self.unit(self.embedding(inputs))

    model = Embedder()
    model(np.zeros((1, 6)))
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=_make_xbm(), jit_compile=False, run_eagerly=run_eagerly)
    return model


@pytest.mark.slow
def test_fit_on_two_replicas_matches_one_device_weights_and_queue():
    """The traced `fit` path: 2 epochs of 4 global batches of 12 on 2 replicas, against one device (eager)."""
    xs, ys = zip(*_global_batches(seed=1))
    dataset = tf.data.Dataset.from_tensor_slices((np.concatenate(xs), np.concatenate(ys))).batch(12)
    single = _xbm_model(run_eagerly=True)
    start = single.get_weights()[0].copy()
    single.fit(dataset, epochs=2, verbose=0, shuffle=False)
    with distribute.mirrored_strategy(["/cpu:0", "/cpu:1"]).scope():
        mirrored = _xbm_model()
    mirrored.fit(dataset, epochs=2, verbose=0, shuffle=False)
    assert np.abs(single.get_weights()[0] - start).max() > 1e-3
    np.testing.assert_allclose(mirrored.get_weights()[0], single.get_weights()[0], rtol=0, atol=1e-10)
    assert int(mirrored.loss.memory_count.numpy()) == 7 * 12  # 1 warm-up step, 7 enqueued global batches
    for got, want in zip(mirrored.loss.non_trainable_variables, single.loss.non_trainable_variables):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=0, atol=1e-12)


def test_multi_level_embedder_refuses_a_memory_shared_by_its_levels():
    from tfdml.models import MultiLevelEmbedder

    model = MultiLevelEmbedder("small_cnn", embedding_dim=4, input_shape=(12, 12, 1), head_filters=4, head_units=6)
    model.compile(optimizer="sgd", loss=CrossBatchMemory(losses.ContrastiveLoss(), embedding_dim=4))
    with pytest.raises(ValueError, match="each of its 3 levels; a cross-batch memory .* one embedding per sample"):
        model.compute_loss(np.zeros((4, 12, 12, 1), np.float32), np.arange(4), model(np.zeros((4, 12, 12, 1))))


@pytest.mark.slow
def test_single_level_embedder_trains_with_a_memory_and_its_evaluation_leaves_it_alone():
    from tfdml.models import Embedder

    keras.utils.set_random_seed(0)
    model = Embedder("small_cnn", embedding_dim=4, input_shape=(12, 12, 1), weights=None)
    loss = CrossBatchMemory(losses.TripletLoss(), memory_size=16, embedding_dim=4)
    model.compile(optimizer="adam", loss=loss, jit_compile=False)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 12, 12, 1)).astype(np.float32), np.repeat(np.arange(4), 4).astype(np.int32)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, validation_data=(x[:8], y[:8]))
    assert np.all(np.isfinite(history.history["val_loss"]))
    assert int(loss.memory_count.numpy()) == 32 and int(loss.steps.numpy()) == 4
    labels, _ = loss.stored()
    np.testing.assert_array_equal(labels, y)  # the second epoch's two batches, in order


@pytest.mark.slow
def test_job_configuration_wraps_the_loss_in_a_memory_and_trains():
    from tfdml import pipeline
    from tfdml.config import ConfigError, load_config

    small = ["loss.name=contrastive", "data.classes_per_batch=4", "data.samples_per_class=2"]
    config = load_config(
        overrides=[*small, "loss.cross_batch_memory.memory_size=16", "loss.cross_batch_memory.start_step=1"]
    )
    keras.utils.set_random_seed(0)
    model, embedder = pipeline.build_model(config, (32, 32, 1), total_steps=2)
    loss = model.loss
    assert isinstance(loss, CrossBatchMemory) and isinstance(loss.loss, losses.ContrastiveLoss)
    assert (loss.memory_size, loss.embedding_dim, loss.start_step) == (16, embedder.embedding_dim, 1)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(size=(16, 32, 32, 1)).astype(np.float32), np.repeat(np.arange(8), 2).astype(np.int32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert int(loss.steps.numpy()) == 2 and int(loss.memory_count.numpy()) == 8  # the warm-up step enqueues nothing
    np.testing.assert_array_equal(loss.stored()[0], y[8:])

    for overrides, message in [
        (["loss.cross_batch_memory.memory_size=7"], r"memory_size: 7 is less than a batch .* = 8\)"),
        (
            ["model.type=multilevel", "model.levels=[L,H]", "loss.cross_batch_memory.memory_size=16"],
            "one embedding per image; model.levels",
        ),
        (
            ["loss.name=n_pairs", "loss.cross_batch_memory.memory_size=16"],
            "n_pairs has no pairs to a memory .* works with circle, contrastive",
        ),
        (
            ["loss.cross_batch_memory.memory_size=16", "loss.cross_batch_memory.start=3"],
            "unknown configuration key 'loss.cross_batch_memory.start'",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(overrides=[*small, *overrides])
