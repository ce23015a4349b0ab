"""Embedding heads of the RLL authors' multi-level GoogLeNet-BN (official Caffe prototxt), as Keras layers.

- `GlobalEmbeddingHead` (the H head and the single-level `Embedder`):
  global average pool -> Dense(D, no bias). Output un-normalised.
- `AuxiliaryEmbeddingHead` (the L and M heads, GoogLeNet's auxiliary-classifier branch):
  AvgPool 5x5 stride 3 -> Conv 1x1 (128, no bias) + BN + ReLU -> flatten -> Dense 1024 (no bias) + BN + ReLU
  -> Dense(D, no bias). Output un-normalised. On maps smaller than 5x5 the pool covers the whole map, and on
  maps of unknown size it is a global pool (then the flatten sees 1x1x128).
- `L2Normalize`: `x / max(||x||, eps)` along the last axis.

Heads return un-normalised vectors because the multi-level inference embedding L2-normalises the
*concatenation* of the un-normalised level outputs.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tfdml")
class L2Normalize(keras.layers.Layer):
    """`y = x / sqrt(max(sum(x^2), epsilon))` along `axis` (unit-norm rows; a zero row stays zero).

    Example: `L2Normalize()(tf.constant([[3.0, 4.0]]))` -> `[[0.6, 0.8]]`.
    """

    def __init__(self, axis=-1, epsilon=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.axis = axis
        self.epsilon = epsilon

    def call(self, inputs):
        return tf.math.l2_normalize(inputs, axis=self.axis, epsilon=self.epsilon)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="tfdml")
class GlobalEmbeddingHead(keras.layers.Layer):
    """Global average pool -> Dense(`embedding_dim`, no bias): the RLL H head.

    Args:
      embedding_dim: output size D.
      use_bias: the official head has no bias (default False).

    Example: `GlobalEmbeddingHead(64)(feature_map)` with `feature_map` `[B, h, w, C]` -> `[B, 64]`.
    """

    def __init__(self, embedding_dim, use_bias=False, **kwargs):
        super().__init__(**kwargs)
        self.embedding_dim = int(embedding_dim)
        self.use_bias = bool(use_bias)
        self.pool = keras.layers.GlobalAveragePooling2D(name="pool")
        self.projection = keras.layers.Dense(self.embedding_dim, use_bias=self.use_bias, name="projection")

    def build(self, input_shape):
        if len(input_shape) == 2:  # already pooled features
            self.projection.build(input_shape)
        else:
            self.projection.build((input_shape[0], input_shape[-1]))

    def call(self, inputs, training=None):
        x = self.pool(inputs) if len(inputs.shape) == 4 else inputs
        return self.projection(x)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.embedding_dim)

    def get_config(self):
        return {**super().get_config(), "embedding_dim": self.embedding_dim, "use_bias": self.use_bias}


@keras.saving.register_keras_serializable(package="tfdml")
class AuxiliaryEmbeddingHead(keras.layers.Layer):
    """AvgPool 5x5/3 -> Conv1x1 + BN + ReLU -> flatten -> Dense + BN + ReLU -> Dense(D, no bias): RLL L/M head.

    Args:
      embedding_dim: output size D.
      filters: channels of the 1x1 convolution (official 128).
      units: width of the hidden fully connected layer (official 1024).
      pool_size, pool_strides: the average pool (official 5, 3), clipped to the feature-map size.

    Example: `AuxiliaryEmbeddingHead(512)(inception_4e_output)` -> `[B, 512]`.
    """

    def __init__(self, embedding_dim, filters=128, units=1024, pool_size=5, pool_strides=3, **kwargs):
        super().__init__(**kwargs)
        self.embedding_dim = int(embedding_dim)
        self.filters = int(filters)
        self.units = int(units)
        self.pool_size = int(pool_size)
        self.pool_strides = int(pool_strides)
        self.conv = keras.layers.Conv2D(self.filters, 1, use_bias=False, name="conv")
        self.conv_bn = keras.layers.BatchNormalization(name="conv_bn")
        self.fc = keras.layers.Dense(self.units, use_bias=False, name="fc")
        self.fc_bn = keras.layers.BatchNormalization(name="fc_bn")
        self.projection = keras.layers.Dense(self.embedding_dim, use_bias=False, name="projection")

    def _pool_geometry(self, input_shape):
        """(pool, strides, output height, output width), or None for a global pool on unknown sizes."""
        height, width = input_shape[1], input_shape[2]
        if height is None or width is None:
            return None
        pool = (min(self.pool_size, height), min(self.pool_size, width))
        strides = (self.pool_strides, self.pool_strides)
        return pool, strides, (height - pool[0]) // strides[0] + 1, (width - pool[1]) // strides[1] + 1

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(f"AuxiliaryEmbeddingHead needs a feature map [batch, h, w, c], got {input_shape}.")
        geometry = self._pool_geometry(input_shape)
        self.pool = (keras.layers.GlobalAveragePooling2D(keepdims=True, name="pool") if geometry is None else
                     keras.layers.AveragePooling2D(geometry[0], geometry[1], padding="valid", name="pool"))
        out_h, out_w = (1, 1) if geometry is None else geometry[2:]
        self.conv.build((None, out_h, out_w, input_shape[-1]))
        self.conv_bn.build((None, out_h, out_w, self.filters))
        self._flat_dim = out_h * out_w * self.filters
        self.fc.build((None, self._flat_dim))
        self.fc_bn.build((None, self.units))
        self.projection.build((None, self.units))

    def call(self, inputs, training=None):
        x = self.pool(inputs)
        x = tf.nn.relu(self.conv_bn(self.conv(x), training=training))
        x = tf.reshape(x, [-1, self._flat_dim])
        x = tf.nn.relu(self.fc_bn(self.fc(x), training=training))
        return self.projection(x)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.embedding_dim)

    def get_config(self):
        return {**super().get_config(), "embedding_dim": self.embedding_dim, "filters": self.filters,
                "units": self.units, "pool_size": self.pool_size, "pool_strides": self.pool_strides}
