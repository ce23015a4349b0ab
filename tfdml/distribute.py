"""Cross-replica helpers that let batch-level losses see the global batch under `tf.distribute`.

Ranking losses compare every sample with every other one in the batch. Under `MirroredStrategy` or
`MultiWorkerMirroredStrategy` each replica only holds its share of the global batch, so a loss computed
on that share alone learns something else than the same loss on one device. `tfdml.losses.MetricLoss`
therefore gathers labels and embeddings from all replicas (`gather_replicas`) before computing, and
scales the value with `scale_for_replicas`, so that the gradient summed over replicas by the optimizer
equals the single-device gradient on the same global batch:

- every replica computes the same global loss `L` on the gathered batch and returns `L / N` (Keras' own
  losses are scaled by `1 / N` the same way; `MetricLoss` overrides `Loss.__call__`, so it does it here);
- the backward pass of `all_gather` sums the upstream gradients of all replicas and hands each replica
  the rows of its own samples: `N * (1/N) * dL/df_local = dL/df_local`, so the optimizer's sum of the
  replicas' parameter gradients is `dL/dtheta`;
- a variable the loss reads directly (the margin loss' mirrored `beta`) gets `(1/N) dL/dbeta` on each
  replica, `dL/dbeta` once summed.

Outside a replica context, or with a single replica, every helper is the identity. Example:

    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = tfdml.models.Embedder("resnet50", embedding_dim=512)
        model.compile(optimizer="adam", loss=tfdml.losses.RankedListLoss())   # cross_replica=True
    model.fit(tfdml.data.class_balanced_dataset(source, 60, 3, image_size=224), epochs=10, steps_per_epoch=100)
    # several machines (MultiWorkerMirroredStrategy): tfdml.training.fit_distributed
"""

import keras
import tensorflow as tf

__all__ = [
    "num_replicas",
    "is_cross_replica_step",
    "gather_replicas",
    "scale_for_replicas",
    "labels_for_symbolic_build",
    "mirrored_strategy",
    "synchronize_batch_normalization",
]


def _replica_context():
    """The current replica context, or None in a cross-replica context (inside `strategy.scope()`)."""
    return tf.distribute.get_replica_context()


def num_replicas():
    """Number of replicas taking part in the current step (1 outside `strategy.run`)."""
    context = _replica_context()
    return 1 if context is None else context.num_replicas_in_sync


def is_cross_replica_step():
    """True inside `strategy.run` with more than one replica: the batch is split across replicas."""
    return num_replicas() > 1


def gather_replicas(*tensors):
    """Concatenates each tensor over all replicas along axis 0, in replica order.

    Replica `r` holds rows `[r * b, (r + 1) * b)` of the global batch (how `experimental_distribute_dataset`
    and `tfdml.training.fit_distributed` split it), so the result is the global batch in its original order.
    Per-replica shares may differ in size (a short last batch). Integer tensors (labels) are gathered
    without a gradient; float tensors get the all-reduce backward pass described in the module docstring.
    Returns the tensors unchanged outside a multi-replica step.

    Args:
        *tensors: tensors of shape `[b_r, ...]` with the same trailing shape on every replica.

    Returns:
        A tuple of tensors of shape `[sum_r b_r, ...]` (a single tensor if one was given).
    """
    if not is_cross_replica_step():
        return tensors[0] if len(tensors) == 1 else tensors
    context = _replica_context()
    # `tf.identity`: all_gather rejects tensors that come straight from a distributed iterator.
    gathered = tuple(context.all_gather(tf.identity(tensor), axis=0) for tensor in tensors)
    return gathered[0] if len(gathered) == 1 else gathered


def scale_for_replicas(loss):
    """Divides a loss by the number of replicas in sync (identity outside a multi-replica step).

    Keras sums the gradients of all replicas; a loss computed on the gathered global batch is the same on
    every replica, so `1 / N` makes that sum the single-device gradient. A per-replica loss scaled by
    `1 / N` trains on the mean of the replica losses (Keras' own convention for its losses).
    """
    replicas = num_replicas()
    if replicas == 1:
        return loss
    loss = tf.convert_to_tensor(loss)
    return loss * tf.cast(1.0 / replicas, loss.dtype)


def unscale_for_replicas(loss):
    """Undoes `scale_for_replicas`: the global value of a loss scaled by `1 / N` (for logging)."""
    replicas = num_replicas()
    if replicas == 1:
        return loss
    loss = tf.convert_to_tensor(loss)
    return loss * tf.cast(replicas, loss.dtype)


def labels_for_symbolic_build(labels):
    """Casts labels back to int32 while Keras builds a model under a strategy on averaged labels.

    Keras 3.15 `fit` builds a distributed model on the replica *mean* of its first batch
    (`_maybe_symbolic_build` in `keras/src/backend/tensorflow/trainer.py`), which turns integer class ids
    into floats. That build (graph mode, cross-replica context) only infers shapes and dtypes, so the cast
    is harmless there; float labels anywhere else are returned unchanged (and rejected by validation).
    """
    labels = tf.convert_to_tensor(labels)
    if (
        labels.dtype.is_floating
        and not tf.executing_eagerly()
        and tf.distribute.has_strategy()
        and tf.distribute.in_cross_replica_context()
    ):
        return tf.cast(labels, tf.int32)
    return labels


def mirrored_strategy(devices=None, **kwargs):
    """`tf.distribute.MirroredStrategy(devices, **kwargs)` whose collective keys cannot collide with earlier ones.

    Every MirroredStrategy of a process numbers its collective groups from the same key, so a second
    strategy over a different number of devices (a 4-replica test after a 2-replica one, a notebook that
    switches strategies) fails with "is joining a group with size 4, but that group has size 2". TF's own
    tests move the key base of each new strategy (`strategy_combinations.py`); so does this helper.
    One strategy per process, the usual case, does not need it.

    Example:
        >>> strategy = tfdml.distribute.mirrored_strategy(["/cpu:0", "/cpu:1"])
    """
    # Before: away from earlier strategies; after: later plain MirroredStrategy()s stay away from this one.
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    strategy = tf.distribute.MirroredStrategy(devices, **kwargs)
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    return strategy


def synchronize_batch_normalization(model):
    """Makes every `BatchNormalization` layer of `model` use global-batch statistics under a strategy.

    In training mode a BatchNormalization layer normalises with the mean and variance of the batch it sees;
    under a strategy that is each replica's share, so N replicas train a (slightly) different model than one
    device. `synchronized=True` all-reduces the moments across replicas (Keras' TF backend), which restores
    single-device equivalence at the cost of one all-reduce per layer and step. Frozen (non-trainable)
    BatchNormalization layers use their moving statistics and are unaffected. Call before the first
    `fit`/`fit_distributed` step; the setting is saved with the model config.

    Returns:
        The number of layers changed.

    Example:
        >>> with strategy.scope():
        ...     model = tfdml.models.MultiLevelEmbedder("resnet50", weights=None)
        ...     tfdml.distribute.synchronize_batch_normalization(model)
    """
    changed = 0
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized:
            layer.synchronized = True
            changed += 1
    return changed
