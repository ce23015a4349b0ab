"""Margin loss with distance-weighted negative sampling (Wu et al. 2017, "Sampling Matters").

For a triplet `(a, p, n)` (anchor, positive of the anchor's class, negative of another class) and a
boundary `beta` (one scalar, or one per class indexed by the anchor's class as in the official code):

    pos = [d_ap - beta + alpha]+        neg = [beta - d_an + alpha]+
    L = sum_triplets (pos + neg) / (#(pos > 0) + #(neg > 0))  +  R

with the regulariser `R = nu * beta` for a single beta and `R = nu * sum_triplets beta_{y_a} / (#(pos > 0) +
#(neg > 0))` for per-class betas (official code; both as pytorch-metric-learning's `MarginLoss`). `MarginLoss`
adds `R` only when beta is learned (`learn_beta=True`), as the official code and PML do (`margin_loss`: when
`nu > 0`). The hinge part is 0 when no term is active, everything 0 for a batch without any triplet.

Triplets come from one of two samplers:

- `"distance_weighted"`: for every anchor-positive pair one negative is drawn in-graph with probability
  proportional to `1 / q(d_an)`, where `q(d) ~ d^(n-2) (1 - d^2/4)^((n-3)/2)` is the density of distances
  between uniform points on the unit sphere in `n` dimensions. The categorical logits are the official
  code's `log_weights = -log q(d) = (2 - n) log d - ((n - 3) / 2) log(1 - d^2 / 4)`; `d` is clipped below at
  `cutoff` and negatives at `d >= nonzero_loss_cutoff` get zero weight (the draws lean towards the nearer,
  harder negatives). An anchor whose negatives all lie beyond the cutoff draws uniformly among them.
- `"all"`: every `(a, p, n)` triplet, in O(B^2) memory (the hinges separate: each counted per partner).

Written in `keras.ops`, hinges once (`_hinges`). The sampler uses `tf.random.categorical` on TensorFlow and a
dense `[B, G]` grid from `keras.random.categorical` elsewhere: the same distribution, not the same draws.
"""

import keras
import numpy as np
from keras import backend, ops

from tfdml.loss_names import TUPLE_KINDS
from tfdml.losses.arguments import DECLARED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.ops import (
    TupleTerms,
    as_scalar,
    negative_mask,
    pair_indices,
    pair_masks,
    pairwise_distance,
    reference_embeddings,
    safe_divide,
    triplet_distances,
    triplet_mask,
    validate_inputs,
)

SAMPLING_MODES = ("distance_weighted", "all")


def _as_beta(beta, dtype):
    """beta as a tensor of the embedding dtype (Python numbers converted directly, no float32 round trip)."""
    if isinstance(beta, (int, float, list, tuple, np.ndarray, np.floating)):
        return ops.convert_to_tensor(np.asarray(beta), dtype)
    beta = ops.cast(ops.convert_to_tensor(beta), dtype)
    if len(beta.shape) not in (0, 1):
        raise ValueError(f"beta must be a scalar or a [num_classes] vector, got shape {tuple(beta.shape)}.")
    return beta


def _beta_per_anchor(beta, labels, dtype):
    """Broadcastable beta for anchors `labels`: a scalar stays scalar, a per-class vector is gathered."""
    beta = _as_beta(beta, dtype)
    if len(beta.shape) == 0:
        return beta
    if len(beta.shape) != 1:
        raise ValueError(f"beta must be a scalar or a [num_classes] vector, got shape {tuple(beta.shape)}.")
    # A one-hot product instead of a gather: beta's gradient stays dense (optimizers, all-reduce).
    return ops.matmul(ops.one_hot(labels, beta.shape[0], dtype=dtype), beta)


def _hinges(d_ap, d_an, beta_a, alpha):
    """The margin loss's two hinges, written once: `pos = [d_ap - beta + alpha]+`, `neg = [beta - d_an +
    alpha]+` (any broadcastable shapes)."""
    alpha = as_scalar(alpha, d_ap.dtype)
    return ops.relu(d_ap - beta_a + alpha), ops.relu(beta_a - d_an + alpha)


