"""The sequence-aware learnable assessor of DML-ALA (Zheng et al., CVPR 2020, §3.2).

`A(T, h; phi) = sigmoid(Dense(LSTM_L(...LSTM_1([f_a, f_p, f_n], h))))`: the embeddings of a tuple are
concatenated and fed to a stack of LSTM cells; a Dense(1) + sigmoid head maps the top output to a weight in
(0, 1). With `num_features > 0` each tuple also brings a row of scalar features (`ALAModel` feeds its
geometry: anchor-positive and anchor-negative distances and the tuple loss), projected by extra kernel rows
and added to the first layer's input; `use_embeddings=False` reads those features only.
Two ways to lay the tuples out as a sequence (`state`):

- `"per_tuple"` (default, the paper's eq 8): `w_i = A(T_i, h_{i-1})`, `h_i = H(h_{i-1}, T_i)`: the LSTM reads
  the step's tuples one after another as one sequence, starting from the state left by the previous step;
  the state after the last tuple is carried to the next step. Gradients flow through the whole recurrence
  of the current step (eq 12 differentiates the current episode; earlier steps enter through the carried
  state as a constant).
- `"per_step"` (a cheaper approximation, not the paper's): one training step is one timestep; every tuple
  of a step is assessed in parallel from the same carried state, which then becomes the mean over the
  step's tuples of their new states.

The carried state lives in non-trainable variables (`state_h`, `state_c`, `[layers, units]`), so it is saved
and restored with the model; `reset_state()` zeroes it. An empty step keeps it.

How the recurrence is computed: the input projections of every layer are one batched product (the first
layer's kernel acts on the concatenation `[f_1, ..., f_m]`, applied as `sum_k (F W_k)[i_k]`, each embedding
projected once and gathered per tuple); only `h @ U` is sequential, in XLA-compiled loops with a
hand-written backward pass (`lstm_sequence`). It matches `keras.layers.LSTM` (`tests/models/ala/test_ala.py`).
"""

import keras
import tensorflow as tf

from tfdml.ala_options import STATE_MODES
from tfdml.ops import safe_divide

ACTIVATIONS = ("sigmoid", "centred")


