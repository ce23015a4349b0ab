"""The sequence-aware learnable assessor of DML-ALA (Zheng et al., CVPR 2020, §3.2).

`A(T, h; phi) = sigmoid(Dense(LSTM_L(...LSTM_1([f_a, f_p, f_n], h))))`: the embeddings of a tuple are
concatenated and fed to a stack of LSTM cells; a Dense(1) + sigmoid head maps the top output to a weight in
(0, 1). Two ways to lay the tuples out as a sequence (`state`):

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
projected once and gathered per tuple); only `h @ U` is sequential. In float32/float16 the sequential part
is TensorFlow's fused `BlockLSTM` kernel (one C++ loop over the tuples, with its registered gradient), fed
the precomputed pre-activations through an identity input kernel; other dtypes (float64, used by the
finite-difference tests) run the same recurrence as a `tf.scan`. Both match `keras.layers.LSTM`
(`tests/test_ala.py`).
"""

import keras
import tensorflow as tf

STATE_MODES = ("per_tuple", "per_step")


@keras.saving.register_keras_serializable(package="tfdml")
class TupleAssessor(keras.layers.Layer):
    """LSTM assessor: weights in (0, 1) for tuples of embeddings, with a state carried across steps.

    Args:
        tuple_size: embeddings per tuple (3 for triplets, 2 for pairs).
        units: hidden units of each LSTM layer (paper: 64).
        num_layers: stacked LSTM layers (paper: 2).
        state: "per_tuple" (eq 8: one recurrence over the tuples, in order) or "per_step" (module docstring).

    Call: `weights, (new_h, new_c) = assessor(embeddings [B, D], tuples int [T, tuple_size])`; the carried
    state is only read. `advance_state(new_h, new_c)` stores the step's new state.

    Example:
        >>> assessor = TupleAssessor(tuple_size=3)
        >>> assessor.build((None, 16))
        >>> w, new_state = assessor(embeddings, triplets)   # w: [T] in (0, 1)
        >>> assessor.advance_state(*new_state)
    """

    def __init__(self, tuple_size=3, units=64, num_layers=2, state="per_tuple", **kwargs):
        super().__init__(**kwargs)
        if int(tuple_size) < 1 or int(units) < 1 or int(num_layers) < 1:
            raise ValueError(f"tuple_size, units and num_layers must be positive integers, got "
                             f"{tuple_size}, {units}, {num_layers}.")
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
            in_dim = self.tuple_size * dim if layer == 0 else units
            self.lstm_kernels.append(self.add_weight(
                shape=(in_dim, 4 * units), initializer="glorot_uniform", name=f"lstm_{layer}_kernel"))
            self.lstm_recurrent_kernels.append(self.add_weight(
                shape=(units, 4 * units), initializer="orthogonal", name=f"lstm_{layer}_recurrent_kernel"))
            self.lstm_biases.append(self.add_weight(
                shape=(4 * units,), initializer=_unit_forget_bias(units), name=f"lstm_{layer}_bias"))
        self.output_kernel = self.add_weight(shape=(units, 1), initializer="glorot_uniform",
                                             name="output_kernel")
        self.output_bias = self.add_weight(shape=(1,), initializer="zeros", name="output_bias")
        # "mean": under MirroredStrategy every replica computes the same state; the mean keeps it.
        self.state_h = self.add_weight(shape=(self.num_layers, units), initializer="zeros", trainable=False,
                                       name="state_h", aggregation="mean")
        self.state_c = self.add_weight(shape=(self.num_layers, units), initializer="zeros", trainable=False,
                                       name="state_c", aggregation="mean")
        self.embedding_dim = int(dim)

    def _input_projection(self, embeddings, tuples):
        """Layer-1 pre-activations `concat(f_1..f_m) @ W + b` of every tuple, `[T, 4 units]`."""
        dim = self.embedding_dim
        kernel = tf.cast(self.lstm_kernels[0], self.compute_dtype)
        z = tf.cast(self.lstm_biases[0], self.compute_dtype)
        for k in range(self.tuple_size):  # concat([f_1..f_m]) @ W == sum_k f_k @ W_k
            z = z + tf.gather(tf.matmul(embeddings, kernel[k * dim:(k + 1) * dim]), tuples[:, k])
        return z

    def call(self, embeddings, tuples):
        embeddings = tf.convert_to_tensor(embeddings, self.compute_dtype)
        tuples = tf.convert_to_tensor(tuples, tf.int32)
        z = self._input_projection(embeddings, tuples)
        new_h, new_c = [], []
        for layer in range(self.num_layers):
            if layer > 0:
                z = tf.matmul(inputs, tf.cast(self.lstm_kernels[layer], self.compute_dtype)) + tf.cast(
                    self.lstm_biases[layer], self.compute_dtype)
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
            self.output_bias, self.compute_dtype)
        return tf.sigmoid(logits[:, 0]), (tf.stack(new_h), tf.stack(new_c))

    def advance_state(self, new_h, new_c):
        """Stores the carried state after a training step (values from `call`, gradients stopped)."""
        self.state_h.assign(tf.cast(tf.stop_gradient(new_h), self.state_h.dtype))
        self.state_c.assign(tf.cast(tf.stop_gradient(new_c), self.state_c.dtype))

    def reset_state(self):
        """Forgets everything carried from earlier steps (state back to zeros)."""
        self.state_h.assign(tf.zeros_like(self.state_h))
        self.state_c.assign(tf.zeros_like(self.state_c))

    def compute_output_spec(self, embeddings, tuples):
        state = keras.KerasTensor((self.num_layers, self.units), dtype=self.compute_dtype)
        return keras.KerasTensor((tuples.shape[0],), dtype=self.compute_dtype), (state, state)

    def get_config(self):
        config = super().get_config()
        config.update(tuple_size=self.tuple_size, units=self.units, num_layers=self.num_layers,
                      state=self.state)
        return config