def _active(x):
    return ops.cast(x > 0, x.dtype)


def _regulariser(beta, beta_sum, num_triplets, active, nu, dtype):
    """`nu * beta` for a single beta; `nu * sum_triplets beta_{y_a} / (#pos>0 + #neg>0)` for per-class betas
    (official code and pytorch-metric-learning). 0 without triplets."""
    if nu == 0:
        return ops.zeros((), dtype)
    beta = _as_beta(beta, dtype)
    nu = as_scalar(nu, dtype)
    if len(beta.shape) == 0:
        return nu * ops.where(num_triplets > 0, beta, ops.zeros((), dtype))
    return nu * safe_divide(beta_sum, active)


@defaults_from("MarginLoss")
def distance_weighted_log_weights(distances, negatives, dim, cutoff=DECLARED, nonzero_loss_cutoff=DECLARED):
    """Log sampling weights `-log q(d)` over each row's negatives (`-inf` where a negative is not eligible).

    `log w(d) = (2 - n) log d - ((n - 3) / 2) log(1 - d^2 / 4)`: the inverse of the density of distances
    on the unit sphere (the official code's `log_weights`), so near negatives, rare in high dimension, are
    drawn far more often than their frequency.

    Args:
        distances: `[B, G]` anchor-to-candidate distances (treated as constants).
        negatives: `[B, G]` bool mask of the candidates of another class.
        dim: embedding dimension `n`.
        cutoff: distances are clipped below at this value (avoids the huge weight of near-duplicates).
        nonzero_loss_cutoff: candidates at this distance or farther get zero weight.

    Returns:
        `[B, G]` categorical logits. A row whose negatives all lie beyond `nonzero_loss_cutoff` is uniform
        over its negatives; a row with no negative is uniform over all candidates (its draws must be
        discarded by the caller).
    """
    distances = ops.stop_gradient(ops.convert_to_tensor(distances))
    dtype = distances.dtype
    dim = as_scalar(dim, dtype)
    # Inside the eligible band the clipped distance lies in [cutoff, min(nonzero_loss_cutoff, 2)) where
    # both logs are finite; outside it the value is masked anyway, so clip to keep the maths finite.
    upper = min(float(nonzero_loss_cutoff), 2.0 - 1e-4)
    d = ops.clip(distances, as_scalar(float(cutoff), dtype), as_scalar(upper, dtype))
    log_weights = (2.0 - dim) * ops.log(d) - ((dim - 3.0) / 2.0) * ops.log(1.0 - 0.25 * ops.square(d))
    eligible = ops.logical_and(negatives, distances < as_scalar(float(nonzero_loss_cutoff), dtype))
    any_eligible = ops.any(eligible, axis=1, keepdims=True)
    any_negative = ops.any(negatives, axis=1, keepdims=True)
    # Fallbacks keep every row a valid categorical distribution: uniform over negatives, else over all.
    support = ops.where(any_eligible, eligible, ops.logical_or(negatives, ops.logical_not(any_negative)))
    logits = ops.where(any_eligible, log_weights, ops.zeros_like(log_weights))
    return ops.where(support, logits, ops.full_like(logits, -np.inf))