@keras.saving.register_keras_serializable(package="tfdml")
class TupleAssessor(keras.layers.Layer):
    """LSTM assessor: weights in (0, 1) for tuples of embeddings, with a state carried across steps.

    Args:
        tuple_size: embeddings per tuple (3 for triplets, 2 for pairs).
        units: hidden units of each LSTM layer (paper: 64).
        num_layers: stacked LSTM layers (paper: 2).
        state: "per_tuple" (eq 8: one recurrence over the tuples, in order) or "per_step" (module docstring).
        num_features: scalar features per tuple read beside (or instead of) the embeddings (default 0).
        use_embeddings: read the tuple's embeddings (the paper's input; default True).
        activation: "sigmoid" (the paper's weight in (0, 1), default) or "centred" (the Dense head's raw
            outputs minus their mean over the call's tuples: logits without a common shift, for weights
            normalised over the step's tuples by a softmax).

    Call: `weights, (new_h, new_c) = assessor(embeddings [B, D], tuples int [T, tuple_size], features [T, F])`
    (`features` only with `num_features`); the carried state is only read. `advance_state(new_h, new_c)`
    stores the step's new state.

    Example:
        >>> assessor = TupleAssessor(tuple_size=3)
        >>> assessor.build((None, 16))
        >>> w, new_state = assessor(embeddings, triplets)   # w: [T] in (0, 1)
        >>> assessor.advance_state(*new_state)
    """

    def __init__(
        self,
        tuple_size=3,
        units=64,
        num_layers=2,
        state="per_tuple",
        num_features=0,
        use_embeddings=True,
        activation="sigmoid",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}.")
        self.activation = activation
        if int(tuple_size) < 1 or int(units) < 1 or int(num_layers) < 1:
            raise ValueError(
                f"tuple_size, units and num_layers must be positive integers, got {tuple_size}, {units}, {num_layers}."
            )
        if int(num_features) < 0 or (not use_embeddings and int(num_features) == 0):
            raise ValueError(
                f"num_features must be >= 0, and > 0 when use_embeddings is False; got "
                f"num_features={num_features}, use_embeddings={use_embeddings}."
            )
        self.num_features = int(num_features)
        self.use_embeddings = bool(use_embeddings)
        if state not in STATE_MODES:
            raise ValueError(f"state must be one of {STATE_MODES}, got {state!r}.")
        self.tuple_size = int(tuple_size)
        self.units = int(units)
        self.num_layers = int(num_layers)
        self.state = state

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim is None:
            raise ValueError(f"TupleAssessor needs a known embedding dimension, got input shape {input_shape}.")
        units = self.units
        self.lstm_kernels, self.lstm_recurrent_kernels, self.lstm_biases = [], [], []
        for layer in range(self.num_layers):
            in_dim = self.tuple_size * dim * self.use_embeddings + self.num_features if layer == 0 else units
            self.lstm_kernels.append(
                self.add_weight(shape=(in_dim, 4 * units), initializer="glorot_uniform", name=f"lstm_{layer}_kernel")
            )
            self.lstm_recurrent_kernels.append(
                self.add_weight(
                    shape=(units, 4 * units), initializer="orthogonal", name=f"lstm_{layer}_recurrent_kernel"
                )
            )
            self.lstm_biases.append(
                self.add_weight(shape=(4 * units,), initializer=_unit_forget_bias(units), name=f"lstm_{layer}_bias")
            )
        self.output_kernel = self.add_weight(shape=(units, 1), initializer="glorot_uniform", name="output_kernel")
        self.output_bias = self.add_weight(shape=(1,), initializer="zeros", name="output_bias")
        # "mean": under MirroredStrategy every replica computes the same state; the mean keeps it.
        self.state_h = self.add_weight(
            shape=(self.num_layers, units), initializer="zeros", trainable=False, name="state_h", aggregation="mean"
        )
        self.state_c = self.add_weight(
            shape=(self.num_layers, units), initializer="zeros", trainable=False, name="state_c", aggregation="mean"
        )
        self.embedding_dim = int(dim)

    def _input_projection(self, embeddings, tuples, features):
        """Layer-1 pre-activations `concat(f_1..f_m, features) @ W + b` of every tuple, `[T, 4 units]`."""
        dim = self.embedding_dim
        kernel = tf.cast(self.lstm_kernels[0], self.compute_dtype)
        z = tf.cast(self.lstm_biases[0], self.compute_dtype)[None]
        rows = 0
        if self.use_embeddings:
            for k in range(self.tuple_size):  # concat([f_1..f_m]) @ W == sum_k f_k @ W_k
                z = z + tf.gather(tf.matmul(embeddings, kernel[k * dim : (k + 1) * dim]), tuples[:, k])
            rows = self.tuple_size * dim
        else:
            z = tf.tile(z, [tf.shape(tuples)[0], 1])
        if self.num_features:
            z = z + tf.matmul(features, kernel[rows:])
        return z

    def call(self, embeddings, tuples, features=None):
        embeddings = tf.convert_to_tensor(embeddings, self.compute_dtype)
        tuples = tf.convert_to_tensor(tuples, tf.int32)
        if self.num_features:
            if features is None:
                raise ValueError(f"This assessor reads {self.num_features} features per tuple; pass features=.")
            features = tf.convert_to_tensor(features, self.compute_dtype)
        elif features is not None:
            raise ValueError("This assessor was built without features (num_features=0); got features.")
        z = self._input_projection(embeddings, tuples, features)
        new_h, new_c = [], []
        inputs = None  # each layer's outputs, the inputs of the next layer (layer 0 reads the tuples)
        for layer in range(self.num_layers):
            if layer > 0:
                z = tf.matmul(inputs, tf.cast(self.lstm_kernels[layer], self.compute_dtype)) + tf.cast(
                    self.lstm_biases[layer], self.compute_dtype
                )
            recurrent = tf.cast(self.lstm_recurrent_kernels[layer], self.compute_dtype)
            h_prev = tf.cast(self.state_h[layer], self.compute_dtype)
            c_prev = tf.cast(self.state_c[layer], self.compute_dtype)
            if self.state == "per_tuple":
                inputs, cells = lstm_sequence(z, recurrent, h_prev, c_prev)
                # The state after the last tuple (the previous one for an empty step).
                new_h.append(tf.concat([h_prev[None], inputs], axis=0)[-1])
                new_c.append(tf.concat([c_prev[None], cells], axis=0)[-1])
            else:
                inputs, cells = _lstm_cell(z + tf.matmul(h_prev[None, :], recurrent), c_prev)
                keep = tf.equal(tf.shape(z)[0], 0)
                new_h.append(tf.where(keep, h_prev, tf.reduce_mean(inputs, axis=0)))
                new_c.append(tf.where(keep, c_prev, tf.reduce_mean(cells, axis=0)))
        logits = tf.matmul(inputs, tf.cast(self.output_kernel, self.compute_dtype)) + tf.cast(
            self.output_bias, self.compute_dtype
        )
        logits = logits[:, 0]
        if self.activation == "sigmoid":
            outputs = tf.sigmoid(logits)
        else:  # no common shift exists, so none can drift (an empty call gives an empty output)
            outputs = logits - safe_divide(tf.reduce_sum(logits), tf.cast(tf.size(logits), logits.dtype))
        return outputs, (tf.stack(new_h), tf.stack(new_c))

    def advance_state(self, new_h, new_c):
        """Stores the carried state after a training step (values from `call`, gradients stopped)."""
        self.state_h.assign(tf.cast(tf.stop_gradient(new_h), self.state_h.dtype))
        self.state_c.assign(tf.cast(tf.stop_gradient(new_c), self.state_c.dtype))

    def reset_state(self):
        """Forgets everything carried from earlier steps (state back to zeros)."""
        self.state_h.assign(tf.zeros_like(self.state_h))
        self.state_c.assign(tf.zeros_like(self.state_c))

    def compute_output_spec(self, embeddings, tuples, features=None):
        state = keras.KerasTensor((self.num_layers, self.units), dtype=self.compute_dtype)
        return keras.KerasTensor((tuples.shape[0],), dtype=self.compute_dtype), (state, state)

    def get_config(self):
        config = super().get_config()
        config.update(
            tuple_size=self.tuple_size,
            units=self.units,
            num_layers=self.num_layers,
            state=self.state,
            num_features=self.num_features,
            use_embeddings=self.use_embeddings,
            activation=self.activation,
        )
        return config


