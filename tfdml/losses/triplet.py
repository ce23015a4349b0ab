"""Triplet losses: `TripletLoss` with all / batch-hard / semi-hard mining, and drop-in replacements for
tensorflow-addons' `TripletSemiHardLoss` and `TripletHardLoss`, in `keras.ops` (every backend).

A triplet `(a, p, n)` has `y_p == y_a`, `p != a` and `y_n != y_a`; its hinge loss is
`[m + d_ap - d_an]+` (or the soft margin `log(1 + exp(d_ap - d_an))`).

`triplet_terms` writes `TripletLoss`'s terms once, as a dense `[B, B, G]` tensor with the mask of the
triplets its mining keeps; the loss is their shared reduction (`tfdml.ops.reduce_terms`). `compute` takes the
one fast path, `triplet_fast_path`, which gives the same value without the `[B, B, B]` tensor (at B = 1024 it
would hold 1e9 entries): batch-hard mining is a row max and a row min; all and semi-hard triplets are summed
in "positive slots": slot `k` pairs every anchor with its k-th positive, so one `[B, B]` pass covers the
triplets `(a, p_k(a), n)` of all anchors and negatives at once. A batch with K samples per class needs K - 1
passes: O(K B^2) time, O(B^2) memory. The exact (sub)gradient of the sum is accumulated in the same passes
(each active triplet adds `+dterm` to `d_ap` and `-dterm` to `d_an`) and handed to autodiff with
`keras.ops.custom_gradient`, so backprop stores nothing per slot.
"""

import keras
from keras import backend, ops

from tfdml.loss_names import TUPLE_KINDS
from tfdml.losses.arguments import DECLARED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.ops import (
    DISTANCES,
    TupleTerms,
    as_scalar,
    distance_matrix,
    distance_name,
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
    triplet_mask,
    validate_inputs,
)

MINING_STRATEGIES = ("all", "hard", "semi_hard")


def _upstream(args, upstream):
    # keras.ops.custom_gradient: TensorFlow and JAX pass the upstream gradient positionally, PyTorch by keyword.
    return args[0] if upstream is None else upstream


def _positive_slots(pos):
    """`rank[a, j]`: index of positive `j` among anchor `a`'s positives (slot k = every anchor's k-th
    positive), -1 where `j` is no positive, and the number of slots (the most positives any anchor has)."""
    pos_int = ops.cast(pos, "int32")
    rank = ops.cumsum(pos_int, axis=1) - pos_int
    return ops.where(pos, rank, -ops.ones_like(rank)), ops.max(ops.sum(pos_int, axis=1))


def _slot_terms(dist, neg, slot, margin, semi_hard, soft):
    """`(terms, active, slope)` `[B, G]` of the triplets `(a, k-th positive of a, n)` of one slot."""
    dtype = dist.dtype
    anchor_pos = ops.sum(slot * dist, axis=1, keepdims=True)  # d_ap of the k-th positive
    has_slot = ops.max(slot, axis=1, keepdims=True) > 0
    gap = anchor_pos - dist  # gap[a, n] = d_ap - d_an
    valid = ops.logical_and(neg, has_slot)
    if semi_hard:
        valid = ops.logical_and(valid, ops.logical_and(gap < 0, gap > -margin))
    if not soft:
        valid = ops.logical_and(valid, gap + margin > 0)
    active = ops.cast(valid, dtype)
    if soft:
        return ops.softplus(gap) * active, active, ops.sigmoid(gap) * active
    return ops.where(valid, gap + margin, ops.zeros_like(gap)), active, active


