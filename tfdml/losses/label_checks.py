"""Run-time checks of class ids that index a per-class table (proxies, classifier weights, logits columns).

An id outside `[0, num_classes)` would silently pick no row (a one-hot row of zeros) or a wrong one. On the
TensorFlow backend the check is an assertion op of the graph, so it also guards a traced `tf.function`; on
the other backends concrete (eager) labels are checked in NumPy, and labels traced by `jax.jit` or
`torch.compile` cannot raise and are not checked.
"""

import keras


def check_label_range(labels, num_classes, upper_message, lower_message):
    """`labels`, after checking that every id lies in `[0, num_classes)`; the messages name each failure.

    Raises `tf.errors.InvalidArgumentError` on TensorFlow (at run time in a graph), `ValueError` elsewhere.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf  # the assertion op of the TensorFlow backend only

        checks = [
            tf.debugging.assert_non_negative(labels, message=lower_message),
            tf.debugging.assert_less(labels, tf.cast(num_classes, labels.dtype), message=upper_message),
        ]
        with tf.control_dependencies(checks):
            return tf.identity(labels)
    values = _concrete(labels)
    if values is not None and values.size:
        if values.min() < 0:
            raise ValueError(f"{lower_message} (got {values.min()}).")
        if values.max() >= num_classes:
            raise ValueError(f"{upper_message} (got {values.max()}).")
    return labels


def _concrete(tensor):
    """The NumPy value of an eager tensor, None for one traced by `jax.jit` or `torch.compile`."""
    try:
        return keras.ops.convert_to_numpy(tensor)
    except Exception:  # a tracer has no value: the backend raises its own conversion error type
        return None