@defaults_from("MarginLoss")
def distance_weighted_probabilities(labels, embeddings, cutoff=DECLARED, nonzero_loss_cutoff=DECLARED):
    """`[B, B]` probability that the distance-weighted sampler draws negative `j` for anchor `i`.

    Row `i` is the softmax of `distance_weighted_log_weights` (what the sampler draws from): proportional to
    `1 / q(max(d_ij, cutoff))` over the negatives closer than `nonzero_loss_cutoff` (Wu et al.'s
    `DistanceWeightedSampling`), uniform over the negatives when none is.

    Example:
        >>> p = distance_weighted_probabilities(labels, tfdml.ops.l2_normalize(f))
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    logits = distance_weighted_log_weights(
        pairwise_distance(embeddings), negative_mask(labels), ops.shape(embeddings)[1], cutoff, nonzero_loss_cutoff
    )
    return ops.softmax(logits, axis=1)


def _sampling_dtype(logits):
    # categorical samplers need float32/64 logits
    return "float64" if backend.standardize_dtype(logits.dtype) == "float64" else "float32"


def _tensorflow_draws(pair_logits, seed):
    """One draw per row of `[P, G]` logits with TensorFlow's (stateless with an integer seed) sampler: the
    TensorFlow backend's draws, unchanged (DML-ALA and the stored test draws rely on them)."""
    import tensorflow as tf

    pair_logits = tf.cast(pair_logits, _sampling_dtype(pair_logits))
    if seed is None:
        return tf.random.categorical(pair_logits, 1, dtype=tf.int32)
    return tf.random.stateless_categorical(pair_logits, 1, seed=[int(seed), 0], dtype=tf.int32)


@defaults_from("MarginLoss")
def sample_distance_weighted_negatives(
    labels, distances, dim, cutoff=DECLARED, nonzero_loss_cutoff=DECLARED, seed=DECLARED, references=None
):
    """Static-shape sampler (every backend but TensorFlow's): `(drawn, keep)`, `[B, G]` int32 and bool.

    `drawn[a, p]` is the negative drawn for the pair `(a, p)` (one independent draw per column, used where
    `keep[a, p]`: `p` a positive of `a` and `a` has a negative). Drawn with `keras.random.categorical`;
    `seed` is an integer (the same draws for the same batch), a `keras.random.SeedGenerator`, or None (Keras'
    global generator). The draws follow the same distribution as TensorFlow's but differ from them.
    """
    positives, negatives = pair_masks(labels, references)
    logits = distance_weighted_log_weights(distances, negatives, dim, cutoff, nonzero_loss_cutoff)
    logits = ops.cast(logits, _sampling_dtype(logits))
    drawn = keras.random.categorical(logits, ops.shape(logits)[1], dtype="int32", seed=seed)
    keep = ops.logical_and(positives, ops.any(negatives, axis=1, keepdims=True))
    return drawn, keep


@defaults_from("MarginLoss")
def sample_distance_weighted_triplets(
    labels, distances, dim, cutoff=DECLARED, nonzero_loss_cutoff=DECLARED, seed=DECLARED, references=None
):
    """One distance-weighted negative per ordered anchor-positive pair.

    With `references` (a `tfdml.ops.References`; `distances` then `[B, G]`) positives and negatives are
    references and the triplets' second and third columns index them. On TensorFlow the draws are
    `tf.random.categorical` (stateless with an integer `seed`); on the other backends
    `sample_distance_weighted_negatives`' (same distribution, other draws).

    Returns:
        `(triplets, valid)`: `[P, 3]` int32 `(anchor, positive, negative)` rows for the `P` ordered positive
        pairs, and a `[P]` bool mask that is false where the anchor has no negative at all.
        With an integer `seed` the draw is stateless (same batch, same triplets).
    """
    positives, negatives = pair_masks(labels, references)
    pairs = pair_indices(positives)
    if backend.backend() == "tensorflow":
        logits = distance_weighted_log_weights(distances, negatives, dim, cutoff, nonzero_loss_cutoff)
        drawn = _tensorflow_draws(ops.take(logits, pairs[:, 0], axis=0), seed)
    else:
        dense, _ = sample_distance_weighted_negatives(
            labels, distances, dim, cutoff, nonzero_loss_cutoff, seed, references
        )
        flat = pairs[:, 0] * ops.shape(dense)[1] + pairs[:, 1]
        drawn = ops.take(ops.reshape(dense, (-1,)), flat)[:, None]
    triplets = ops.concatenate([pairs, ops.cast(drawn, "int32")], axis=1)
    valid = ops.take(ops.any(negatives, axis=1), pairs[:, 0])
    return triplets, valid