def _lstm_cell(z, c_prev):
    """One LSTM update from the full pre-activations `z` (Keras' gate order i, f, c, o)."""
    gate_i, gate_f, candidate, gate_o = tf.split(z, 4, axis=-1)
    c = tf.sigmoid(gate_f) * c_prev + tf.sigmoid(gate_i) * tf.tanh(candidate)
    return tf.sigmoid(gate_o) * tf.tanh(c), c


def lstm_sequence(inputs_projected, recurrent_kernel, h0, c0):
    """The LSTM recurrence over a sequence whose input projections are given.

    `h_t, c_t = cell(z_t + h_{t-1} @ U, c_{t-1})` for `t = 1..T` from `(h0, c0)` (`[units]` each), with
    `z = inputs_projected` (`[T, 4 units]`, input product and bias included; Keras gate order i, f, c, o).
    Returns `(h [T, units], c [T, units])`, differentiable in every argument.

    Both passes are XLA-compiled loops (a few microseconds per tuple on CPU; a `tf.scan` of TensorFlow ops
    costs ~100x that, `BlockLSTM` ~4x, its gradient accumulating the weight gradient inside the loop). The
    backward pass is written by hand: the loop only carries `dh`, `dc` back through time and stores the
    gate gradients `dG` (`[T, 4 units]`); the weight gradient is one product afterwards,
    `dU = [h0; h_1..h_{T-1}]^T dG`, and `dz = dG`.
    """
    z = tf.convert_to_tensor(inputs_projected)
    dtype = z.dtype
    return _lstm_sequence(z, tf.cast(recurrent_kernel, dtype), tf.cast(h0, dtype), tf.cast(c0, dtype))