def _triplet_sums(dist, pos, neg, margin, semi_hard, soft):
    """`[sum of the triplet terms, number of triplets counted]` over all (or the semi-hard) triplets.

    Hinge terms `m + d_ap - d_an` count where positive; soft terms `log(1 + exp(d_ap - d_an))` always.
    Semi-hard triplets are those with `d_ap < d_an < d_ap + m`. One `[B, G]` pass per positive slot.
    """
    dtype = dist.dtype
    margin = as_scalar(margin, dtype)
    slot_rank, num_slots = _positive_slots(pos)

    @ops.custom_gradient
    def sums(dist):
        def slot_step(k, total, count, grad):
            slot = ops.cast(ops.equal(slot_rank, k), dtype)
            terms, active, slope = _slot_terms(dist, neg, slot, margin, semi_hard, soft)
            # d total / d d_ap = sum_n slope[a, n]; d total / d d_an = -slope[a, n].
            grad = grad + slot * ops.sum(slope, axis=1, keepdims=True) - slope
            return k + 1, total + ops.sum(terms), count + ops.sum(active), grad

        zero = ops.zeros((), dtype)
        start = (ops.convert_to_tensor(0, "int32"), zero, zero, ops.zeros_like(dist))
        _, total, count, grad_dist = ops.while_loop(lambda k, *_: k < num_slots, slot_step, start)

        def grad(*args, upstream=None):
            return _upstream(args, upstream)[0] * grad_dist  # the count is piecewise constant

        return ops.stack([total, count]), grad

    return sums(dist)


def _check_mining(mining):
    if mining not in MINING_STRATEGIES:
        raise ValueError(f"mining must be one of {MINING_STRATEGIES}, got {mining!r}.")


def _hinge(gap, margin, soft):
    return ops.softplus(gap) if soft else ops.relu(gap + as_scalar(margin, gap.dtype))


def _mined(dist, pos, neg, margin, mining):
    """bool `[B, B, G]`: the triplets `mining` keeps at these (constant) distances."""
    valid = triplet_mask(pos, neg)
    constant = ops.stop_gradient(dist)
    if mining == "semi_hard":
        gap = constant[:, :, None] - constant[:, None, :]
        return ops.logical_and(valid, ops.logical_and(gap < 0, gap > -as_scalar(margin, dist.dtype)))
    if mining == "hard":  # (a, farthest positive, nearest negative), the first of ties
        far_pos = ops.argmax(ops.where(pos, constant, -ops.ones_like(constant)), axis=1)
        near_neg = ops.argmin(ops.where(neg, constant, ops.max(constant) + 1.0), axis=1)
        size, columns = ops.shape(dist)[0], ops.shape(dist)[1]
        one_pos = ops.equal(ops.arange(size)[None, :], ops.cast(far_pos, "int32")[:, None])
        one_neg = ops.equal(ops.arange(columns)[None, :], ops.cast(near_neg, "int32")[:, None])
        return ops.logical_and(valid, ops.logical_and(one_pos[:, :, None], one_neg[:, None, :]))
    return valid


def _triplet_distances(embeddings, references, squared, distance):
    """`[B, G]` distances: `distance` (a `tfdml.ops.DISTANCES` name), squared Euclidean if `squared`."""
    if squared and distance != "euclidean":
        raise ValueError(f"squared applies to the euclidean distance only, got distance={distance!r}.")
    return distance_matrix("squared_euclidean" if squared else distance, embeddings, reference_embeddings(references))


def triplet_terms(labels, embeddings, margin, mining, soft, squared, references=None, distance="euclidean"):
    """The triplet loss's terms, written once: dense `[B, B, G]` `(anchor, positive, negative)` terms
    `[m + d_ap - d_an]+` (soft: `log(1 + exp(d_ap - d_an))`) with the mask of the triplets the mining keeps:

    - `"all"`: every valid triplet; hinge terms reduced by their mean over the non-zero ones, soft terms by
      their mean over all.
    - `"semi_hard"`: the triplets with `d_ap < d_an < d_ap + m` at these embeddings; their mean.
    - `"hard"`: per anchor with a positive and a negative, `(a, farthest positive, nearest negative)`; their
      mean.

    `reduce_terms` of them is `triplet_loss` (`triplet_fast_path` computes it without the `[B, B, G]` tensor).
    """
    dist = _triplet_distances(embeddings, references, squared, distance)
    pos, neg = pair_masks(labels, references)
    valid = _mined(dist, pos, neg, margin, mining)
    values = ops.where(valid, _hinge(dist[:, :, None] - dist[:, None, :], margin, soft), 0.0)
    reduction = "mean_active" if mining == "all" and not soft else "mean"
    return TupleTerms(values, None, "triplet", reduction, valid=valid)


