"""The ring buffer of the losses that remember past batches (`CrossBatchMemory`, `PRISM`).

`RingBuffer` holds the last `size` rows (an embedding and its label) written to it: the `n`-th row written
(counting from 0) goes to slot `n mod size`. Its state is three non-trainable variables (embeddings, labels,
the count of rows written), which `tfdml.models.MetricModel` tracks and saves. A write is computed with
static shapes (`written`, a masked scatter) and stored with `assign`, so that a loss can decide, inside its
traced step, whether to keep it.

Both losses update their state inside the loss call, which the TensorFlow backend's train step allows; the
JAX backend's train step is a pure function whose loss cannot assign variables, so they refuse the other
backends (`require_tensorflow`).
"""

import keras
import numpy as np
from keras import ops

from tfdml.losses.base import _state_variable


def require_tensorflow(loss_name):
    """Raises a one-line `RuntimeError` unless Keras runs on the TensorFlow backend."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise RuntimeError(
            f"{loss_name} needs the TensorFlow backend (KERAS_BACKEND=tensorflow), got {backend!r}: it updates "
            f"its memory inside the loss call, which only TensorFlow's train step allows."
        )


class RingBuffer:
    """The last `size` embeddings (`[size, dim]`, `dtype`) and labels written, in slot order (module docstring).

    Args:
        size: number of slots.
        dim: width of the embeddings.
        dtype: dtype of the stored embeddings.
        prefix: prefix of the variables' names (`<prefix>_embeddings`, `<prefix>_labels`, `<prefix>_count`).
    """

    def __init__(self, size, dim, dtype, prefix):
        self.size = int(size)
        self.embeddings = _state_variable(np.zeros((self.size, int(dim))), dtype, f"{prefix}_embeddings")
        self.labels = _state_variable(np.zeros(self.size), "int32", f"{prefix}_labels")
        self.count = _state_variable(0, "int64", f"{prefix}_count")

    @property
    def variables(self):
        """`(embeddings, labels, count)`."""
        return self.embeddings, self.labels, self.count

    def valid(self, count=None):
        """bool `[size]`: the slots that hold a row after `count` writes (default: the current count)."""
        count = self.count.value if count is None else count
        return ops.arange(self.size, dtype="int64") < ops.minimum(ops.cast(count, "int64"), self.size)

    def written(self, labels, embeddings, keep=None):
        """`(labels [size], embeddings [size, dim], count, slots [B])` after writing the rows of the batch where
        `keep` (bool `[B]`, default all) is true, in batch order; `slots` is each row's slot (kept rows only
        are written). Nothing is assigned. The batch must not hold more kept rows than `size`."""
        keep = ops.ones_like(labels, dtype="bool") if keep is None else keep
        kept = ops.cast(keep, "int64")
        order = ops.cumsum(kept) - 1  # position of each kept row among the kept rows
        slots = ops.cast((self.count.value + order) % self.size, "int32")
        # Rows not kept go to an extra slot `size`, cut off after the scatter: a write of static shape.
        targets = ops.where(keep, slots, self.size)[:, None]
        stored_embeddings = ops.cast(ops.stop_gradient(embeddings), self.embeddings.dtype)
        new_embeddings = ops.scatter_update(
            ops.concatenate([self.embeddings.value, ops.zeros_like(self.embeddings.value[:1])], axis=0),
            targets,
            stored_embeddings,
        )[: self.size]
        new_labels = ops.scatter_update(
            ops.concatenate([self.labels.value, ops.zeros_like(self.labels.value[:1])], axis=0),
            targets,
            ops.cast(labels, "int32"),
        )[: self.size]
        return new_labels, new_embeddings, self.count.value + ops.sum(kept), slots

    def assign(self, labels, embeddings, count):
        self.labels.assign(labels)
        self.embeddings.assign(embeddings)
        self.count.assign(count)

    def stored(self):
        """`(labels [n], embeddings [n, dim])` NumPy arrays of the filled slots in slot order,
        `n = min(count, size)`."""
        filled = int(min(int(ops.convert_to_numpy(self.count.value)), self.size))
        return ops.convert_to_numpy(self.labels.value)[:filled], ops.convert_to_numpy(self.embeddings.value)[:filled]

    def reset(self):
        """Empties the buffer."""
        for variable in self.variables:
            variable.assign(np.zeros(variable.shape))


class MemoryState:
    """What the losses that remember past batches share: a `RingBuffer` of `memory_size` x `embedding_dim`
    rows and the loss's own state variables (`_extra_state()`), created on first use (inside a strategy's
    scope when the loss is compiled there, so that they are mirrored) and tracked as non-trainable variables.
    The class sets `_BUFFER_PREFIX`, its variables' name prefix."""

    _state = None
    _buffer = None

    def _extra_state(self):
        """The loss's state variables after the buffer's three."""
        return ()

    def _variables(self):
        """`(embeddings [M, D], labels [M], count, *extra state)`, created on first use."""
        if self._state is None:
            self._buffer = RingBuffer(self.memory_size, self.embedding_dim, self.dtype, self._BUFFER_PREFIX)
            self._state = (*self._buffer.variables, *self._extra_state())
        return self._state

    @property
    def memory_count(self):
        """How many embeddings were enqueued so far (the next slot is `count % memory_size`)."""
        return self._variables()[2]

    def stored(self):
        """`(labels [n], embeddings [n, D])` of the filled slots in slot order, `n = min(count, memory_size)`."""
        self._variables()
        return self._buffer.stored()

    @property
    def non_trainable_variables(self):
        return list(self._variables()) + super().non_trainable_variables