@defaults_from("MarginLoss")
def margin_loss_for_triplets(
    labels, embeddings, triplets, beta, alpha=DECLARED, nu=DECLARED, valid=None, distances=None
):
    """Margin loss over explicit `[T, 3]` `(anchor, positive, negative)` index triplets.

    `valid` (`[T]` bool, optional) drops rows; `distances` (optional) are the precomputed
    `pairwise_distance(embeddings)`. Differentiable in `embeddings` and `beta`.
    """
    embeddings = ops.convert_to_tensor(embeddings)
    dtype = embeddings.dtype
    triplets = ops.cast(triplets, "int32")
    distances = pairwise_distance(embeddings) if distances is None else distances
    d_ap, d_an = triplet_distances(distances, triplets)
    beta_a = _beta_per_anchor(beta, ops.take(labels, triplets[:, 0]), dtype) * ops.ones_like(d_ap)
    keep = ops.ones_like(d_ap) if valid is None else ops.cast(valid, dtype)
    return _kept_hinges_loss(d_ap, d_an, beta, beta_a, keep, alpha, nu)


def _kept_hinges_loss(d_ap, d_an, beta, beta_a, keep, alpha, nu):
    """`sum(pos + neg) / (#pos>0 + #neg>0) + R` over the tuples where `keep` (float) is 1."""
    pos, neg = _hinges(d_ap, d_an, beta_a, alpha)
    pos, neg = pos * keep, neg * keep
    active = ops.sum(_active(pos)) + ops.sum(_active(neg))
    loss = safe_divide(ops.sum(pos + neg), active)
    return loss + _regulariser(beta, ops.sum(beta_a * keep), ops.sum(keep), active, nu, d_ap.dtype)


def _margin_loss_sampled_dense(labels, distances, beta, alpha, nu, drawn, keep):
    """The sampled triplets `(a, p, drawn[a, p])` where `keep`, on `[B, G]` (static shapes)."""
    dtype = distances.dtype
    d_an = ops.take_along_axis(distances, drawn, axis=1)
    beta_a = _beta_per_anchor(beta, labels, dtype)
    beta_a = beta_a[:, None] * ops.ones_like(distances) if len(beta_a.shape) == 1 else beta_a * ops.ones_like(distances)
    return _kept_hinges_loss(distances, d_an, beta, beta_a, ops.cast(keep, dtype), alpha, nu)


def _margin_loss_all_triplets(labels, embeddings, beta, alpha, nu, references=None):
    """Every (a, p, n) triplet in O(B^2): pos_ap is repeated once per negative of a, neg_an once per positive."""
    dtype = embeddings.dtype
    distances = pairwise_distance(embeddings, reference_embeddings(references))
    positives, negatives = pair_masks(labels, references)
    positives, negatives = ops.cast(positives, dtype), ops.cast(negatives, dtype)
    num_pos = ops.sum(positives, axis=1, keepdims=True)  # [B, 1] positives per anchor
    num_neg = ops.sum(negatives, axis=1, keepdims=True)
    beta_a = _beta_per_anchor(beta, labels, dtype)
    beta_a = beta_a[:, None] if len(beta_a.shape) == 1 else beta_a
    pos, neg = _hinges(distances, distances, beta_a, alpha)
    pos_weight, neg_weight = positives * num_neg, negatives * num_pos
    active = ops.sum(_active(pos) * pos_weight) + ops.sum(_active(neg) * neg_weight)
    loss = safe_divide(ops.sum(pos * pos_weight) + ops.sum(neg * neg_weight), active)
    triplets_per_anchor = num_pos[:, 0] * num_neg[:, 0]
    beta_rows = beta_a[:, 0] if len(beta_a.shape) == 2 else beta_a * ops.ones_like(triplets_per_anchor)
    beta_sum = ops.sum(beta_rows * triplets_per_anchor)
    return loss + _regulariser(beta, beta_sum, ops.sum(triplets_per_anchor), active, nu, dtype)


