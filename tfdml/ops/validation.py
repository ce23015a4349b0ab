"""Input checks shared by every loss: clear errors instead of silent NaNs or broadcasting surprises.

In `keras.ops`, for every backend. The NaN/Inf check of the embeddings is TensorFlow's `check_numerics` on
the TensorFlow backend (it runs inside graphs too); on the other backends it runs on concrete values and is
skipped while a function is traced (`jax.jit`), where a value cannot be inspected.
"""

import keras
from keras import backend, ops

_LOW_PRECISION = ("float16", "bfloat16")
_NOT_FINITE = "contain NaN or Inf values (check the model output and learning rate)"


def compute_dtype_for(dtype):
    """Losses compute in float32 for float16/bfloat16 inputs (mixed precision), else in the input dtype."""
    dtype = backend.standardize_dtype(dtype)
    return "float32" if dtype in _LOW_PRECISION else dtype


def validate_labels(labels, name="labels"):
    """Integer class ids `[B]` (a trailing axis of size 1 is squeezed) -> int32 `[B]`.

    Raises `TypeError` for non-integer labels and `ValueError` for a wrong rank.
    """
    labels = ops.convert_to_tensor(labels)
    if not backend.is_int_dtype(labels.dtype):
        raise TypeError(
            f"{name} must be integer class ids, got dtype {backend.standardize_dtype(labels.dtype)}. Cast them "
            f'with keras.ops.cast(labels, "int32") if they hold whole numbers.'
        )
    shape = tuple(labels.shape)
    if len(shape) == 2 and shape[-1] == 1:
        labels = ops.squeeze(labels, axis=-1)
    elif len(shape) != 1:
        raise ValueError(f"{name} must have shape [batch] (or [batch, 1]), got shape {shape}.")
    return ops.cast(labels, "int32")


def _is_traced(tensor):
    if backend.backend() != "jax":
        return False
    import jax

    return isinstance(tensor, jax.core.Tracer)


def check_finite(tensor, message):
    """`tensor`, after checking that it holds no NaN or Inf (an error with `message` if it does)."""
    if backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.debugging.check_numerics(tensor, message)
    if not _is_traced(tensor) and not bool(ops.all(ops.isfinite(tensor))):
        raise ValueError(message)
    return tensor


def validate_embeddings(embeddings, name="embeddings", dtype=None):
    """Float `[B, D]` embeddings, cast to the compute dtype; NaN/Inf raise an error (TensorFlow's
    `InvalidArgumentError` on the TensorFlow backend, `ValueError` on the others)."""
    embeddings = ops.convert_to_tensor(embeddings)
    if not backend.is_float_dtype(embeddings.dtype):
        embeddings = ops.cast(embeddings, dtype or "float32")
    if len(embeddings.shape) != 2:
        raise ValueError(f"{name} must have shape [batch, dim], got shape {tuple(embeddings.shape)}.")
    embeddings = ops.cast(embeddings, dtype or compute_dtype_for(embeddings.dtype))
    return check_finite(embeddings, f"{name} {_NOT_FINITE}")


def validate_inputs(labels, embeddings, dtype=None):
    """Validates a `(labels [B], embeddings [B, D])` pair and checks that the batch sizes agree."""
    labels = validate_labels(labels)
    embeddings = validate_embeddings(embeddings, dtype=dtype)
    lb, eb = labels.shape[0], embeddings.shape[0]
    if lb is not None and eb is not None:
        if lb != eb:
            raise ValueError(f"labels has {lb} entries but embeddings has {eb} rows; they must match.")
    elif keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.debugging.assert_equal(
            tf.shape(labels)[0], tf.shape(embeddings)[0], message="labels and embeddings must have the same batch size"
        )
    return labels, embeddings
