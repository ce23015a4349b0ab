"""Triplet losses: `TripletLoss` with all / batch-hard / semi-hard mining, and drop-in replacements for
tensorflow-addons' `TripletSemiHardLoss` and `TripletHardLoss`.

A triplet `(a, p, n)` has `y_p == y_a`, `p != a` and `y_n != y_a`; its hinge loss is
`[m + d_ap - d_an]+` (or the soft margin `log(1 + exp(d_ap - d_an))`).

No `[B, B, B]` tensor is ever built (at B = 1024 it would hold 1e9 entries). The triplet sums run in
"positive slots": slot `k` pairs every anchor with its k-th positive, so one `[B, B]` pass covers the
triplets `(a, p_k(a), n)` of all anchors and negatives at once. A batch with K samples per class needs
K - 1 passes: O(K B^2) time, O(B^2) memory. The exact (sub)gradient of the sum is accumulated in the same
passes (each active triplet adds `+dterm` to `d_ap` and `-dterm` to `d_an`) and handed to autodiff with
`tf.custom_gradient`, so backprop stores nothing per slot. Everything is matmul-free elementwise work and
row reductions that XLA fuses into one loop.
"""

import keras
import tensorflow as tf

from tfdml.losses.base import MetricLoss
from tfdml.ops import (
    TupleTerms,
    as_scalar,
    masked_max,
    masked_mean,
    masked_min,
    negative_mask,
    pair_masks,
    pairwise_angular_distance,
    pairwise_distance,
    positive_mask,
    reference_embeddings,
    safe_divide,
    triplet_distances,
    triplet_indices,
    validate_inputs,
)

MINING_STRATEGIES = ("all", "hard", "semi_hard")


def _positive_slots(pos):
    """`rank[a, j]`: index of positive `j` among anchor `a`'s positives (slot k = every anchor's k-th
    positive), and the number of slots (the most positives any anchor has)."""
    pos_int = tf.cast(pos, tf.int32)
    rank = tf.cumsum(pos_int, axis=1, exclusive=True)
    return rank, tf.reduce_max(tf.reduce_sum(pos_int, axis=1))


def _triplet_sums(dist, pos, neg, margin, semi_hard, soft):
    """`(sum of the triplet terms, number of triplets counted)` over all (or the semi-hard) triplets.

    Hinge terms `m + d_ap - d_an` count where positive; soft terms `log(1 + exp(d_ap - d_an))` always.
    Semi-hard triplets are those with `d_ap < d_an < d_ap + m`. One `[B, B]` pass per positive slot (the
    k-th positive of every anchor at once), so memory stays O(B^2); the exact gradient is accumulated in
    the same pass instead of being stored per slot for backprop.
    """
    dtype = dist.dtype
    margin = as_scalar(margin, dtype)
    rank, num_slots = _positive_slots(pos)
    zero = tf.zeros([], dtype)

    slot_rank = tf.where(pos, rank, -tf.ones_like(rank))  # slot k of anchor a: slot_rank[a] == k
    infinity = tf.constant(float("inf"), dtype)

    @tf.custom_gradient
    def sums(dist):
        # Non-negatives at +inf never satisfy d_an < d_ap + m; anchors without a k-th positive get a -inf
        # threshold. Hinges are then -inf (never NaN) wherever a triplet does not exist.
        neg_dist = tf.where(neg, dist, infinity)

        def slot_step(k, total, count, grad):
            slot = tf.cast(tf.equal(slot_rank, k), dtype)
            anchor_pos = tf.reduce_sum(slot * dist, axis=1, keepdims=True)  # d_ap of the k-th positive
            has_slot = tf.reduce_max(slot, axis=1, keepdims=True) > 0
            if soft:
                gap = anchor_pos - dist  # gap[a, n] = d_ap - d_an
                valid = tf.logical_and(neg, has_slot)
                if semi_hard:
                    valid = tf.logical_and(valid, tf.logical_and(gap < 0, gap > -margin))
                active = tf.cast(valid, dtype)
                terms = tf.nn.softplus(gap) * active
                slope = tf.sigmoid(gap) * active
            else:
                hinge = tf.where(has_slot, anchor_pos + margin, -infinity) - neg_dist
                valid = hinge > 0
                if semi_hard:
                    valid = tf.logical_and(valid, hinge < margin)  # d_an > d_ap
                active = tf.cast(valid, dtype)
                terms = tf.where(valid, hinge, tf.zeros_like(hinge))
                slope = active
            # d total / d d_ap = sum_n slope[a, n]; d total / d d_an = -slope[a, n].
            row_slope = tf.reduce_sum(slope, axis=1, keepdims=True)
            grad = grad + slot * row_slope - slope
            return k + 1, total + tf.reduce_sum(terms), count + tf.reduce_sum(active), grad

        _, total, count, grad_dist = tf.while_loop(
            lambda k, *_: k < num_slots, slot_step, (tf.constant(0, tf.int32), zero, zero, tf.zeros_like(dist))
        )

        def grad(d_total, d_count):
            del d_count  # a count: piecewise constant
            return d_total * grad_dist

        return (total, count), grad

    return sums(dist)