def _all_triplet_terms(labels, distances, beta, alpha, nu):
    """Dense `[B, B, B]` terms of every triplet, `pos[a, p] + neg[a, n]` where `triplet_mask`."""
    dtype = distances.dtype
    positives, negatives = pair_masks(labels)
    valid = triplet_mask(positives, negatives)
    beta_a = _beta_per_anchor(beta, labels, dtype)
    beta_a = beta_a[:, None] if len(beta_a.shape) == 1 else beta_a
    pos, neg = _hinges(distances, distances, beta_a, alpha)
    zeros = ops.zeros_like(valid, dtype=dtype)
    values = ops.where(valid, pos[:, :, None] + neg[:, None, :], zeros)
    divisors = ops.where(valid, _active(pos)[:, :, None] + _active(neg)[:, None, :], zeros)
    count = ops.sum(ops.cast(valid, dtype))
    beta_sum = ops.sum(ops.where(valid, (beta_a * ops.ones_like(distances))[:, :, None], zeros))
    extra = _regulariser(beta, beta_sum, count, ops.sum(divisors), nu, dtype)
    return TupleTerms(values, None, "triplet", "divisor", divisors=divisors, extra=extra, valid=valid)


def margin_terms(labels, embeddings, beta, alpha, nu, sampling, cutoff, nonzero_loss_cutoff, seed):
    """The margin loss's terms (the arguments of `margin_loss`, every one given): one per triplet its sampler
    gives (every valid triplet for `"all"`; one distance-weighted negative per ordered anchor-positive pair,
    with `seed` as `margin_loss`), `pos + neg`, reduced by the number of active hinges,
    `#(pos > 0) + #(neg > 0)` (`reduction="divisor"`); the regulariser is the unweighted `extra`.
    `reduce_terms` of them is `margin_loss`. Listed terms (a data-dependent length: eager code and
    TensorFlow graphs)."""
    dtype = embeddings.dtype
    distances = pairwise_distance(embeddings)
    if sampling == "all":
        return _all_triplet_terms(labels, distances, beta, alpha, nu).listed()
    triplets, valid = sample_distance_weighted_triplets(
        labels, distances, ops.shape(embeddings)[1], cutoff, nonzero_loss_cutoff, seed
    )
    (kept,) = ops.nonzero(valid)
    triplets = ops.take(triplets, kept, axis=0)
    d_ap, d_an = triplet_distances(distances, triplets)
    beta_a = _beta_per_anchor(beta, ops.take(labels, triplets[:, 0]), dtype) * ops.ones_like(d_ap)
    pos, neg = _hinges(d_ap, d_an, beta_a, alpha)
    divisors = _active(pos) + _active(neg)
    count = ops.cast(ops.shape(triplets)[0], dtype)
    extra = _regulariser(beta, ops.sum(beta_a), count, ops.sum(divisors), nu, dtype)
    return TupleTerms(pos + neg, triplets, "triplet", "divisor", divisors=divisors, extra=extra)


def _check_class_ids(labels, num_classes, name):
    """Per-class betas need labels in `[0, num_classes)`: TensorFlow's assertions (inside graphs too), a
    check of concrete values on the other backends (skipped while `jax.jit` traces)."""
    too_large = f"{name}: labels must be < num_classes={num_classes} (one beta per class)"
    negative = f"{name}: labels must be >= 0"
    if backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.debugging.assert_less(labels, num_classes, message=too_large)
        tf.debugging.assert_non_negative(labels, message=negative)
        return
    if backend.backend() == "jax":
        import jax

        if isinstance(labels, jax.core.Tracer):
            return
    values = ops.convert_to_numpy(labels)
    if values.size and values.max() >= num_classes:
        raise ValueError(too_large)
    if values.size and values.min() < 0:
        raise ValueError(negative)