def triplet_fast_path(dist, pos, neg, margin, mining, soft):
    """`reduce_terms(triplet_terms(...))` from the `[B, G]` distances and pair masks, without the `[B, B, G]`
    tensor: row max/min for batch-hard mining, positive slots (`_triplet_sums`) for the others."""
    if mining == "hard":
        gap = masked_max(dist, pos, axis=1) - masked_min(dist, neg, axis=1)
        has_both = ops.logical_and(ops.any(pos, axis=1), ops.any(neg, axis=1))
        return masked_mean(_hinge(gap, margin, soft), has_both)
    sums = _triplet_sums(dist, pos, neg, margin, semi_hard=(mining == "semi_hard"), soft=soft)
    return safe_divide(sums[0], sums[1])


def _triplet_loss(labels, embeddings, margin, mining, soft, squared, references=None, distance="euclidean"):
    dist = _triplet_distances(embeddings, references, squared, distance)
    pos, neg = pair_masks(labels, references)
    return triplet_fast_path(dist, pos, neg, margin, mining, soft)


@defaults_from("TripletLoss")
def triplet_loss(
    labels, embeddings, margin=DECLARED, mining=DECLARED, soft=DECLARED, squared=DECLARED, distance=DECLARED
):
    """Triplet loss of a batch with the given mining.

    - `"all"`: every triplet `(a, p, n)`; mean of `[m + d_ap - d_an]+` over the triplets where it is
      positive (0 if none).
    - `"hard"`: batch-hard; per anchor its farthest positive and nearest negative; mean over the anchors
      that have both.
    - `"semi_hard"` (FaceNet): the triplets with `d_ap < d_an < d_ap + m`; mean over them (0 if none).

    The defaults are those of `TripletLoss`'s declaration (`TripletLoss.ARGUMENTS`).

    Args:
        labels: integer class ids `[B]`.
        embeddings: float `[B, D]`.
        margin: `m`.
        mining: `"all"`, `"hard"` or `"semi_hard"`.
        soft: use the soft margin `log(1 + exp(d_ap - d_an))` instead of the hinge (the margin then only
            delimits semi-hard triplets; with `"all"` the mean runs over every triplet).
        squared: use squared Euclidean distances (the same as `distance="squared_euclidean"`).
        distance: `"euclidean"`, `"squared_euclidean"` or `"cosine"` (`tfdml.ops.DISTANCES`).

    Returns:
        Scalar loss.
    """
    _check_mining(mining)
    distance_name(distance)
    labels, embeddings = validate_inputs(labels, embeddings)
    return _triplet_loss(labels, embeddings, margin, mining, soft, squared, distance=distance)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class TripletLoss(MetricLoss):
    """Triplet loss `[m + d_ap - d_an]+` with `"all"`, `"hard"` or `"semi_hard"` mining.

    See `triplet_loss` for the exact reductions. `"all"` runs in O(B^2) memory (no `[B, B, B]` tensor).

    Backends: TensorFlow, JAX and PyTorch (written in `keras.ops`).

    Args (defaults, ranges and choices in `ARGUMENTS`, also the configuration's `loss.params`):
        margin: `m`.
        mining: `"all"`, `"hard"` or `"semi_hard"`.
        soft: soft margin `log(1 + exp(d_ap - d_an))`.
        squared: squared Euclidean distances (the same as `distance="squared_euclidean"`).
        distance: `"euclidean"`, `"squared_euclidean"` or `"cosine"` (`tfdml.ops.DISTANCES`).
        name: loss name.

    Example:
        >>> loss = TripletLoss(margin=0.2, mining="semi_hard")
        >>> model.compile(optimizer="adam", loss=loss)
    """

    DEFAULT_NAME = "triplet_loss"
    ARGUMENTS = (
        Argument("margin", 0.2, "the hinge's margin m", minimum=0.0, maximum=180.0),
        Argument("mining", "all", "which triplets count", choices=MINING_STRATEGIES),
        Argument("soft", False, "soft margin log(1 + exp(d_ap - d_an)) instead of the hinge"),
        Argument("squared", False, "squared Euclidean distances"),
        Argument("distance", "euclidean", "the triplets' distance (tfdml.ops.DISTANCES)", choices=tuple(DISTANCES)),
    )

    # `terms` lists triplets (`tfdml.ops.TupleTerms.kind`).
    tuple_kind = TUPLE_KINDS["triplet"]
    supports_references = True

    def setup(self):
        if self.squared and self.distance != "euclidean":
            raise ValueError(
                f"TripletLoss: squared applies to the euclidean distance only, got distance={self.distance!r}."
            )

    def _options(self):
        return self.margin, self.mining, self.soft, self.squared

    def compute(self, labels, embeddings, references=None):
        return _triplet_loss(labels, embeddings, *self._options(), references, distance=self.distance)

    def dense_terms(self, labels, embeddings, references=None):
        """The dense triplet terms (`triplet_terms`); `tfdml.ops.reduce_terms` gives `compute`'s value."""
        return triplet_terms(labels, embeddings, *self._options(), references, distance=self.distance)

    def terms(self, labels, embeddings):
        """The unreduced triplet terms, listed (`TupleTerms.listed`)."""
        return self.dense_terms(labels, embeddings).listed()


