"""Pairwise distances and similarities between rows of embedding matrices.

All functions take `[B, D]` queries and an optional `[G, D]` gallery (default: the queries themselves) and
return a `[B, G]` matrix. The Euclidean distance is differentiable everywhere, including at `d = 0`
(duplicate or identical embeddings, and the diagonal), where the plain `sqrt` would give an infinite
gradient and NaNs downstream.
"""

import tensorflow as tf

# Below this squared distance the sqrt is replaced by 0 with a zero gradient. Far below any distance that
# matters for unit-norm embeddings (distances in [0, 2]), far above float32 round-off of ||a||^2 - 2ab + ||b||^2.
_EPSILON = 1e-12


def safe_sqrt(x, epsilon=_EPSILON):
    """`sqrt(x)` for `x >= 0` with a finite (zero) gradient where `x <= epsilon`."""
    x = tf.convert_to_tensor(x)
    positive = x > epsilon
    safe_x = tf.where(positive, x, tf.ones_like(x))
    return tf.where(positive, tf.sqrt(safe_x), tf.zeros_like(x))


def pairwise_squared_distance(embeddings, gallery=None):
    """Squared Euclidean distances `||f_i - g_j||^2`, clipped at 0 against round-off.

    Computed with one matmul (`||f||^2 - 2 f g^T + ||g||^2`); when `gallery` is omitted the diagonal is
    exactly 0.
    """
    embeddings = tf.convert_to_tensor(embeddings)
    same = gallery is None
    gallery = embeddings if same else tf.convert_to_tensor(gallery, dtype=embeddings.dtype)
    sq_q = tf.reduce_sum(tf.square(embeddings), axis=1, keepdims=True)
    sq_g = tf.reduce_sum(tf.square(gallery), axis=1, keepdims=True)
    dist = sq_q - 2.0 * tf.matmul(embeddings, gallery, transpose_b=True) + tf.transpose(sq_g)
    dist = tf.maximum(dist, 0.0)
    if same:
        dist = tf.linalg.set_diag(dist, tf.zeros(tf.shape(dist)[0], dtype=dist.dtype))
    return dist


def _weights_over_distance(upstream, dist):
    positive = dist > 0
    return tf.where(positive, upstream / tf.where(positive, dist, tf.ones_like(dist)), tf.zeros_like(dist))


def pairwise_distance(embeddings, gallery=None, squared=False):
    """Euclidean distances `||f_i - g_j||_2` (or squared with `squared=True`), gradient-safe at 0.

    The backward pass of the (non-squared) distance is written by hand as one `[B, G] x [G, D]` matmul,
    instead of autodiff through `||f||^2 - 2 f g^T + ||g||^2`, the clip and the sqrt (about twice as fast
    for losses dominated by the distance matrix). For an upstream gradient `U = dL/dd` and
    `W = U / d` (0 where `d = 0`, so duplicate and zero embeddings get a zero, finite gradient):

        dL/df_i = f_i sum_j W_ij - sum_j W_ij g_j          dL/dg_j = g_j sum_i W_ij - sum_i W_ij f_i

    and without a gallery both ends are the same rows (`W + W^T`). Pass `gallery=tf.stop_gradient(f)` to
    treat the other end of every pair as a constant. First derivatives are exact; second derivatives
    through this function are not supported.
    """
    if squared:
        return pairwise_squared_distance(embeddings, gallery)
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
                weights, f, transpose_a=True
            )
            return grad_f, grad_g

        return dist, grad

    return query_gallery(embeddings, gallery)


def l2_normalize(embeddings, epsilon=1e-12):
    """Rows scaled to unit L2 norm; a zero row stays zero (its norm is clamped at `sqrt(epsilon)`), with a finite
    gradient. Same as `tf.math.l2_normalize(x, axis=1)`; pytorch-metric-learning's `F.normalize` clamps the
    norm at 1e-12 instead, which only differs for rows of norm below 1e-6."""
    embeddings = tf.convert_to_tensor(embeddings)
    sq_norm = tf.reduce_sum(tf.square(embeddings), axis=1, keepdims=True)
    return embeddings * tf.math.rsqrt(tf.maximum(sq_norm, tf.cast(epsilon, embeddings.dtype)))


def pairwise_cosine_similarity(embeddings, gallery=None, epsilon=1e-12):
    """Cosine similarity `<f_i, g_j> / (||f_i|| ||g_j||)` of L2-normalised rows (`l2_normalize`): `[B, G]`.

    A zero row has similarity 0 with everything. Without a gallery the rows are compared with themselves
    (the diagonal is 1 for non-zero rows). pytorch-metric-learning's `CosineSimilarity` computes the same.
    """
    unit = l2_normalize(embeddings, epsilon)
    other = unit if gallery is None else l2_normalize(tf.cast(gallery, unit.dtype), epsilon)
    return tf.matmul(unit, other, transpose_b=True)


def pairwise_pearson_similarity(embeddings, epsilon=1e-12):
    """Pearson correlation between rows: each row centred over its features, then cosine similarity.

    A constant (for example all-zero) row has no direction; its correlations are 0 instead of 0/0.
    """
    embeddings = tf.convert_to_tensor(embeddings)
    centred = embeddings - tf.reduce_mean(embeddings, axis=1, keepdims=True)
    sq_norm = tf.reduce_sum(tf.square(centred), axis=1, keepdims=True)
    # rsqrt of a clamped norm keeps value and gradient finite for constant rows.
    inv_norm = tf.math.rsqrt(tf.maximum(sq_norm, epsilon))
    unit = centred * inv_norm
    return tf.matmul(unit, unit, transpose_b=True)


def pairwise_angular_distance(embeddings):
    """`1 - cos(f_i, f_j)`, clipped below at 0 (tensorflow-addons' `angular_distance`).

    Rows are L2-normalised first (`tf.math.l2_normalize`, so a zero row has zero similarity with everything);
    the diagonal is whatever round-off leaves, as in tensorflow-addons.
    """
    unit = tf.math.l2_normalize(tf.convert_to_tensor(embeddings), axis=1)
    return tf.maximum(1.0 - tf.matmul(unit, unit, transpose_b=True), 0.0)
