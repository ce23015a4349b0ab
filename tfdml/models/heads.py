"""Embedding heads of the RLL authors' multi-level GoogLeNet-BN (official Caffe prototxt), as Keras layers.

- `GlobalEmbeddingHead` (the H head and the single-level `Embedder`):
  global average pool -> Dense(D, no bias), or the pooled feature itself (`embedding_dim=None`, Group
  Loss's official layout). Output un-normalised.
- `AuxiliaryEmbeddingHead` (the L and M heads, GoogLeNet's auxiliary-classifier branch):
  AvgPool 5x5 stride 3 (Caffe's pooling, `CaffeAveragePooling2D`: output size rounded UP, 7x7 -> 2x2 and
  14x14 -> 4x4) -> Conv 1x1 (128, no bias) + BN + ReLU -> flatten -> Dense 1024 (no bias) + BN + ReLU
  -> Dense(D, no bias). Output un-normalised. On maps smaller than 5x5 the pool covers the whole map, and on
  maps of unknown size it is a global pool (then the flatten sees 1x1x128).
- `CaffeAveragePooling2D`: average pooling with Caffe's output size and border divisor.
- `L2Normalize`: `x / max(||x||, eps)` along the last axis, in float32 (also under mixed precision).

Heads return un-normalised vectors because the multi-level inference embedding L2-normalises the
*concatenation* of the un-normalised level outputs.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tfdml")
class L2Normalize(keras.layers.Layer):
    """`y = x / sqrt(max(sum(x^2), epsilon))` along `axis` (unit-norm rows; a zero row stays zero).

    Under a mixed-precision policy it computes in float32 unless given another `dtype` (its inputs are
    cast up, its output is float32, as mixed precision asks of a model's output layer): in float16 a sum of
    squares overflows past 65504 (activations from about 256 up) and `epsilon` is 0, so the row would come
    out zero or NaN.

    Example: `L2Normalize()(tf.constant([[3.0, 4.0]]))` -> `[[0.6, 0.8]]`.
    """

    def __init__(self, axis=-1, epsilon=1e-12, **kwargs):
        if "dtype" not in kwargs and keras.config.dtype_policy().compute_dtype in ("float16", "bfloat16"):
            kwargs["dtype"] = "float32"  # a float64 (or float32) policy keeps its own precision
        super().__init__(**kwargs)
        self.axis = axis
        self.epsilon = epsilon

    def call(self, inputs):
        # tf.math.l2_normalize's arithmetic in backend-neutral ops (the same values on TensorFlow), so that an
        # embedder runs on every Keras backend
        square_sum = keras.ops.sum(keras.ops.square(inputs), axis=self.axis, keepdims=True)
        return inputs * keras.ops.rsqrt(keras.ops.maximum(square_sum, keras.ops.cast(self.epsilon, inputs.dtype)))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="tfdml")
class GlobalEmbeddingHead(keras.layers.Layer):
    """Global average pool -> Dense(`embedding_dim`, no bias): the RLL H head.

    With `embedding_dim=None` there is no projection: the pooled feature itself is the (un-normalised)
    embedding, as in the Group Loss authors' code (BN-Inception's 1024-d pooled feature).

    Args:
      embedding_dim: output size D, or None for the pooled feature (size = the map's channels).
      use_bias: the official head has no bias (default False).

    Example: `GlobalEmbeddingHead(64)(feature_map)` with `feature_map` `[B, h, w, C]` -> `[B, 64]`.
    """

    def __init__(self, embedding_dim, use_bias=False, **kwargs):
        super().__init__(**kwargs)
        self.embedding_dim = None if embedding_dim is None else int(embedding_dim)
        self.use_bias = bool(use_bias)
        self.pool = keras.layers.GlobalAveragePooling2D(name="pool")
        self.projection = (
            None
            if self.embedding_dim is None
            else keras.layers.Dense(self.embedding_dim, use_bias=self.use_bias, name="projection")
        )

    def build(self, input_shape):
        if self.projection is None:
            return
        if len(input_shape) == 2:  # already pooled features
            self.projection.build(input_shape)
        else:
            self.projection.build((input_shape[0], input_shape[-1]))

    def call(self, inputs, training=None):
        x = self.pool(inputs) if len(inputs.shape) == 4 else inputs
        return x if self.projection is None else self.projection(x)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1] if self.embedding_dim is None else self.embedding_dim)

    def get_config(self):
        return {**super().get_config(), "embedding_dim": self.embedding_dim, "use_bias": self.use_bias}


def caffe_pool_output_size(size, pool_size, strides):
    """Caffe's pooled size without padding: `ceil((size - pool) / stride) + 1` (rounded UP, where TF's
    "valid" rounds down), at least 1 (a map smaller than the window is pooled whole)."""
    return max(1, -(-(size - pool_size) // strides) + 1)


@keras.saving.register_keras_serializable(package="tfdml")
class CaffeAveragePooling2D(keras.layers.Layer):
    """Average pooling as Caffe computes it (`PoolingLayer`, AVE, no padding), for NHWC maps of known size.

    Caffe rounds the output size up, `ceil((H - k) / s) + 1`, so the last window may run past the map's
    bottom/right edge (GoogLeNet's 5x5/3 pool: 7x7 -> 2x2, 14x14 -> 4x4, where a "valid" pool gives 1x1 and
    3x3). Windows start at `0, s, 2s, ...`; a window that runs past the edge is clipped to the map and divided
    by the number of elements it really covers (Caffe's `pool_size = (hend - hstart) * (wend - wstart)` with
    `hend = min(hstart + k, H)` when there is no padding), so it averages real values only.

    Args:
      pool_size: window size `k` (int or pair).
      strides: stride `s` (int or pair).

    Example: `CaffeAveragePooling2D(5, 3)(x)` with `x` `[B, 7, 7, C]` -> `[B, 2, 2, C]`.
    """

    def __init__(self, pool_size=5, strides=3, **kwargs):
        super().__init__(**kwargs)
        self.pool_size = tuple(pool_size) if isinstance(pool_size, (tuple, list)) else (int(pool_size),) * 2
        self.strides = tuple(strides) if isinstance(strides, (tuple, list)) else (int(strides),) * 2

    def _geometry(self, input_shape):
        height, width = input_shape[1], input_shape[2]
        if height is None or width is None:
            raise ValueError(f"CaffeAveragePooling2D needs a known map size, got {input_shape}.")
        out = [caffe_pool_output_size(n, k, s) for n, k, s in zip((height, width), self.pool_size, self.strides)]
        window = [min(k, n) for k, n in zip(self.pool_size, (height, width))]
        # Pad bottom/right so that the last (rounded-up) window fits; the padding is excluded from the divisor.
        pad = [max(0, (o - 1) * s + k - n) for o, s, k, n in zip(out, self.strides, window, (height, width))]
        return out, window, pad

    def call(self, inputs):
        _, window, pad = self._geometry(inputs.shape)
        paddings = [[0, 0], [0, pad[0]], [0, pad[1]], [0, 0]]
        values = tf.pad(inputs, paddings)
        # Share of each window inside the map; avg(values) / share = sum over the map / elements in the map.
        inside = tf.pad(tf.ones_like(inputs[:1, :, :, :1]), paddings)
        pooled = tf.nn.avg_pool2d(values, window, self.strides, "VALID")
        share = tf.nn.avg_pool2d(inside, window, self.strides, "VALID")
        return pooled / share

    def compute_output_shape(self, input_shape):
        out, _, _ = self._geometry(input_shape)
        return (input_shape[0], out[0], out[1], input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "pool_size": list(self.pool_size), "strides": list(self.strides)}


@keras.saving.register_keras_serializable(package="tfdml")
class AuxiliaryEmbeddingHead(keras.layers.Layer):
    """AvgPool 5x5/3 -> Conv1x1 + BN + ReLU -> flatten -> Dense + BN + ReLU -> Dense(D, no bias): RLL L/M head.

    Args:
      embedding_dim: output size D.
      filters: channels of the 1x1 convolution (official 128).
      units: width of the hidden fully connected layer (official 1024).
      pool_size, pool_strides: the average pool (official 5, 3), Caffe's rounded-up pooling
        (`CaffeAveragePooling2D`), the window clipped to the feature-map size.

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

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(f"AuxiliaryEmbeddingHead needs a feature map [batch, h, w, c], got {input_shape}.")
        if input_shape[1] is None or input_shape[2] is None:
            self.pool = keras.layers.GlobalAveragePooling2D(keepdims=True, name="pool")
            out_h, out_w = 1, 1
        else:
            self.pool = CaffeAveragePooling2D(self.pool_size, self.pool_strides, name="pool")
            _, out_h, out_w, _ = self.pool.compute_output_shape(tuple(input_shape))
        self.pool.build(tuple(input_shape))  # no weights, but an unbuilt layer leaves the optimizer to the first trace
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
        return {
            **super().get_config(),
            "embedding_dim": self.embedding_dim,
            "filters": self.filters,
            "units": self.units,
            "pool_size": self.pool_size,
            "pool_strides": self.pool_strides,
        }