def _check_sampling(sampling, cutoff, nonzero_loss_cutoff):
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {SAMPLING_MODES}, got {sampling!r}.")
    if not 0.0 <= cutoff < nonzero_loss_cutoff:
        raise ValueError(
            f"Need 0 <= cutoff < nonzero_loss_cutoff, got cutoff={cutoff}, nonzero_loss_cutoff={nonzero_loss_cutoff}."
        )


def _margin_loss(labels, embeddings, beta, alpha, nu, sampling, cutoff, nonzero_loss_cutoff, seed, references=None):
    """Margin loss on validated inputs (int32 labels, float embeddings); see `margin_loss`."""
    if sampling == "all":
        return _margin_loss_all_triplets(labels, embeddings, beta, alpha, nu, references)
    distances = pairwise_distance(embeddings, reference_embeddings(references))
    dim = ops.shape(embeddings)[1]
    if backend.backend() != "tensorflow":
        drawn, keep = sample_distance_weighted_negatives(
            labels, distances, dim, cutoff, nonzero_loss_cutoff, seed, references
        )
        return _margin_loss_sampled_dense(labels, distances, beta, alpha, nu, drawn, keep)
    triplets, valid = sample_distance_weighted_triplets(
        labels, distances, dim, cutoff, nonzero_loss_cutoff, seed, references
    )
    return margin_loss_for_triplets(labels, embeddings, triplets, beta, alpha, nu, valid, distances)


