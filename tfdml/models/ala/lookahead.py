"""The virtual step of eq (10) as `theta' = theta - o - P (.) g`: a per-coordinate preconditioner `P` and an
offset `o` that do not depend on the assessor (the package docstring gives the formulas).

`lookahead="sgd"` (the paper's): `P` = the learning rate that trains each variable in the real step (13)
(`inner_learning_rate` replaces them by one rate), `o` = 0. `lookahead="optimizer"`: the compiled
optimizer's own update linearised in the new gradient, its state held constant (SGD with momentum /
Nesterov, Adam / AdamW with their moments, weight decay); other optimizers are modelled as SGD at their rate.

Which variables the virtual step moves (`lookahead_variables`): "all" (the paper's), or "head", the embedder's
head only (`moved_positions`), the body held at theta: every product of the look-ahead then takes the head's
variables as its sources and backpropagates through the head alone.
"""

import keras
import tensorflow as tf


def variable_optimizers(optimizer, variables):
    """The plain optimizer that updates each variable (through loss-scale wrappers and multi-optimizers)."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    if isinstance(optimizer, keras.optimizers.MultiOptimizer):
        return [optimizer._optimizer_map(v) for v in variables]
    return [optimizer] * len(variables)


def moved_positions(embedder, lookahead_variables):
    """Positions, in `embedder.trainable_variables`, of the variables the virtual step moves: all of them, or
    for "head" a tfdml embedder's `head_variables` (its new layers), else the trainable variables of the
    embedder's last layer that has any; `ValueError` when no head can be found."""
    variables = list(embedder.trainable_variables)
    if lookahead_variables == "all":
        return list(range(len(variables)))
    head = list(getattr(embedder, "head_variables", None) or [])
    if not head:
        layers = [layer for layer in getattr(embedder, "layers", []) if layer.trainable_variables]
        head = list(layers[-1].trainable_variables) if layers else []
    position = {id(v): i for i, v in enumerate(variables)}
    positions = sorted(position[id(v)] for v in head if id(v) in position)
    if not positions:
        raise ValueError(
            f"lookahead_variables=\"head\" needs the embedder's head: a tfdml embedder's head_variables or a "
            f"last layer with trainable variables; {type(embedder).__name__} has neither."
        )
    return positions


def unmodelled_optimizers(optimizer, variables):
    """Names of the optimizers among `variables`' that `lookahead="optimizer"` models as plain SGD."""
    return sorted(
        {
            type(o).__name__
            for o in variable_optimizers(optimizer, variables)
            if not isinstance(o, (keras.optimizers.SGD, keras.optimizers.Adam))
        }
    )


def inner_rates(optimizer, variables, inner_learning_rate=None):
    """Per variable, `a` of an SGD look-ahead: `inner_learning_rate`, else the current learning rate of the
    optimizer (or, for a multi-optimizer, of the inner optimizer) that trains it."""
    if inner_learning_rate is not None:
        return [tf.constant(inner_learning_rate)] * len(variables)
    if optimizer is None:
        raise ValueError(
            "inner_learning_rate is None and the model is not compiled: compile it or set inner_learning_rate."
        )
    return [tf.convert_to_tensor(o.learning_rate) for o in variable_optimizers(optimizer, variables)]


def lookahead_terms(lookahead, optimizer, variables, theta, uniform_gradients, inner_learning_rate=None):
    """`(P, o)` per variable (`o` None for no offset). `theta`: the variables' values; `uniform_gradients()`:
    the episode's gradient with every weight 1 (called only for Adam-type optimizers)."""
    if lookahead == "sgd":
        rates = inner_rates(optimizer, variables, inner_learning_rate)
        return [tf.cast(r, t.dtype) for r, t in zip(rates, theta)], [None] * len(theta)
    reference = None
    preconditioners, offsets = [], []
    for index, (variable, value, inner) in enumerate(zip(variables, theta, variable_optimizers(optimizer, variables))):
        dtype = value.dtype
        lr = tf.cast(tf.convert_to_tensor(inner.learning_rate), dtype)
        offset = None
        if isinstance(inner, keras.optimizers.Adam):
            if reference is None:
                reference = uniform_gradients()
            # Constants rounded as Keras' update_step rounds them (it casts the betas' powers and adds the
            # Python floats 1 - beta and epsilon): the virtual step is the real one to the last bit.
            slot = inner._get_variable_index(variable)
            t = tf.cast(inner.iterations + 1, dtype)
            bias_2 = 1 - tf.pow(tf.cast(inner.beta_2, dtype), t)
            alpha = lr * tf.sqrt(bias_2) / (1 - tf.pow(tf.cast(inner.beta_1, dtype), t))
            new_m = tf.constant(1 - inner.beta_1, dtype)  # m_t = m + (g - m) (1 - beta_1)
            m = tf.cast(inner._momentums[slot], dtype)
            v = tf.cast(inner._velocities[slot], dtype)
            v = v + (tf.square(reference[index]) - v) * tf.constant(1 - inner.beta_2, dtype)
            if inner.amsgrad:
                v = tf.maximum(tf.cast(inner._velocity_hats[slot], dtype), v)
            denominator = tf.sqrt(v) + tf.constant(inner.epsilon, dtype)
            preconditioner = alpha * new_m / denominator
            offset = alpha * (m - m * new_m) / denominator
        elif isinstance(inner, keras.optimizers.SGD) and inner.momentum:
            momentum = tf.cast(inner.momentum, dtype)
            velocity = tf.cast(inner.momentums[inner._get_variable_index(variable)], dtype)
            if inner.nesterov:
                preconditioner, offset = lr * (1 + momentum), -momentum * momentum * velocity
            else:
                preconditioner, offset = lr, -momentum * velocity
        else:
            preconditioner = lr
        if inner.weight_decay and inner._use_weight_decay(variable):
            decay = lr * tf.cast(inner.weight_decay, dtype) * value
            offset = decay if offset is None else offset + decay
        preconditioners.append(preconditioner)
        offsets.append(offset)
    return preconditioners, offsets