def _check_mining(mining):
    if mining not in MINING_STRATEGIES:
        raise ValueError(f"mining must be one of {MINING_STRATEGIES}, got {mining!r}.")


def _triplet_loss(labels, embeddings, margin, mining, soft, squared, references=None):
    dist = pairwise_distance(embeddings, reference_embeddings(references), squared=squared)
    pos, neg = pair_masks(labels, references)
    if mining == "hard":
        hardest_pos = masked_max(dist, pos, axis=1)
        hardest_neg = masked_min(dist, neg, axis=1)
        gap = hardest_pos - hardest_neg
        terms = tf.nn.softplus(gap) if soft else tf.nn.relu(gap + as_scalar(margin, dist.dtype))
        has_both = tf.logical_and(tf.reduce_any(pos, axis=1), tf.reduce_any(neg, axis=1))
        return masked_mean(terms, has_both)
    total, num_active = _triplet_sums(dist, pos, neg, margin, semi_hard=(mining == "semi_hard"), soft=soft)
    return safe_divide(total, num_active)


def triplet_terms(labels, embeddings, margin=0.2, mining="all", soft=False, squared=False):
    """The triplet loss's terms, the triplets its mining defines, as `(anchor, positive, negative)` rows:

    - `"all"`: every valid triplet; hinge terms reduced by their mean over the non-zero ones, soft terms by
      their mean over all.
    - `"semi_hard"`: the triplets with `d_ap < d_an < d_ap + m` at these embeddings; their mean.
    - `"hard"`: per anchor with a positive and a negative, `(a, farthest positive, nearest negative)`; their
      mean.

    Lists the `B (K - 1) (B - K)` triplets of a `B`-sample batch (K per class) for `"all"` and `"semi_hard"`:
    for the modest batches that weighted tuples need. `reduce_terms` of them is `triplet_loss`.
    """
    dist = pairwise_distance(embeddings, squared=squared)
    if mining == "hard":
        pos, neg = positive_mask(labels), negative_mask(labels)
        anchors = tf.where(tf.logical_and(tf.reduce_any(pos, axis=1), tf.reduce_any(neg, axis=1)))[:, 0]
        anchors = tf.cast(anchors, tf.int32)
        constant = tf.stop_gradient(dist)
        far_pos = tf.argmax(tf.where(pos, constant, -tf.ones_like(constant)), axis=1, output_type=tf.int32)
        beyond = tf.reduce_max(constant) + tf.ones_like(constant)
        near_neg = tf.argmin(tf.where(neg, constant, beyond), axis=1, output_type=tf.int32)
        triplets = tf.stack([anchors, tf.gather(far_pos, anchors), tf.gather(near_neg, anchors)], axis=1)
    else:
        triplets = triplet_indices(labels)
    d_ap, d_an = triplet_distances(dist, triplets)
    gap = d_ap - d_an
    margin = as_scalar(margin, dist.dtype)
    if mining == "semi_hard":
        keep = tf.where(tf.logical_and(gap < 0, gap > -margin))[:, 0]
        triplets, gap = tf.gather(triplets, keep), tf.gather(gap, keep)
    values = tf.nn.softplus(gap) if soft else tf.nn.relu(gap + margin)
    reduction = "mean_active" if mining == "all" and not soft else "mean"
    return TupleTerms(values, triplets, "triplet", reduction)


