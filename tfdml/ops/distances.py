"""Pairwise distances and similarities between rows of embedding matrices, in `keras.ops` (every backend).

All functions take `[B, D]` queries and an optional `[G, D]` gallery (default: the queries themselves) and
return a `[B, G]` matrix. The Euclidean distance is differentiable everywhere, including at `d = 0`
(duplicate or identical embeddings, and the diagonal), where the plain `sqrt` would give an infinite
gradient and NaNs downstream.

`DISTANCES` names the distances a loss may be given (its `distance` argument, pytorch-metric-learning's
injectable `distance`): `distance_matrix(name, embeddings, gallery)` computes one by name. These names, with
`"dot_product"` for a ranking by inner product (`tfdml.ops.neighbours`), are tfdml's one vocabulary of
distances; `distance_name` maps the spellings of tensorflow-addons (`"L2"`, `"squared-L2"`, `"angular"`) and
of ScaNN and faiss (`"squared_l2"`) onto it where those are accepted.
"""

from keras import ops

# Below this squared distance the sqrt is replaced by 0 with a zero gradient. Far below any distance that
# matters for unit-norm embeddings (distances in [0, 2]), far above float32 round-off of ||a||^2 - 2ab + ||b||^2.
_EPSILON = 1e-12


def safe_sqrt(x, epsilon=_EPSILON):
    """`sqrt(x)` for `x >= 0` with a finite (zero) gradient where `x <= epsilon`."""
    x = ops.convert_to_tensor(x)
    positive = x > epsilon
    safe_x = ops.where(positive, x, ops.ones_like(x))
    return ops.where(positive, ops.sqrt(safe_x), ops.zeros_like(x))


def _zero_diagonal(matrix):
    return ops.where(ops.cast(ops.eye(ops.shape(matrix)[0], ops.shape(matrix)[1]), "bool"), 0.0, matrix)


def pairwise_squared_distance(embeddings, gallery=None):
    """Squared Euclidean distances `||f_i - g_j||^2`, clipped at 0 against round-off.

    Computed with one matmul (`||f||^2 - 2 f g^T + ||g||^2`); when `gallery` is omitted the diagonal is
    exactly 0.
    """
    embeddings = ops.convert_to_tensor(embeddings)
    same = gallery is None
    gallery = embeddings if same else ops.cast(gallery, embeddings.dtype)
    sq_q = ops.sum(ops.square(embeddings), axis=1, keepdims=True)
    sq_g = ops.sum(ops.square(gallery), axis=1)
    dist = ops.maximum(sq_q - 2.0 * ops.matmul(embeddings, ops.transpose(gallery)) + sq_g[None, :], 0.0)
    return _zero_diagonal(dist) if same else dist


def _weights_over_distance(upstream, dist):
    positive = dist > 0
    return ops.where(positive, upstream / ops.where(positive, dist, ops.ones_like(dist)), ops.zeros_like(dist))


def _upstream(args, upstream):
    # keras.ops.custom_gradient: TensorFlow and JAX pass the upstream gradient positionally, PyTorch by keyword.
    return args[0] if upstream is None else upstream


@ops.custom_gradient
def _symmetric_distance(f):
    dist = safe_sqrt(pairwise_squared_distance(f))

    def grad(*args, upstream=None):
        weights = _weights_over_distance(_upstream(args, upstream), dist)
        weights = weights + ops.transpose(weights)
        return f * ops.sum(weights, axis=1, keepdims=True) - ops.matmul(weights, f)

    return dist, grad


@ops.custom_gradient
def _query_gallery_distance(f, g):
    dist = safe_sqrt(pairwise_squared_distance(f, g))

    def grad(*args, upstream=None):
        weights = _weights_over_distance(_upstream(args, upstream), dist)
        grad_f = f * ops.sum(weights, axis=1, keepdims=True) - ops.matmul(weights, g)
        grad_g = g * ops.sum(weights, axis=0)[:, None] - ops.matmul(ops.transpose(weights), f)
        return grad_f, grad_g

    return dist, grad


def pairwise_distance(embeddings, gallery=None, squared=False):
    """Euclidean distances `||f_i - g_j||_2` (or squared with `squared=True`), gradient-safe at 0.

    The backward pass of the (non-squared) distance is written by hand as one `[B, G] x [G, D]` matmul,
    instead of autodiff through `||f||^2 - 2 f g^T + ||g||^2`, the clip and the sqrt (about twice as fast
    for losses dominated by the distance matrix). For an upstream gradient `U = dL/dd` and
    `W = U / d` (0 where `d = 0`, so duplicate and zero embeddings get a zero, finite gradient):

        dL/df_i = f_i sum_j W_ij - sum_j W_ij g_j          dL/dg_j = g_j sum_i W_ij - sum_i W_ij f_i

    and without a gallery both ends are the same rows (`W + W^T`). Pass `gallery=ops.stop_gradient(f)` to
    treat the other end of every pair as a constant. First derivatives are exact; second derivatives
    through this function are not supported.
    """
    if squared:
        return pairwise_squared_distance(embeddings, gallery)
    embeddings = ops.convert_to_tensor(embeddings)
    if gallery is None:
        return _symmetric_distance(embeddings)
    return _query_gallery_distance(embeddings, ops.cast(gallery, embeddings.dtype))