# ------------------------------------------------------------------------------ tensorflow-addons drop-ins

# tensorflow-addons' spellings, accepted beside tfdml's names as aliases of them (`tfdml.ops.DISTANCE_ALIASES`).
TFA_DISTANCE_METRICS = ("L2", "squared-L2", "angular")


def _tfa_distance_name(distance_metric):
    """The vocabulary's name of a drop-in's `distance_metric` (a tfa spelling or a `tfdml.ops.DISTANCES` name)."""
    try:
        return distance_name(distance_metric, aliases=TFA_DISTANCE_METRICS)
    except ValueError:
        valid = ", ".join(repr(name) for name in (*DISTANCES, *TFA_DISTANCE_METRICS))
        raise ValueError(
            f"distance_metric must be one of {valid} or a callable returning a [B, B] distance matrix, "
            f"got {distance_metric!r}."
        ) from None


def _check_distance_metric(distance_metric):
    if not callable(distance_metric):
        _tfa_distance_name(distance_metric)


def _tfa_distances(embeddings, distance_metric):
    """tensorflow-addons' `pdist_matrix`: Euclidean ("L2"), squared Euclidean, `1 - cos` ("angular", clipped at
    0 as tfa), or `distance_metric(embeddings)` for a callable (any `[B, B]` matrix; smaller means closer)."""
    if callable(distance_metric):
        return ops.cast(distance_metric(embeddings), embeddings.dtype)
    name = _tfa_distance_name(distance_metric)
    if name == "cosine":
        return pairwise_angular_distance(embeddings)
    return pairwise_distance(embeddings, squared=name == "squared_euclidean")


def _as_input_dtype(value, y_pred):
    """tensorflow-addons computes float16/bfloat16 input in float32 and returns the input dtype."""
    dtype = getattr(y_pred, "dtype", None)
    if dtype is None:
        return value
    dtype = backend.standardize_dtype(dtype)
    floating = backend.is_float_dtype(dtype)
    return ops.cast(value, dtype) if floating and dtype != backend.standardize_dtype(value.dtype) else value


def _no_positive_pair_gives_zero(loss, pos):
    return ops.where(ops.any(pos), loss, ops.zeros_like(loss))


def _split_ties(mask, dist, value):
    """One-hot (ties share equally) of the entries of `mask` where `dist` equals the row's `value`."""
    hit = ops.cast(ops.logical_and(mask, ops.equal(dist, value)), dist.dtype)
    return safe_divide(hit, ops.sum(hit, axis=1, keepdims=True))


def _row_min_where_empty(masked_value, mask, dist):
    """tensorflow-addons' masked max/min of a row with no entry in `mask` is the row's minimum of `dist`."""
    return ops.where(ops.any(mask, axis=1, keepdims=True), masked_value, ops.min(dist, axis=1, keepdims=True))