def triplet_loss(labels, embeddings, margin=0.2, mining="all", soft=False, squared=False):
    """Triplet loss of a batch with the given mining.

    - `"all"`: every triplet `(a, p, n)`; mean of `[m + d_ap - d_an]+` over the triplets where it is
      positive (0 if none).
    - `"hard"`: batch-hard; per anchor its farthest positive and nearest negative; mean over the anchors
      that have both.
    - `"semi_hard"` (FaceNet): the triplets with `d_ap < d_an < d_ap + m`; mean over them (0 if none).

    Args:
        labels: integer class ids `[B]`.
        embeddings: float `[B, D]`.
        margin: `m`.
        mining: `"all"`, `"hard"` or `"semi_hard"`.
        soft: use the soft margin `log(1 + exp(d_ap - d_an))` instead of the hinge (the margin then only
            delimits semi-hard triplets; with `"all"` the mean runs over every triplet).
        squared: use squared Euclidean distances.

    Returns:
        Scalar loss.
    """
    _check_mining(mining)
    labels, embeddings = validate_inputs(labels, embeddings)
    return _triplet_loss(labels, embeddings, margin, mining, soft, squared)


@keras.saving.register_keras_serializable(package="tfdml")
class TripletLoss(MetricLoss):
    """Triplet loss `[m + d_ap - d_an]+` with `"all"`, `"hard"` or `"semi_hard"` mining.

    See `triplet_loss` for the exact reductions. `"all"` runs in O(B^2) memory (no `[B, B, B]` tensor).

    Args:
        margin: `m` (default 0.2).
        mining: `"all"` (default), `"hard"` or `"semi_hard"`.
        soft: soft margin `log(1 + exp(d_ap - d_an))`.
        squared: squared Euclidean distances.
        name: loss name.

    Example:
        >>> loss = TripletLoss(margin=0.2, mining="semi_hard")
        >>> model.compile(optimizer="adam", loss=loss)
    """

    def __init__(self, margin=0.2, mining="all", soft=False, squared=False, name="triplet_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        _check_mining(mining)
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}.")
        self.margin = float(margin)
        self.mining = mining
        self.soft = bool(soft)
        self.squared = bool(squared)

    # `terms` lists triplets (`tfdml.ops.TupleTerms.kind`).
    tuple_kind = "triplet"
    supports_references = True

    def compute(self, labels, embeddings, references=None):
        return _triplet_loss(labels, embeddings, self.margin, self.mining, self.soft, self.squared, references)

    def terms(self, labels, embeddings):
        """The unreduced triplet terms (`triplet_terms`); `tfdml.ops.reduce_terms` gives `compute`'s value."""
        return triplet_terms(labels, embeddings, self.margin, self.mining, self.soft, self.squared)

    def get_config(self):
        config = super().get_config()
        config.update(margin=self.margin, mining=self.mining, soft=self.soft, squared=self.squared)
        return config


# ------------------------------------------------------------------------------ tensorflow-addons drop-ins

TFA_DISTANCE_METRICS = ("L2", "squared-L2", "angular")


def _check_distance_metric(distance_metric):
    if not (callable(distance_metric) or distance_metric in TFA_DISTANCE_METRICS):
        raise ValueError(
            f"distance_metric must be one of {TFA_DISTANCE_METRICS} or a callable returning a "
            f"[B, B] distance matrix, got {distance_metric!r}."
        )


def _tfa_distances(embeddings, distance_metric):
    """tensorflow-addons' `pdist_matrix`: Euclidean ("L2"), squared Euclidean, `1 - cos` ("angular"), or
    `distance_metric(embeddings)` for a callable (any `[B, B]` matrix; smaller means closer)."""
    if distance_metric == "L2":
        return pairwise_distance(embeddings)
    if distance_metric == "squared-L2":
        return pairwise_distance(embeddings, squared=True)
    if distance_metric == "angular":
        return pairwise_angular_distance(embeddings)
    return tf.cast(tf.convert_to_tensor(distance_metric(embeddings)), embeddings.dtype)


def _as_input_dtype(value, y_pred):
    """tensorflow-addons computes float16/bfloat16 input in float32 and returns the input dtype."""
    dtype = getattr(y_pred, "dtype", None)
    if dtype is None:
        return value
    dtype = tf.as_dtype(dtype)
    return tf.cast(value, dtype) if dtype.is_floating and dtype != value.dtype else value


def _no_positive_pair_gives_zero(loss, pos):
    return tf.where(tf.reduce_any(pos), loss, tf.zeros_like(loss))


def _split_ties(mask, dist, value):
    """One-hot (ties share equally) of the entries of `mask` where `dist` equals the row's `value`."""
    hit = tf.cast(tf.logical_and(mask, tf.equal(dist, value)), dist.dtype)
    return safe_divide(hit, tf.reduce_sum(hit, axis=1, keepdims=True))


def _row_min_where_empty(masked_value, mask, dist):
    """tensorflow-addons' masked max/min of a row with no entry in `mask` is the row's minimum of `dist`."""
    return tf.where(
        tf.reduce_any(mask, axis=1, keepdims=True), masked_value, tf.reduce_min(dist, axis=1, keepdims=True)
    )


