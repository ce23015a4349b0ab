"""Hyper-parameters as scalars of a computation's dtype."""

from keras import ops


def as_scalar(value, dtype):
    """`value` (Python number, tensor or variable) as a scalar tensor of `dtype`.

    Python numbers are converted directly to `dtype`: casting a float32 constant 0.2 to float64 would first
    round 0.2 to float32 and lose precision in float64 computations.
    """
    if isinstance(value, (int, float)):
        return ops.convert_to_tensor(value, dtype)
    return ops.cast(value, dtype)