def _lstm_cell(z, c_prev):
    """One LSTM update from the full pre-activations `z` (Keras' gate order i, f, c, o)."""
    gate_i, gate_f, candidate, gate_o = tf.split(z, 4, axis=-1)
    c = tf.sigmoid(gate_f) * c_prev + tf.sigmoid(gate_i) * tf.tanh(candidate)
    return tf.sigmoid(gate_o) * tf.tanh(c), c


def _icfo(matrix):
    """Keras' gate columns (i, f, c, o) in BlockLSTM's order (i, c, f, o)."""
    gate_i, gate_f, candidate, gate_o = tf.split(matrix, 4, axis=-1)
    return tf.concat([gate_i, candidate, gate_f, gate_o], axis=-1)


def lstm_sequence(inputs_projected, recurrent_kernel, h0, c0):
    """The LSTM recurrence over a sequence whose input projections are given.

    `h_t, c_t = cell(z_t + h_{t-1} @ U, c_{t-1})` for `t = 1..T` from `(h0, c0)` (`[units]` each), with
    `z = inputs_projected` (`[T, 4 units]`, input product and bias included; Keras gate order). Returns
    `(h [T, units], c [T, units])`, differentiable in every argument.
    """
    units = recurrent_kernel.shape[0]
    dtype = inputs_projected.dtype
    if dtype in (tf.float32, tf.float16):
        # x_t @ [I; U'] + h_{t-1} @ U' with x_t = z_t': the fused kernel adds the recurrent product only.
        kernel = tf.concat([tf.eye(4 * units, dtype=dtype), _icfo(recurrent_kernel)], axis=0)
        zeros = tf.zeros([units], dtype)
        outputs = tf.raw_ops.BlockLSTM(
            seq_len_max=tf.cast(tf.shape(inputs_projected)[0], tf.int64), x=_icfo(inputs_projected)[:, None, :],
            cs_prev=c0[None, :], h_prev=h0[None, :], w=kernel, wci=zeros, wcf=zeros, wco=zeros,
            b=tf.zeros([4 * units], dtype), forget_bias=0.0, cell_clip=-1.0, use_peephole=False)
        cells, hidden = outputs[1], outputs[6]
        return hidden[:, 0, :], cells[:, 0, :]

    def step(carry, z_t):
        return _lstm_cell(z_t[None, :] + tf.matmul(carry[0], recurrent_kernel), carry[1])

    hidden, cells = tf.scan(step, inputs_projected, initializer=(h0[None, :], c0[None, :]))
    return tf.reshape(hidden, [-1, units]), tf.reshape(cells, [-1, units])


def _unit_forget_bias(units):
    """Forget-gate bias 1, others 0 (Keras' `unit_forget_bias=True`)."""

    def initializer(shape, dtype=None):
        return keras.ops.concatenate([keras.ops.zeros((units,), dtype=dtype),
                                      keras.ops.ones((units,), dtype=dtype),
                                      keras.ops.zeros((2 * units,), dtype=dtype)])

    return initializer