def _semihard_negative_sums(dist, pos, neg, margin):
    """Sum over all positive pairs of tfa's semi-hard term `[m + d_ap - d_an*]+`, one pass per positive slot.

    `d_an*` is the smallest `d_an > d_ap`, else the largest `d_an`, else (no negative) the row's minimum
    distance, as tfa. Gradient accumulated in the same pass (ties of `d_an*` share it, like `reduce_min`'s
    gradient).
    """
    dtype = dist.dtype
    margin = as_scalar(margin, dtype)
    rank, num_slots = _positive_slots(pos)
    farthest = _row_min_where_empty(masked_max(dist, neg, axis=1, keepdims=True), neg, dist)
    fallback = tf.where(tf.reduce_any(neg, axis=1, keepdims=True), neg, tf.ones_like(neg))
    zero = tf.zeros([], dtype)

    @tf.custom_gradient
    def total_of(dist):
        def slot_step(k, total, grad):
            slot = tf.cast(tf.logical_and(pos, tf.equal(rank, k)), dtype)
            has_slot = tf.reduce_sum(slot, axis=1, keepdims=True)
            anchor_pos = tf.reduce_sum(slot * dist, axis=1, keepdims=True)
            farther = tf.logical_and(neg, dist > anchor_pos)
            has_farther = tf.reduce_any(farther, axis=1, keepdims=True)
            nearest_farther = masked_min(dist, farther, axis=1, keepdims=True)
            neg_dist = tf.where(has_farther, nearest_farther, farthest)
            chosen = tf.where(
                has_farther, _split_ties(farther, dist, nearest_farther), _split_ties(fallback, dist, farthest)
            )
            active = tf.cast(margin + anchor_pos - neg_dist > 0, dtype) * has_slot
            total = total + tf.reduce_sum(active * (margin + anchor_pos - neg_dist))
            return k + 1, total, grad + active * (slot - chosen)

        _, total, grad_dist = tf.while_loop(
            lambda k, *_: k < num_slots, slot_step, (tf.constant(0, tf.int32), zero, tf.zeros_like(dist))
        )
        return total, lambda d_total: d_total * grad_dist

    return total_of(dist)


def _triplet_semihard_loss(labels, embeddings, margin, distance_metric="L2"):
    dist = _tfa_distances(embeddings, distance_metric)
    pos = positive_mask(labels)
    total = _semihard_negative_sums(dist, pos, negative_mask(labels), margin)
    return safe_divide(total, tf.reduce_sum(tf.cast(pos, dist.dtype)))


def triplet_semihard_loss(labels, embeddings, margin=1.0, distance_metric="L2"):
    """tensorflow-addons' semi-hard triplet loss (its `triplet_semihard_loss`).

    For every ordered positive pair `(a, p)` the negative is the nearest one farther than `p`
    (`min d_an > d_ap`), else the farthest negative; the loss is the mean over all positive pairs of
    `[margin + d_ap - d_an]+`. A batch without positive pairs gives 0 (tfa gave NaN).

    Args:
        distance_metric: as tfa: `"L2"` (Euclidean, default), `"squared-L2"`, `"angular"` (`1 - cos`, clipped
            at 0) or a callable mapping the `[B, D]` embeddings to a `[B, B]` distance matrix.

    Returns:
        Scalar in the input dtype (float16/bfloat16 inputs are computed in float32, as tfa).
    """
    _check_distance_metric(distance_metric)
    validated_labels, validated = validate_inputs(labels, embeddings)
    value = _triplet_semihard_loss(validated_labels, validated, margin, distance_metric)
    return _as_input_dtype(value, embeddings)


def _triplet_hard_loss(labels, embeddings, margin, soft, distance_metric="L2"):
    dist = _tfa_distances(embeddings, distance_metric)
    pos = positive_mask(labels)
    neg = negative_mask(labels)
    # As tfa: an anchor without positive uses its row minimum (0 for "L2"), one without negative its row maximum.
    hardest_pos = _row_min_where_empty(masked_max(dist, pos, axis=1, keepdims=True), pos, dist)[:, 0]
    hardest_neg = tf.where(tf.reduce_any(neg, axis=1), masked_min(dist, neg, axis=1), tf.reduce_max(dist, axis=1))
    gap = hardest_pos - hardest_neg
    terms = tf.nn.softplus(gap) if soft else tf.nn.relu(gap + as_scalar(margin, dist.dtype))
    return _no_positive_pair_gives_zero(tf.reduce_mean(terms), pos)


