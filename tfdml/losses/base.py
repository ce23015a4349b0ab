"""Base class of every tfdml loss.

A tfdml loss is a thin `keras.losses.Loss` over a pure function `fn(labels, embeddings, **config)`:
the class carries the configuration (`get_config` round-trips) and validates inputs; the function does
the maths. Unlike stock Keras losses, labels are *not* cast to the embedding dtype (class ids must stay
integers), and the value is a batch-level scalar: these losses compare every sample with every other one,
so per-sample `sample_weight` has no meaning and is rejected.

Under `tf.distribute` (MirroredStrategy, MultiWorkerMirroredStrategy) every loss sees the *global* batch by
default: `__call__` gathers labels and `y_pred` (whatever its width) from all replicas and scales the value
by `1 / num_replicas`, so training on N replicas matches one device on the same global batch (see
`tfdml.distribute`). `cross_replica=False` keeps per-replica losses instead. That gathering is TensorFlow's
(`tf.distribute`): on the JAX and PyTorch backends the losses compute on the batch they are given, and
TensorFlow is never imported.

Losses that own variables (for example a learnable margin `beta`) list them in `trainable_variables`
and may name the optimizer that must train them in `variable_optimizer`; state that is not trained (the
queue of `CrossBatchMemory`) goes in `non_trainable_variables`. `tfdml.models.MetricModel` tracks, trains
and checkpoints both.

Tuple losses (triplet, margin, contrastive) also list their unreduced terms, `terms(labels, embeddings)`, a
`tfdml.ops.TupleTerms` reduced by the shared `tfdml.ops.reduce_terms` (optionally with one weight per term).

Losses whose pairs may have their far end in a separate reference set (`tfdml.ops.References`, for
`CrossBatchMemory`) set `supports_references = True` and take `compute(labels, embeddings, references=None)`.
"""

import keras

from tfdml.ops import validate_inputs


def _on_tensorflow():
    return keras.backend.backend() == "tensorflow"


class MetricLoss(keras.losses.Loss):
    """Keras loss over `(labels [B] int, embeddings [B, D])` with a batch-level scalar value.

    Subclasses implement `compute(labels, embeddings)` on validated inputs (int32 labels, float
    embeddings in the compute dtype: float32 for mixed-precision inputs).

    Args:
        name: loss name.
        reduction, dtype: as in `keras.losses.Loss`.
        cross_replica: under a distribution strategy, True (default) computes the loss on the global batch
            gathered from all replicas; False computes it on each replica's share only (the value then
            depends on the number of replicas). Ignored outside `strategy.run`.
    """

    # True for losses whose compute() takes `references` (a `tfdml.ops.References`): the pairs' far end.
    supports_references = False
    # "triplet" or "pair" for losses whose `terms` list their tuples (the `kind` of those terms), else None.
    tuple_kind = None

    def __init__(self, name=None, reduction="sum_over_batch_size", dtype=None, cross_replica=True):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.cross_replica = bool(cross_replica)

    # Keras' Loss.__call__ casts y_true to the float dtype; class ids must stay integers.
    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(
                f"{type(self).__name__} is a batch-level metric-learning loss and does not accept "
                f"sample_weight (got one). Weight classes through the sampler instead."
            )
        with keras.name_scope(self.name or type(self).__name__):
            dtype = None if self.dtype in (None, "float32") else self.dtype
            if not _on_tensorflow():
                return self.compute(*validate_inputs(y_true, y_pred, dtype=dtype))
            from tfdml import distribute  # tf.distribute: TensorFlow only

            labels, embeddings = validate_inputs(distribute.labels_for_symbolic_build(y_true), y_pred, dtype=dtype)
            if self.cross_replica:
                labels, embeddings = distribute.gather_replicas(labels, embeddings)
            # Keras sums replica gradients: 1/N makes the sum the single-device gradient.
            return distribute.scale_for_replicas(self.compute(labels, embeddings))

    def call(self, y_true, y_pred):
        labels, embeddings = validate_inputs(y_true, y_pred)
        return self.compute(labels, embeddings)

    def compute(self, labels, embeddings):
        raise TypeError(f"{type(self).__name__} does not define compute(labels, embeddings)")

    def terms(self, labels, embeddings):
        """The loss's unreduced per-tuple terms on validated inputs, a `tfdml.ops.TupleTerms` whose
        `tfdml.ops.reduce_terms` is `compute`'s value (tuple losses: triplet, margin, contrastive)."""
        raise TypeError(
            f"{type(self).__name__} does not list per-tuple terms; the losses that do are TripletLoss, "
            "MarginLoss and ContrastiveLoss."
        )

    # Losses with variables override these (see module docstring).
    @property
    def trainable_variables(self):
        return []

    @property
    def variable_optimizer(self):
        return None

    @property
    def non_trainable_variables(self):
        return []

    def get_config(self):
        return {"name": self.name, "cross_replica": self.cross_replica}


class _WrappedLoss(MetricLoss):
    """A `MetricLoss` around another (`CrossBatchMemory`, `SmallLossWeighting`, `PRISM`): `loss` is the
    wrapped `MetricLoss` (or its serialized config), whose variables are this loss's (tracked by
    `MetricModel`) and whose config is saved in this one's. Subclasses add their own non-trainable state."""

    def __init__(self, loss, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        if isinstance(loss, dict):
            loss = keras.saving.deserialize_keras_object(loss)
        if not isinstance(loss, MetricLoss):
            raise TypeError(f"{type(self).__name__} wraps a tfdml MetricLoss, got {type(loss).__name__}.")
        self.loss = loss

    @property
    def trainable_variables(self):
        return self.loss.trainable_variables

    @property
    def variable_optimizer(self):
        return self.loss.variable_optimizer

    @property
    def non_trainable_variables(self):
        return list(self.loss.non_trainable_variables)

    def get_config(self):
        return {**super().get_config(), "loss": keras.saving.serialize_keras_object(self.loss)}


def _state_variable(value, dtype, name):
    """A non-trainable variable of a loss's state (a memory queue, its counters). `only_first_replica`: every
    replica computes the same update from the same global batch, so the state is the same on every replica."""
    return keras.Variable(
        value, dtype=dtype, trainable=False, autocast=False, aggregation="only_first_replica", name=name
    )
