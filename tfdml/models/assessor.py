"""The sequence-aware learnable assessor of DML-ALA (Zheng et al., CVPR 2020, §3.2).

`A(T, h; phi) = sigmoid(Dense(LSTM_L(...LSTM_1([f_a, f_p, f_n], h))))`: the embeddings of a tuple are
concatenated and fed to a stack of LSTM cells whose latent state `h` is carried over the whole training
process; a Dense(1) + sigmoid head maps the top output to a weight in (0, 1).

How the sequence is laid out (the paper leaves it open): **one training step is one timestep**. All the
tuples of a step are assessed in parallel from the same carried state (each tuple sees what the assessor
learnt from every earlier step, but not from the other tuples of its own step, so the weights do not depend
on the arbitrary order of tuples within a batch). After the step, the carried state becomes the mean over
that step's tuples of their new LSTM states. The state lives in non-trainable variables (`state_h`,
`state_c`, shape `[layers, units]`), so it is saved and restored with the model; `reset_state()` zeroes it.
Gradients do not flow into earlier steps through the state (truncated back-propagation of length 1),
matching eq (12), which differentiates the current episode only.

The first LSTM kernel acts on the concatenation `[f_1, ..., f_m]` of a tuple; it is stored as one
`[m * D, 4 * units]` matrix, and applied as `sum_k (F W_k)[i_k]` (each embedding projected once, then
gathered per tuple), which is the same product without materialising `[T, m * D]` inputs.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tfdml")
class TupleAssessor(keras.layers.Layer):
    """LSTM assessor: weights in (0, 1) for tuples of embeddings, with a state carried across steps.

    Args:
        tuple_size: embeddings per tuple (3 for triplets, 2 for pairs).
        units: hidden units of each LSTM layer (paper: 64).
        num_layers: stacked LSTM layers (paper: 2).

    Call: `weights, (new_h, new_c) = assessor(embeddings [B, D], tuples int [T, tuple_size])`; the carried
    state is only read. `advance_state(new_h, new_c)` stores the step's new state.

    Example:
        >>> assessor = TupleAssessor(tuple_size=3)
        >>> assessor.build((None, 16))
        >>> w, new_state = assessor(embeddings, triplets)   # w: [T] in (0, 1)
        >>> assessor.advance_state(*new_state)
    """

    def __init__(self, tuple_size=3, units=64, num_layers=2, **kwargs):
        super().__init__(**kwargs)
        if int(tuple_size) < 1 or int(units) < 1 or int(num_layers) < 1:
            raise ValueError(f"tuple_size, units and num_layers must be positive integers, got "
                             f"{tuple_size}, {units}, {num_layers}.")
        self.tuple_size = int(tuple_size)
        self.units = int(units)
        self.num_layers = int(num_layers)

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

    def call(self, embeddings, tuples):
        embeddings = tf.convert_to_tensor(embeddings, self.compute_dtype)
        tuples = tf.convert_to_tensor(tuples, tf.int32)
        count = tf.shape(tuples)[0]
        dim = self.embedding_dim
        inputs = None
        new_h, new_c = [], []
        for layer in range(self.num_layers):
            kernel = tf.cast(self.lstm_kernels[layer], self.compute_dtype)
            if layer == 0:
                z = 0.0
                for k in range(self.tuple_size):  # concat([f_1..f_m]) @ W == sum_k f_k @ W_k
                    projected = tf.matmul(embeddings, kernel[k * dim:(k + 1) * dim])
                    z = z + tf.gather(projected, tuples[:, k])
            else:
                z = tf.matmul(inputs, kernel)
            h_prev = tf.cast(self.state_h[layer], self.compute_dtype)
            c_prev = tf.cast(self.state_c[layer], self.compute_dtype)
            z = z + tf.matmul(h_prev[None, :], tf.cast(self.lstm_recurrent_kernels[layer], self.compute_dtype))
            z = z + tf.cast(self.lstm_biases[layer], self.compute_dtype)
            gate_i, gate_f, candidate, gate_o = tf.split(z, 4, axis=-1)  # Keras' LSTM gate order
            c = tf.sigmoid(gate_f) * c_prev + tf.sigmoid(gate_i) * tf.tanh(candidate)
            h = tf.sigmoid(gate_o) * tf.tanh(c)
            c = tf.reshape(c, [count, self.units])
            h = tf.reshape(h, [count, self.units])
            new_h.append(h)
            new_c.append(c)
            inputs = h
        logits = tf.matmul(inputs, tf.cast(self.output_kernel, self.compute_dtype)) + tf.cast(
            self.output_bias, self.compute_dtype)
        weights = tf.sigmoid(logits[:, 0])
        # An empty step keeps the old state.
        keep = tf.equal(count, 0)
        mean_h = tf.where(keep, tf.cast(self.state_h, self.compute_dtype),
                          tf.stack([tf.reduce_mean(h, axis=0) for h in new_h]))
        mean_c = tf.where(keep, tf.cast(self.state_c, self.compute_dtype),
                          tf.stack([tf.reduce_mean(c, axis=0) for c in new_c]))
        return weights, (mean_h, mean_c)

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
        config.update(tuple_size=self.tuple_size, units=self.units, num_layers=self.num_layers)
        return config


def _unit_forget_bias(units):
    """Forget-gate bias 1, others 0 (Keras' `unit_forget_bias=True`)."""

    def initializer(shape, dtype=None):
        return keras.ops.concatenate([keras.ops.zeros((units,), dtype=dtype),
                                      keras.ops.ones((units,), dtype=dtype),
                                      keras.ops.zeros((2 * units,), dtype=dtype)])

    return initializer