def triplet_hard_loss(labels, embeddings, margin=1.0, soft=False, distance_metric="L2"):
    """tensorflow-addons' batch-hard triplet loss (its `triplet_hard_loss`).

    Mean over all anchors of `[hardest_pos - hardest_neg + margin]+` (soft: `log(1 + exp(hardest_pos -
    hardest_neg))`); an anchor without positive uses its smallest distance (0 for `"L2"`) as `hardest_pos`.
    A batch without positive pairs gives 0.

    Args:
        distance_metric: `"L2"` (default), `"squared-L2"`, `"angular"` or a callable, as in
            `triplet_semihard_loss`.

    Returns:
        Scalar in the input dtype (float16/bfloat16 inputs are computed in float32, as tfa).
    """
    _check_distance_metric(distance_metric)
    validated_labels, validated = validate_inputs(labels, embeddings)
    return _as_input_dtype(_triplet_hard_loss(validated_labels, validated, margin, soft, distance_metric), embeddings)


class _TfaDropIn(MetricLoss):
    """Base of the tensorflow-addons drop-ins: tfa's `distance_metric` and tfa's output dtype."""

    def __init__(self, distance_metric="L2", **kwargs):
        super().__init__(**kwargs)
        if isinstance(distance_metric, dict):
            distance_metric = keras.saving.deserialize_keras_object(distance_metric)
        _check_distance_metric(distance_metric)
        self.distance_metric = distance_metric

    def __call__(self, y_true, y_pred, sample_weight=None):
        return _as_input_dtype(super().__call__(y_true, y_pred, sample_weight), y_pred)

    def get_config(self):
        config = super().get_config()
        metric = self.distance_metric
        config.update(
            distance_metric=metric if isinstance(metric, str) else keras.saving.serialize_keras_object(metric)
        )
        return config


@keras.saving.register_keras_serializable(package="tfdml")
class TripletSemiHardLoss(_TfaDropIn):
    """Drop-in replacement for `tfa.losses.TripletSemiHardLoss` (see `triplet_semihard_loss`).

    `L = mean_{(a, p)} [margin + d_ap - d_an*]+` with `d_an*` the smallest `d_an > d_ap`, else the largest.
    Returns the input dtype (float16 in, float16 out), as tfa.

    Args:
        margin: default 1.0, as in tfa.
        distance_metric: `"L2"` (default), `"squared-L2"`, `"angular"` or a callable `[B, D] -> [B, B]`, as
            in tfa (a callable must be registered with `keras.saving.register_keras_serializable` to be saved).
        name: loss name.

    Example:
        >>> model.compile(optimizer="adam", loss=TripletSemiHardLoss())  # was tfa.losses.TripletSemiHardLoss()
    """

    def __init__(self, margin=1.0, distance_metric="L2", name="triplet_semihard_loss", **kwargs):
        super().__init__(distance_metric=distance_metric, name=name, **kwargs)
        self.margin = float(margin)

    def compute(self, labels, embeddings):
        return _triplet_semihard_loss(labels, embeddings, self.margin, self.distance_metric)

    def get_config(self):
        config = super().get_config()
        config.update(margin=self.margin)
        return config


@keras.saving.register_keras_serializable(package="tfdml")
class TripletHardLoss(_TfaDropIn):
    """Drop-in replacement for `tfa.losses.TripletHardLoss` (see `triplet_hard_loss`).

    `L = mean_a [max_p d_ap - min_n d_an + margin]+`, or `log(1 + exp(max_p d_ap - min_n d_an))` if `soft`.
    Returns the input dtype (float16 in, float16 out), as tfa.

    Args:
        margin: default 1.0, as in tfa.
        soft: soft margin instead of the hinge.
        distance_metric: `"L2"` (default), `"squared-L2"`, `"angular"` or a callable, as in tfa.
        name: loss name.

    Example:
        >>> model.compile(optimizer="adam", loss=TripletHardLoss(margin=1.0))
    """

    def __init__(self, margin=1.0, soft=False, distance_metric="L2", name="triplet_hard_loss", **kwargs):
        super().__init__(distance_metric=distance_metric, name=name, **kwargs)
        self.margin = float(margin)
        self.soft = bool(soft)

    def compute(self, labels, embeddings):
        return _triplet_hard_loss(labels, embeddings, self.margin, self.soft, self.distance_metric)

    def get_config(self):
        config = super().get_config()
        config.update(margin=self.margin, soft=self.soft)
        return config