def l2_normalize(embeddings, epsilon=1e-12):
    """Rows scaled to unit L2 norm; a zero row stays zero (its norm is clamped at `sqrt(epsilon)`), with a finite
    gradient. Same as `tf.math.l2_normalize(x, axis=1)`; pytorch-metric-learning's `F.normalize` clamps the
    norm at 1e-12 instead, which only differs for rows of norm below 1e-6."""
    embeddings = ops.convert_to_tensor(embeddings)
    sq_norm = ops.sum(ops.square(embeddings), axis=1, keepdims=True)
    return embeddings * ops.rsqrt(ops.maximum(sq_norm, ops.cast(epsilon, embeddings.dtype)))


def pairwise_cosine_similarity(embeddings, gallery=None, epsilon=1e-12):
    """Cosine similarity `<f_i, g_j> / (||f_i|| ||g_j||)` of L2-normalised rows (`l2_normalize`): `[B, G]`.

    A zero row has similarity 0 with everything. Without a gallery the rows are compared with themselves
    (the diagonal is 1 for non-zero rows). pytorch-metric-learning's `CosineSimilarity` computes the same.
    """
    unit = l2_normalize(embeddings, epsilon)
    other = unit if gallery is None else l2_normalize(ops.cast(gallery, unit.dtype), epsilon)
    return ops.matmul(unit, ops.transpose(other))


def pairwise_pearson_similarity(embeddings, epsilon=1e-12):
    """Pearson correlation between rows: each row centred over its features, then cosine similarity.

    A constant (for example all-zero) row has no direction; its correlations are 0 instead of 0/0.
    """
    embeddings = ops.convert_to_tensor(embeddings)
    centred = embeddings - ops.mean(embeddings, axis=1, keepdims=True)
    sq_norm = ops.sum(ops.square(centred), axis=1, keepdims=True)
    # rsqrt of a clamped norm keeps value and gradient finite for constant rows.
    unit = centred * ops.rsqrt(ops.maximum(sq_norm, ops.cast(epsilon, centred.dtype)))
    return ops.matmul(unit, ops.transpose(unit))


def pairwise_angular_distance(embeddings):
    """`1 - cos(f_i, f_j)`, clipped below at 0 (tensorflow-addons' `angular_distance`).

    Rows are L2-normalised first (`l2_normalize`, so a zero row has zero similarity with everything); the
    diagonal is whatever round-off leaves, as in tensorflow-addons.
    """
    unit = l2_normalize(embeddings)
    return ops.maximum(1.0 - ops.matmul(unit, ops.transpose(unit)), 0.0)


# The distances a loss's `distance` argument may name: smaller means closer for each.
DISTANCES = {
    "euclidean": pairwise_distance,
    "squared_euclidean": lambda embeddings, gallery=None: pairwise_squared_distance(embeddings, gallery),
    "cosine": lambda embeddings, gallery=None: 1.0 - pairwise_cosine_similarity(embeddings, gallery),
}


# Other libraries' names of the same distances (tensorflow-addons' `distance_metric`, ScaNN's and faiss').
DISTANCE_ALIASES = {
    "L2": "euclidean",
    "squared-L2": "squared_euclidean",
    "squared_l2": "squared_euclidean",
    "angular": "cosine",
}


def distance_name(distance, choices=tuple(DISTANCES), aliases=()):
    """`distance` in the vocabulary (one of `choices`), an alias listed in `aliases` mapped onto it; a
    `ValueError` that lists the valid names otherwise."""
    name = DISTANCE_ALIASES[distance] if distance in aliases else distance
    if not isinstance(name, str) or name not in choices:
        valid = ", ".join(repr(choice) for choice in (*choices, *aliases))
        raise ValueError(f"distance must be one of {valid}, got {distance!r}.")
    return name


def distance_matrix(distance, embeddings, gallery=None):
    """`[B, G]` distances by name (`DISTANCES`) or by a callable `distance(embeddings, gallery)`."""
    if callable(distance):
        return distance(embeddings, gallery)
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {tuple(DISTANCES)} or a callable, got {distance!r}.")
    return DISTANCES[distance](embeddings, gallery)