@tf.custom_gradient
def _lstm_sequence(z, recurrent_kernel, h0, c0):
    # The compiled loops are never differentiated by TensorFlow (grad below replaces that).
    hidden, cells, gates = _lstm_forward(*[tf.stop_gradient(t) for t in (z, recurrent_kernel, h0, c0)])

    def grad(d_hidden, d_cells):
        d_hidden = tf.zeros_like(hidden) if d_hidden is None else d_hidden
        d_cells = tf.zeros_like(cells) if d_cells is None else d_cells
        return _lstm_backward(
            *[tf.stop_gradient(t) for t in (recurrent_kernel, h0, c0, hidden, cells, gates, d_hidden, d_cells)]
        )

    return (hidden, cells), grad


@tf.function(jit_compile=True, autograph=False)
def _lstm_forward(z, recurrent_kernel, h0, c0):
    """`(h, c, activated gates [i, f, g, o])` over the sequence, each `[T, ...]`."""
    count = tf.shape(z)[0]
    units = recurrent_kernel.shape[0]
    z = _pad_row(z)  # XLA cannot even compile a slice of an empty sequence

    def body(t, h, c, hs, cs, gs):
        gate_i, gate_f, candidate, gate_o = tf.split(z[t] + tf.linalg.matvec(recurrent_kernel, h, transpose_a=True), 4)
        gate_i, gate_f, gate_o = tf.sigmoid(gate_i), tf.sigmoid(gate_f), tf.sigmoid(gate_o)
        candidate = tf.tanh(candidate)
        c = gate_f * c + gate_i * candidate
        h = gate_o * tf.tanh(c)
        return (
            t + 1,
            h,
            c,
            hs.write(t, h),
            cs.write(t, c),
            gs.write(t, tf.concat([gate_i, gate_f, candidate, gate_o], 0)),
        )

    def array(width):
        return tf.TensorArray(z.dtype, size=count, element_shape=[width])

    _, _, _, hs, cs, gs = tf.while_loop(
        lambda t, *_: t < count, body, (0, h0, c0, array(units), array(units), array(4 * units))
    )
    return hs.stack(), cs.stack(), gs.stack()


@tf.function(jit_compile=True, autograph=False)
def _lstm_backward(recurrent_kernel, h0, c0, hidden, cells, gates, d_hidden, d_cells):
    """`(dz, dU, dh0, dc0)` of the recurrence, given the upstream gradients of every `h_t` and `c_t`."""
    count = tf.shape(hidden)[0]
    units = recurrent_kernel.shape[0]
    previous_c = tf.concat([c0[None], cells], 0)
    gates, cells, d_hidden, d_cells = [_pad_row(t) for t in (gates, cells, d_hidden, d_cells)]

    def body(t, dh_next, dc_next, dgs):
        gate_i, gate_f, candidate, gate_o = tf.split(gates[t], 4)
        dh = d_hidden[t] + dh_next
        tanh_c = tf.tanh(cells[t])
        dc = d_cells[t] + dc_next + dh * gate_o * (1 - tanh_c * tanh_c)
        d_gate = tf.concat(
            [
                dc * candidate * gate_i * (1 - gate_i),
                dc * previous_c[t] * gate_f * (1 - gate_f),
                dc * gate_i * (1 - candidate * candidate),
                dh * tanh_c * gate_o * (1 - gate_o),
            ],
            0,
        )
        return t - 1, tf.linalg.matvec(recurrent_kernel, d_gate), dc * gate_f, dgs.write(t, d_gate)

    _, dh0, dc0, dgs = tf.while_loop(
        lambda t, *_: t >= 0,
        body,
        (
            count - 1,
            tf.zeros_like(h0),
            tf.zeros_like(c0),
            tf.TensorArray(hidden.dtype, size=count, element_shape=[4 * units]),
        ),
    )
    d_gates = dgs.stack()
    previous_h = tf.concat([h0[None], hidden], 0)[:count]
    return d_gates, tf.matmul(previous_h, d_gates, transpose_a=True), dh0, dc0


def _pad_row(tensor):
    return tf.concat([tensor, tf.zeros([1] + tensor.shape[1:], tensor.dtype)], 0)


def _unit_forget_bias(units):
    """Forget-gate bias 1, others 0 (Keras' `unit_forget_bias=True`)."""

    def initializer(shape, dtype=None):
        return keras.ops.concatenate(
            [
                keras.ops.zeros((units,), dtype=dtype),
                keras.ops.ones((units,), dtype=dtype),
                keras.ops.zeros((2 * units,), dtype=dtype),
            ]
        )

    return initializer