def _semihard_negative_sums(dist, pos, neg, margin):
    """Sum over all positive pairs of tfa's semi-hard term `[m + d_ap - d_an*]+`, one pass per positive slot.

    `d_an*` is the smallest `d_an > d_ap`, else the largest `d_an`, else (no negative) the row's minimum
    distance, as tfa. Gradient accumulated in the same pass (ties of `d_an*` share it, like `reduce_min`'s
    gradient).
    """
    dtype = dist.dtype
    margin = as_scalar(margin, dtype)
    rank, num_slots = _positive_slots(pos)
    fallback = ops.where(ops.any(neg, axis=1, keepdims=True), neg, ops.ones_like(neg))

    @ops.custom_gradient
    def total_of(dist):
        # Inside: a value of `dist` captured from outside would escape JAX's custom_gradient trace.
        farthest = _row_min_where_empty(masked_max(dist, neg, axis=1, keepdims=True), neg, dist)

        def slot_step(k, total, grad):
            slot = ops.cast(ops.equal(rank, k), dtype)
            has_slot = ops.sum(slot, axis=1, keepdims=True)
            anchor_pos = ops.sum(slot * dist, axis=1, keepdims=True)
            farther = ops.logical_and(neg, dist > anchor_pos)
            has_farther = ops.any(farther, axis=1, keepdims=True)
            nearest_farther = masked_min(dist, farther, axis=1, keepdims=True)
            neg_dist = ops.where(has_farther, nearest_farther, farthest)
            chosen = ops.where(
                has_farther, _split_ties(farther, dist, nearest_farther), _split_ties(fallback, dist, farthest)
            )
            active = ops.cast(margin + anchor_pos - neg_dist > 0, dtype) * has_slot
            total = total + ops.sum(active * (margin + anchor_pos - neg_dist))
            return k + 1, total, grad + active * (slot - chosen)

        start = (ops.convert_to_tensor(0, "int32"), ops.zeros((), dtype), ops.zeros_like(dist))
        _, total, grad_dist = ops.while_loop(lambda k, *_: k < num_slots, slot_step, start)

        def grad(*args, upstream=None):
            return _upstream(args, upstream) * grad_dist

        return total, grad

    return total_of(dist)


def _triplet_semihard_loss(labels, embeddings, margin, distance_metric):
    dist = _tfa_distances(embeddings, distance_metric)
    pos = positive_mask(labels)
    total = _semihard_negative_sums(dist, pos, negative_mask(labels), margin)
    return safe_divide(total, ops.sum(ops.cast(pos, dist.dtype)))


@defaults_from("TripletSemiHardLoss")
def triplet_semihard_loss(labels, embeddings, margin=DECLARED, distance_metric=DECLARED):
    """tensorflow-addons' semi-hard triplet loss (its `triplet_semihard_loss`).

    For every ordered positive pair `(a, p)` the negative is the nearest one farther than `p`
    (`min d_an > d_ap`), else the farthest negative; the loss is the mean over all positive pairs of
    `[margin + d_ap - d_an]+`. A batch without positive pairs gives 0 (tfa gave NaN).

    Args:
        distance_metric: as tfa: `"L2"` (Euclidean, default), `"squared-L2"`, `"angular"` (`1 - cos`, clipped
            at 0) or a callable mapping the `[B, D]` embeddings to a `[B, B]` distance matrix; tfdml's names
            of the same distances (`"euclidean"`, `"squared_euclidean"`, `"cosine"`) are accepted too.

    Returns:
        Scalar in the input dtype (float16/bfloat16 inputs are computed in float32, as tfa).
    """
    _check_distance_metric(distance_metric)
    validated_labels, validated = validate_inputs(labels, embeddings)
    value = _triplet_semihard_loss(validated_labels, validated, margin, distance_metric)
    return _as_input_dtype(value, embeddings)


def _triplet_hard_loss(labels, embeddings, margin, soft, distance_metric):
    dist = _tfa_distances(embeddings, distance_metric)
    pos = positive_mask(labels)
    neg = negative_mask(labels)
    # As tfa: an anchor without positive uses its row minimum (0 for "L2"), one without negative its row maximum.
    hardest_pos = _row_min_where_empty(masked_max(dist, pos, axis=1, keepdims=True), pos, dist)[:, 0]
    hardest_neg = ops.where(ops.any(neg, axis=1), masked_min(dist, neg, axis=1), ops.max(dist, axis=1))
    return _no_positive_pair_gives_zero(ops.mean(_hinge(hardest_pos - hardest_neg, margin, soft)), pos)


