"""Cross-batch memory (XBM, Wang et al., CVPR 2020): pair-based losses that also compare with past batches.

Embeddings drift slowly once training has warmed up, so the embeddings of the last few batches are still
good stand-ins for the current model's. `CrossBatchMemory` keeps the last `memory_size` embeddings and labels
in a queue (without gradient) and computes the wrapped loss with the current batch as queries and the queue
as references: a small batch on a 2-core CPU or one GPU mines its pairs among `memory_size` items.

Semantics (those of pytorch-metric-learning's `CrossBatchMemory`, around the same loss, checked against it
in `tests/losses/test_cross_batch_memory.py`):

1. the batch is enqueued first: its (detached) embeddings overwrite the slots `(c, c + 1, ..., c + B - 1)
   mod M` of the queue, `c` the number of items enqueued so far (a ring buffer; `B <= M`);
2. the loss is computed with the batch as queries and every filled slot as references (`[B, min(c + B, M)]`
   pairs, the batch-vs-batch pairs included through the batch's own slots); the pair of a query with its
   own slot is no pair (as `i == i` within a batch);
3. gradients reach the queries only: the references are constants, the batch's own copies included. Without
   memory (`start_step` not reached, evaluation) the wrapped loss is computed on the batch as usual.

The paper's warm-up: for the first `start_step` training calls the wrapped loss runs on the batch alone and
nothing is enqueued (its code enqueues from the start iteration on); pytorch-metric-learning has no warm-up
(`start_step=0`, the default). The queue, its position and the step count are non-trainable variables:
`tfdml.models.MetricModel` tracks them, so `model.save`, checkpoints and `BackupAndRestore` keep them.

Losses whose pairs can run to a separate reference set (`supports_references`): `ContrastiveLoss`,
`TripletLoss`, `MarginLoss`, `RankedListLoss`, `MultiSimilarityLoss`, `CircleLoss`, `SupConLoss`, `NTXentLoss`.
"""

import keras
import numpy as np
from keras import ops

from tfdml.losses.base import _state_variable, _WrappedLoss
from tfdml.losses.memory import MemoryState, require_tensorflow
from tfdml.ops import References

# Attributes of the wrapped loss that the wrapper passes through (the RLL temperature schedule's step binding,
# which `MetricModel.compile` and the `DynamicTemperature` callback look for).
_FORWARDED = ("bind_step", "bound_step", "temperature", "has_schedule")


def _positive_int(value, name, minimum=1):
    if isinstance(value, bool) or int(value) != value or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


