"""Euclidean distance matrix with a hand-written gradient: the backward pass is one `[B, B] x [B, D]`
matmul instead of autodiff through `||f||^2 - 2 f g^T + ||g||^2`, `max(., 0)` and `sqrt`.

Values are exactly those of `tfdml.ops.pairwise_distance`; the gradient is the same (zero where a distance
is 0). For an upstream gradient `U = dL/dd`, with `W = U / d` (0 where `d = 0`):

    dL/df_i = f_i * sum_j W_ij - sum_j W_ij g_j        dL/dg_j = g_j * sum_i W_ij - sum_i W_ij f_i

and with `gallery = None` both ends are the same rows, so `W` is replaced by `W + W^T`. Losses whose value is
dominated by the distance matrix (every hinge or weighted-sum loss) run up to twice as fast in training.
"""

import tensorflow as tf

from tfdml.ops.distances import pairwise_squared_distance, safe_sqrt


def _weights_over_distance(upstream, dist):
    positive = dist > 0
    return tf.where(positive, upstream / tf.where(positive, dist, tf.ones_like(dist)), tf.zeros_like(dist))


def euclidean_distance_matrix(embeddings, gallery=None):
    """`d_ij = ||f_i - g_j||_2` (`g = f` when `gallery` is None), gradient-safe at 0, one-matmul backward.

    Args:
        embeddings: `[B, D]` float queries.
        gallery: optional `[G, D]` float gallery; pass `tf.stop_gradient(embeddings)` to treat the other
            end of every pair as a constant (its gradient is then never computed).

    Returns:
        `[B, G]` distances.
    """
    embeddings = tf.convert_to_tensor(embeddings)
    if gallery is None:
        @tf.custom_gradient
        def symmetric(f):
            dist = safe_sqrt(pairwise_squared_distance(f))

            def grad(upstream):
                weights = _weights_over_distance(upstream, dist)
                weights = weights + tf.transpose(weights)
                return f * tf.reduce_sum(weights, axis=1, keepdims=True) - tf.matmul(weights, f)
            return dist, grad
        return symmetric(embeddings)

    gallery = tf.convert_to_tensor(gallery, dtype=embeddings.dtype)

    @tf.custom_gradient
    def query_gallery(f, g):
        dist = safe_sqrt(pairwise_squared_distance(f, g))

        def grad(upstream):
            weights = _weights_over_distance(upstream, dist)
            grad_f = f * tf.reduce_sum(weights, axis=1, keepdims=True) - tf.matmul(weights, g)
            grad_g = g * tf.transpose(tf.reduce_sum(weights, axis=0, keepdims=True)) - tf.matmul(
                weights, f, transpose_a=True)
            return grad_f, grad_g
        return dist, grad
    return query_gallery(embeddings, gallery)