@defaults_from("TripletHardLoss")
def triplet_hard_loss(labels, embeddings, margin=DECLARED, soft=DECLARED, distance_metric=DECLARED):
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


def _distance_metric():
    return Argument(
        "distance_metric",
        "L2",
        '"L2", "squared-L2", "angular" (or "euclidean", "squared_euclidean", "cosine") or a callable [B, D] -> [B, B]',
    )


@declared
class _TfaDropIn(MetricLoss):
    """Base of the tensorflow-addons drop-ins: tfa's `distance_metric` and tfa's output dtype."""

    DEFAULT_NAME = None
    ARGUMENTS = (_distance_metric(),)

    def setup(self):
        if isinstance(self.distance_metric, dict):
            self.distance_metric = keras.saving.deserialize_keras_object(self.distance_metric)
        _check_distance_metric(self.distance_metric)

    def __call__(self, y_true, y_pred, sample_weight=None):
        return _as_input_dtype(super().__call__(y_true, y_pred, sample_weight), y_pred)

    def get_config(self):
        config = self.declared_config()
        metric = self.distance_metric
        config.update(
            distance_metric=metric if isinstance(metric, str) else keras.saving.serialize_keras_object(metric)
        )
        return config


def _tfa_margin():
    return Argument("margin", 1.0, "the hinge's margin (tfa's default)", minimum=0.0, maximum=180.0)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class TripletSemiHardLoss(_TfaDropIn):
    """Drop-in replacement for `tfa.losses.TripletSemiHardLoss` (see `triplet_semihard_loss`).

    `L = mean_{(a, p)} [margin + d_ap - d_an*]+` with `d_an*` the smallest `d_an > d_ap`, else the largest.
    Returns the input dtype (float16 in, float16 out), as tfa.

    Backends: TensorFlow, JAX and PyTorch (written in `keras.ops`).

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        margin: the hinge's margin (tfa's default).
        distance_metric: `"L2"` (default), `"squared-L2"`, `"angular"` or a callable `[B, D] -> [B, B]`, as
            in tfa (a callable must be registered with `keras.saving.register_keras_serializable` to be saved);
            or tfdml's names of the same distances, `"euclidean"`, `"squared_euclidean"`, `"cosine"`.
        name: loss name.

    Example:
        >>> model.compile(optimizer="adam", loss=TripletSemiHardLoss())  # was tfa.losses.TripletSemiHardLoss()
    """

    DEFAULT_NAME = "triplet_semihard_loss"
    ARGUMENTS = (_tfa_margin(), _distance_metric())

    def compute(self, labels, embeddings):
        return _triplet_semihard_loss(labels, embeddings, self.margin, self.distance_metric)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class TripletHardLoss(_TfaDropIn):
    """Drop-in replacement for `tfa.losses.TripletHardLoss` (see `triplet_hard_loss`).

    `L = mean_a [max_p d_ap - min_n d_an + margin]+`, or `log(1 + exp(max_p d_ap - min_n d_an))` if `soft`.
    Returns the input dtype (float16 in, float16 out), as tfa.

    Backends: TensorFlow, JAX and PyTorch (written in `keras.ops`).

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        margin: the hinge's margin (tfa's default).
        soft: soft margin instead of the hinge.
        distance_metric: `"L2"` (default), `"squared-L2"`, `"angular"` or a callable, as in tfa.
        name: loss name.

    Example:
        >>> model.compile(optimizer="adam", loss=TripletHardLoss(margin=1.0))
    """

    DEFAULT_NAME = "triplet_hard_loss"
    ARGUMENTS = (_tfa_margin(), Argument("soft", False, "soft margin instead of the hinge"), _distance_metric())

    def compute(self, labels, embeddings):
        return _triplet_hard_loss(labels, embeddings, self.margin, self.soft, self.distance_metric)