@defaults_from("MarginLoss")
def margin_loss(
    labels,
    embeddings,
    beta,
    alpha=DECLARED,
    nu=DECLARED,
    sampling=DECLARED,
    cutoff=DECLARED,
    nonzero_loss_cutoff=DECLARED,
    seed=DECLARED,
):
    """Margin loss of Wu et al. 2017 on `labels [B]` int and `embeddings [B, D]`.

    The defaults are those of `MarginLoss`'s declaration (`MarginLoss.ARGUMENTS`).

    Args:
        labels: integer class ids `[B]` (validated: integer dtype, rank 1, same batch size).
        embeddings: float `[B, D]`, normally L2-normalised (NaN/Inf are rejected).
        beta: scalar boundary, or a `[num_classes]` vector (one boundary per class, picked by the anchor).
        alpha: margin around the boundary.
        nu: weight of the `nu * beta` regulariser; added whenever `nu > 0` (`MarginLoss` adds it only
            for a learned beta).
        sampling: `"distance_weighted"` (one negative per anchor-positive pair, drawn with probability
            ~ `1 / q(d)`, see `distance_weighted_probabilities`) or `"all"`.
        cutoff, nonzero_loss_cutoff: distance-weighted sampler bounds.
        seed: integer for a reproducible (stateless) draw; `None` draws fresh negatives every call.

    Returns:
        Scalar loss; 0 when no triplet term is active.

    Example:
        >>> loss = margin_loss(labels, tfdml.ops.l2_normalize(f), beta=1.2, sampling="all")
    """
    _check_sampling(sampling, cutoff, nonzero_loss_cutoff)
    labels, embeddings = validate_inputs(labels, embeddings)
    return _margin_loss(labels, embeddings, beta, alpha, nu, sampling, cutoff, nonzero_loss_cutoff, seed)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class MarginLoss(MetricLoss):
    """Margin loss (Wu et al. 2017) with a learnable boundary `beta`.

    `pos = [d_ap - beta + alpha]+`, `neg = [beta - d_an + alpha]+`,
    `L = sum(pos + neg) / (#pos>0 + #neg>0) + nu * beta` (per-class betas: the regulariser is
    `nu * sum_triplets beta_{y_a} / (#pos>0 + #neg>0)`; see `tfdml.losses.margin`). The regulariser applies
    only to a learned beta (`learn_beta=True`), as in the official code; with a constant beta `nu` is ignored.

    The default sampler draws one negative per anchor-positive pair with probability ~ `1 / q(d_an)` (inverse
    density of distances on the unit sphere, Wu et al.): it favours the nearer, harder negatives.

    Backends: TensorFlow, JAX and PyTorch (written in `keras.ops`). The distance-weighted draws are
    TensorFlow's `tf.random` on TensorFlow and `keras.random.categorical` on the other backends: the same
    distribution, different draws (an integer `seed` repeats the draws of one backend, not across backends).
    `"all"` is deterministic and equal on every backend.

    beta is a variable of the loss. `tfdml.models.MetricModel.compile` makes it part of the model (trained by
    its own optimizer, saved, checkpointed); under a plain `keras.Model` it is not tracked and stays at its
    initial value.

    Args (defaults, ranges and choices in `ARGUMENTS`, also the configuration's `loss.params`):
        alpha: margin.
        beta: initial boundary.
        nu: regulariser weight on a learned beta (no effect with `learn_beta=False`).
        num_classes: if given, one beta per training class (official code), chosen by the anchor's class;
            labels must then lie in `[0, num_classes)`.
        learn_beta: make beta a trainable variable (`trainable_variables`), else a constant.
        beta_learning_rate: learning rate of beta's own optimizer, `variable_optimizer` =
            SGD(beta_learning_rate, momentum=0.9) as in the official code. `tfdml.models.MetricModel`
            tracks beta (checkpoints, `model.save`) and routes it to that optimizer, whatever optimizer
            trains the network.
        sampling: `"distance_weighted"` (one negative per anchor-positive pair drawn ~ `1 / q(d)`, see
            `distance_weighted_probabilities`) or `"all"` (every triplet, deterministic).
        cutoff, nonzero_loss_cutoff: bounds of the distance-weighted sampler.
        seed: integer for a stateless, reproducible draw (tests); `None` for fresh negatives every step.

    Example:
        >>> inputs = keras.Input((4,))
        >>> model = tfdml.models.MetricModel(inputs, keras.layers.UnitNormalization()(keras.layers.Dense(8)(inputs)))
        >>> model.compile(optimizer="adam", loss=MarginLoss(num_classes=3))  # one beta per class
        >>> x, y = np.random.default_rng(0).random((12, 4)), np.repeat(np.arange(3), 4)
        >>> history = model.fit(x, y, batch_size=6, verbose=0)  # trains beta with SGD(0.1, momentum 0.9)
        >>> tuple(model.loss.beta.shape)
        (3,)
    """

    DEFAULT_NAME = "margin_loss"
    ARGUMENTS = (
        Argument("alpha", 0.2, "margin around the boundary", minimum=0.0, maximum=1e4),
        Argument("beta", 1.2, "initial boundary", minimum=0.0, maximum=1e4, attribute="initial_beta"),
        Argument("nu", 0.0, "regulariser weight on a learned beta", minimum=0.0, maximum=1e4),
        Argument("num_classes", None, "one beta per class (None: one beta)", minimum=1, maximum=10**9),
        Argument("learn_beta", True, "beta is a trainable variable"),
        Argument("beta_learning_rate", 0.1, "learning rate of beta's SGD", above=0.0, maximum=100.0),
        Argument("sampling", "distance_weighted", "which triplets", choices=SAMPLING_MODES),
        Argument("cutoff", 0.5, "sampler's lower distance clip", minimum=0.0, maximum=4.0),
        Argument("nonzero_loss_cutoff", 1.4, "sampler's upper distance bound", minimum=0.0, maximum=4.0),
        Argument("seed", None, "stateless draw seed (None: fresh draws)"),
    )

    def setup(self):
        _check_sampling(self.sampling, self.cutoff, self.nonzero_loss_cutoff)
        self.num_classes = None if self.num_classes is None else int(self.num_classes)
        self._beta = None
        self._optimizer = None
        self._seed_generator = None
        if backend.backend() != "tensorflow":
            # Keras' JAX trainer traces the step in a stateless scope, where no variable may be created: the
            # loss's variables exist from the start (on TensorFlow on first use, for `tf.distribute` scopes).
            self.beta  # noqa: B018
            self._draw_seed()

    @property
    def beta(self):
        """The boundary: a variable if `learn_beta`, else a constant (created on first use, so that a
        loss built inside a `tf.distribute` scope gets a mirrored variable)."""
        if self._beta is None:
            shape = () if self.num_classes is None else (self.num_classes,)
            value = np.full(shape, self.initial_beta, dtype="float64")
            if self.learn_beta:
                self._beta = keras.Variable(
                    value.astype("float32"), trainable=True, dtype="float32", name="margin_beta"
                )
            else:
                self._beta = value  # cast to the embedding dtype at use
        return self._beta

    @property
    def trainable_variables(self):
        return [self.beta] if self.learn_beta else []

    @property
    def non_trainable_variables(self):
        """The state of the sampler's `keras.random.SeedGenerator` (backends other than TensorFlow, without
        an integer `seed`): `tfdml.models.MetricModel` carries it through Keras' stateless JAX step, so that
        every step draws fresh negatives (a plain `keras.Model` does not track it: on JAX its steps then
        repeat the same draws for the same batch)."""
        return [] if self._seed_generator is None else [self._seed_generator.state]

    @property
    def variable_optimizer(self):
        if not self.learn_beta:
            return None
        if self._optimizer is None:
            self._optimizer = keras.optimizers.SGD(self.beta_learning_rate, momentum=0.9, name="margin_beta_sgd")
        return self._optimizer

    # `terms` lists triplets (`tfdml.ops.TupleTerms.kind`).
    tuple_kind = TUPLE_KINDS["margin"]
    supports_references = True

    def _beta_and_nu(self, labels):
        beta = self.beta
        beta = beta.value if isinstance(beta, keras.Variable) else beta
        if self.num_classes is not None:
            _check_class_ids(labels, self.num_classes, self.name)
        # The official code (and pytorch-metric-learning) regularises beta only when it is learned.
        return beta, (self.nu if self.learn_beta else 0.0)

    def _draw_seed(self):
        """The sampler's seed: the integer `seed`; else on TensorFlow None (fresh `tf.random` draws), on the
        other backends the loss's own `keras.random.SeedGenerator`."""
        if self.seed is not None or backend.backend() == "tensorflow":
            return self.seed
        if self._seed_generator is None:
            self._seed_generator = keras.random.SeedGenerator(name="margin_sampler_seed")
        return self._seed_generator

    def _call_arguments(self, labels):
        """`(beta, alpha, nu, sampling, cutoff, nonzero_loss_cutoff, seed)` of one call, as `margin_loss` takes
        them (the seed drawn for this call)."""
        beta, nu = self._beta_and_nu(labels)
        return beta, self.alpha, nu, self.sampling, self.cutoff, self.nonzero_loss_cutoff, self._draw_seed()

    def compute(self, labels, embeddings, references=None):
        return _margin_loss(labels, embeddings, *self._call_arguments(labels), references)

    def dense_terms(self, labels, embeddings):
        """The dense `[B, B, B]` terms of every triplet (`sampling="all"`; the distance-weighted sampler's
        terms are listed only, by `terms`)."""
        if self.sampling != "all":
            raise ValueError(f'{self.name}: dense terms need sampling="all", got sampling={self.sampling!r}.')
        beta, nu = self._beta_and_nu(labels)
        return _all_triplet_terms(labels, pairwise_distance(embeddings), beta, self.alpha, nu)

    def terms(self, labels, embeddings):
        """The unreduced triplet terms (`margin_terms`); `tfdml.ops.reduce_terms` gives `compute`'s value
        (for the same draw: a `seed`, or `"all"`)."""
        return margin_terms(labels, embeddings, *self._call_arguments(labels))
