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
from tfdml.ops import (as_scalar, masked_max, masked_mean, masked_min, negative_mask,
                       pairwise_distance, positive_mask, safe_divide, validate_inputs)

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
            lambda k, *_: k < num_slots, slot_step,
            (tf.constant(0, tf.int32), zero, zero, tf.zeros_like(dist)))

        def grad(d_total, d_count):
            del d_count  # a count: piecewise constant
            return d_total * grad_dist

        return (total, count), grad

    return sums(dist)


def _distances(embeddings, squared):
    return pairwise_distance(embeddings, squared=squared)


def _check_mining(mining):
    if mining not in MINING_STRATEGIES:
        raise ValueError(f"mining must be one of {MINING_STRATEGIES}, got {mining!r}.")


def _triplet_loss(labels, embeddings, margin, mining, soft, squared):
    dist = _distances(embeddings, squared)
    pos = positive_mask(labels)
    neg = negative_mask(labels)
    if mining == "hard":
        hardest_pos = masked_max(dist, pos, axis=1)
        hardest_neg = masked_min(dist, neg, axis=1)
        gap = hardest_pos - hardest_neg
        terms = tf.nn.softplus(gap) if soft else tf.nn.relu(gap + as_scalar(margin, dist.dtype))
        has_both = tf.logical_and(tf.reduce_any(pos, axis=1), tf.reduce_any(neg, axis=1))
        return masked_mean(terms, has_both)
    total, num_active = _triplet_sums(dist, pos, neg, margin, semi_hard=(mining == "semi_hard"), soft=soft)
    return safe_divide(total, num_active)


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

    def compute(self, labels, embeddings):
        return _triplet_loss(labels, embeddings, self.margin, self.mining, self.soft, self.squared)

    def get_config(self):
        config = super().get_config()
        config.update(margin=self.margin, mining=self.mining, soft=self.soft, squared=self.squared)
        return config


def _no_positive_pair_gives_zero(loss, pos):
    return tf.where(tf.reduce_any(pos), loss, tf.zeros_like(loss))


def _split_ties(mask, dist, value):
    """One-hot (ties share equally) of the entries of `mask` where `dist` equals the row's `value`."""
    hit = tf.cast(tf.logical_and(mask, tf.equal(dist, value)), dist.dtype)
    return safe_divide(hit, tf.reduce_sum(hit, axis=1, keepdims=True))


def _semihard_negative_sums(dist, pos, neg, margin):
    """Sum over all positive pairs of tfa's semi-hard term `[m + d_ap - d_an*]+`, one pass per positive slot.

    `d_an*` is the smallest `d_an > d_ap`, else the largest `d_an`, else 0 (no negative, as tfa). Gradient
    accumulated in the same pass (ties of `d_an*` share it, like `reduce_min`'s gradient).
    """
    dtype = dist.dtype
    margin = as_scalar(margin, dtype)
    rank, num_slots = _positive_slots(pos)
    farthest = masked_max(dist, neg, axis=1, keepdims=True)
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
            chosen = tf.where(has_farther, _split_ties(farther, dist, nearest_farther),
                              _split_ties(neg, dist, farthest))
            active = tf.cast(margin + anchor_pos - neg_dist > 0, dtype) * has_slot
            total = total + tf.reduce_sum(active * (margin + anchor_pos - neg_dist))
            return k + 1, total, grad + active * (slot - chosen)

        _, total, grad_dist = tf.while_loop(lambda k, *_: k < num_slots, slot_step,
                                            (tf.constant(0, tf.int32), zero, tf.zeros_like(dist)))
        return total, lambda d_total: d_total * grad_dist

    return total_of(dist)


def _triplet_semihard_loss(labels, embeddings, margin):
    dist = pairwise_distance(embeddings)
    pos = positive_mask(labels)
    total = _semihard_negative_sums(dist, pos, negative_mask(labels), margin)
    return safe_divide(total, tf.reduce_sum(tf.cast(pos, dist.dtype)))


def triplet_semihard_loss(labels, embeddings, margin=1.0):
    """tensorflow-addons' semi-hard triplet loss (its `triplet_semihard_loss`, Euclidean distances).

    For every ordered positive pair `(a, p)` the negative is the nearest one farther than `p`
    (`min d_an > d_ap`), else the farthest negative; the loss is the mean over all positive pairs of
    `[margin + d_ap - d_an]+`. A batch without positive pairs gives 0 (tfa gave NaN).
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _triplet_semihard_loss(labels, embeddings, margin)


def _triplet_hard_loss(labels, embeddings, margin, soft):
    dist = pairwise_distance(embeddings)
    pos = positive_mask(labels)
    neg = negative_mask(labels)
    # As in tfa: an anchor without positive uses hardest_pos = 0, one without negative uses its row maximum.
    hardest_pos = masked_max(dist, pos, axis=1)
    hardest_neg = tf.where(tf.reduce_any(neg, axis=1), masked_min(dist, neg, axis=1),
                           tf.reduce_max(dist, axis=1))
    gap = hardest_pos - hardest_neg
    terms = tf.nn.softplus(gap) if soft else tf.nn.relu(gap + as_scalar(margin, dist.dtype))
    return _no_positive_pair_gives_zero(tf.reduce_mean(terms), pos)


def triplet_hard_loss(labels, embeddings, margin=1.0, soft=False):
    """tensorflow-addons' batch-hard triplet loss (its `triplet_hard_loss`, Euclidean distances).

    Mean over all anchors of `[hardest_pos - hardest_neg + margin]+` (soft: `log(1 + exp(hardest_pos -
    hardest_neg))`); an anchor without positive uses `hardest_pos = 0`. A batch without positive pairs
    gives 0.
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _triplet_hard_loss(labels, embeddings, margin, soft)


@keras.saving.register_keras_serializable(package="tfdml")
class TripletSemiHardLoss(MetricLoss):
    """Drop-in replacement for `tfa.losses.TripletSemiHardLoss` (see `triplet_semihard_loss`).

    `L = mean_{(a, p)} [margin + d_ap - d_an*]+` with `d_an*` the smallest `d_an > d_ap`, else the largest.

    Args:
        margin: default 1.0, as in tfa.
        name: loss name.

    Example:
        >>> model.compile(optimizer="adam", loss=TripletSemiHardLoss())  # was tfa.losses.TripletSemiHardLoss()
    """

    def __init__(self, margin=1.0, name="triplet_semihard_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.margin = float(margin)

    def compute(self, labels, embeddings):
        return _triplet_semihard_loss(labels, embeddings, self.margin)

    def get_config(self):
        config = super().get_config()
        config.update(margin=self.margin)
        return config


@keras.saving.register_keras_serializable(package="tfdml")
class TripletHardLoss(MetricLoss):
    """Drop-in replacement for `tfa.losses.TripletHardLoss` (see `triplet_hard_loss`).

    `L = mean_a [max_p d_ap - min_n d_an + margin]+`, or `log(1 + exp(max_p d_ap - min_n d_an))` if `soft`.

    Args:
        margin: default 1.0, as in tfa.
        soft: soft margin instead of the hinge.
        name: loss name.

    Example:
        >>> model.compile(optimizer="adam", loss=TripletHardLoss(margin=1.0))
    """

    def __init__(self, margin=1.0, soft=False, name="triplet_hard_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.margin = float(margin)
        self.soft = bool(soft)

    def compute(self, labels, embeddings):
        return _triplet_hard_loss(labels, embeddings, self.margin, self.soft)

    def get_config(self):
        config = super().get_config()
        config.update(margin=self.margin, soft=self.soft)
        return config