@keras.saving.register_keras_serializable(package="tfdml")
class CrossBatchMemory(MemoryState, _WrappedLoss):
    """Wraps a pair-based loss with a cross-batch memory of the last `memory_size` embeddings (XBM).

    At each training call: enqueue the batch, then `loss(queries = batch, references = queue)` with the
    references held constant and each query's own slot excluded (see the module docstring; the semantics of
    pytorch-metric-learning's `CrossBatchMemory`).

    Evaluation must not enqueue: `MetricModel` (every tfdml embedder) tells the loss whether a step trains
    (`loss.training`), so `evaluate` and validation compute the wrapped loss on the batch alone and leave the
    queue untouched. Under a plain `keras.Model` every call is treated as training.

    Under `tf.distribute` the loss gathers the global batch (`MetricLoss`); every replica enqueues the same global
    batch in replica order (the variables are mirrored with `only_first_replica` updates), so the queue is the
    same on every replica and value and summed gradients equal one device's.

    Args:
        loss: the wrapped `MetricLoss` (one with `supports_references`, e.g. `ContrastiveLoss`, `TripletLoss`,
            `MultiSimilarityLoss`, `RankedListLoss`); others are refused with a `ValueError`.
        memory_size: number of embeddings the queue holds (at least the global batch size).
        embedding_dim: width of the embeddings.
        start_step: training calls that use the batch alone before the memory is filled and used (warm-up).
        name: loss name.

    Example:
        >>> inputs = keras.Input((4,))
        >>> model = tfdml.models.MetricModel(inputs, keras.layers.UnitNormalization()(keras.layers.Dense(8)(inputs)))
        >>> loss = CrossBatchMemory(MultiSimilarityLoss(), memory_size=24, embedding_dim=8)
        >>> model.compile(optimizer="adam", loss=loss)
        >>> x, y = np.random.default_rng(0).random((12, 4)), np.repeat(np.arange(3), 4)
        >>> history = model.fit(x, y, batch_size=6, verbose=0)  # two training steps, each batch enqueued
        >>> int(loss.steps), int(loss.memory_count)
        (2, 12)
    """

    _BUFFER_PREFIX = "xbm"

    def __init__(self, loss, memory_size=1024, embedding_dim=None, start_step=0, name="cross_batch_memory", **kwargs):
        require_tensorflow("CrossBatchMemory")
        super().__init__(loss, name=name, **kwargs)
        loss = self.loss
        if not loss.supports_references:
            raise ValueError(
                f"{type(loss).__name__} cannot use a cross-batch memory: it does not compare batch embeddings "
                f"with a separate set of reference embeddings (proxy, classifier and group losses have no "
                f"pairs between embeddings; N-pairs and lifted structure build their tuples within the batch; "
                f"the tensorflow-addons drop-ins: use TripletLoss(mining='semi_hard' or 'hard'))."
            )
        if not self.cross_replica:
            raise ValueError(
                "CrossBatchMemory needs cross_replica=True: the queue holds the global batch, the "
                "same on every replica."
            )
        if embedding_dim is None:
            raise ValueError("CrossBatchMemory needs embedding_dim, the width of the embeddings it stores.")
        self.memory_size = _positive_int(memory_size, "memory_size")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        self.start_step = _positive_int(start_step, "start_step", minimum=0)
        # Set by MetricModel.compute_loss: False in test steps (no enqueue, batch-only loss).
        self.training = True

    def __getattr__(self, name):
        if name in _FORWARDED and "loss" in self.__dict__:
            return getattr(self.__dict__["loss"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _extra_state(self):
        """`(steps,)`: the training calls so far."""
        return (_state_variable(0, "int64", "xbm_steps"),)

    @property
    def memory_embeddings(self):
        """The queue's `[memory_size, embedding_dim]` variable (slot order, see the module docstring)."""
        return self._variables()[0]

    @property
    def memory_labels(self):
        return self._variables()[1]

    @property
    def steps(self):
        """Number of training calls so far (the warm-up counts them)."""
        return self._variables()[3]

    def reset_memory(self):
        """Empties the queue and restarts the warm-up."""
        for variable in self._variables():
            variable.assign(np.zeros(variable.shape))

    def _checked_labels(self, labels, embeddings):
        """`labels`, after checking the batch's width and that it fits in the memory (at run time in a graph)."""
        width = embeddings.shape[-1]
        if width is not None and width != self.embedding_dim:
            raise ValueError(
                f"{self.name}: embeddings have width {width}, the memory stores embedding_dim={self.embedding_dim}."
            )
        size = labels.shape[0]
        message = (
            f"{self.name}: a (global) batch must not hold more than memory_size={self.memory_size} "
            f"embeddings; raise memory_size"
        )
        if size is not None:
            if size > self.memory_size:
                raise ValueError(f"{message} (batch of {size}).")
            return labels
        import tensorflow as tf  # a graph's run-time check; this loss runs on TensorFlow only

        check = tf.debugging.assert_less_equal(tf.shape(labels)[0], self.memory_size, message=message)
        with tf.control_dependencies([check]):
            return tf.identity(labels)

    def compute(self, labels, embeddings):
        if not self.training:
            return self.loss.compute(labels, embeddings)
        labels = self._checked_labels(labels, embeddings)
        self._variables()
        buffer, steps = self._buffer, self.steps
        new_labels, new_embeddings, new_count, slots = buffer.written(labels, embeddings)
        if self.start_step > 0:
            use_memory = steps.value >= self.start_step
            new_embeddings = ops.where(use_memory, new_embeddings, buffer.embeddings.value)
            new_labels = ops.where(use_memory, new_labels, buffer.labels.value)
            new_count = ops.where(use_memory, new_count, buffer.count.value)
        buffer.assign(new_labels, new_embeddings, new_count)
        steps.assign(steps.value + 1)
        valid = buffer.valid(new_count)
        references = References(new_labels, ops.cast(new_embeddings, embeddings.dtype), slots, valid)

        def with_memory():
            return self.loss.compute(labels, embeddings, references)

        if self.start_step == 0:
            return with_memory()
        return ops.cond(use_memory, with_memory, lambda: self.loss.compute(labels, embeddings))

    def get_config(self):
        config = super().get_config()
        config.update(
            memory_size=self.memory_size,
            embedding_dim=self.embedding_dim,
            start_step=self.start_step,
            dtype=self.dtype,
        )
        return config
