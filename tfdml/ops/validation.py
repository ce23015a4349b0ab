"""Input checks shared by every loss: clear errors instead of silent NaNs or broadcasting surprises."""

import tensorflow as tf

_LOW_PRECISION = (tf.float16, tf.bfloat16)


def compute_dtype_for(dtype):
    """Losses compute in float32 for float16/bfloat16 inputs (mixed precision), else in the input dtype."""
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype in _LOW_PRECISION else dtype


def validate_labels(labels, name="labels"):
    """Integer class ids `[B]` (a trailing axis of size 1 is squeezed) -> int32 `[B]`.

    Raises `TypeError` for non-integer labels and `ValueError` for a wrong rank.
    """
    labels = tf.convert_to_tensor(labels)
    if not (labels.dtype.is_integer):
        raise TypeError(
            f"{name} must be integer class ids, got dtype {labels.dtype.name}. Cast them with "
            f"tf.cast(labels, tf.int32) if they hold whole numbers."
        )
    rank = labels.shape.rank
    if rank == 2 and labels.shape[-1] == 1:
        labels = tf.squeeze(labels, axis=-1)
    elif rank != 1:
        raise ValueError(f"{name} must have shape [batch] (or [batch, 1]), got shape {labels.shape}.")
    return tf.cast(labels, tf.int32)


def validate_embeddings(embeddings, name="embeddings", dtype=None):
    """Float `[B, D]` embeddings, cast to the compute dtype; NaN/Inf raise `InvalidArgumentError`."""
    embeddings = tf.convert_to_tensor(embeddings)
    if not embeddings.dtype.is_floating:
        embeddings = tf.cast(embeddings, dtype or tf.float32)
    if embeddings.shape.rank != 2:
        raise ValueError(f"{name} must have shape [batch, dim], got shape {embeddings.shape}.")
    embeddings = tf.cast(embeddings, dtype or compute_dtype_for(embeddings.dtype))
    return tf.debugging.check_numerics(
        embeddings, f"{name} contain NaN or Inf values (check the model output and learning rate)"
    )


def validate_inputs(labels, embeddings, dtype=None):
    """Validates a `(labels [B], embeddings [B, D])` pair and checks that the batch sizes agree."""
    labels = validate_labels(labels)
    embeddings = validate_embeddings(embeddings, dtype=dtype)
    lb, eb = labels.shape[0], embeddings.shape[0]
    if lb is not None and eb is not None:
        if lb != eb:
            raise ValueError(f"labels has {lb} entries but embeddings has {eb} rows; they must match.")
    else:
        tf.debugging.assert_equal(
            tf.shape(labels)[0], tf.shape(embeddings)[0], message="labels and embeddings must have the same batch size"
        )
    return labels, embeddings
