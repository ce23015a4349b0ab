"""Ranked List Loss (Wang et al., TPAMI / CVPR 2019), with its dynamic negative temperature (eq. 15).

For every query `i` of the batch (every sample is a query, the others form its gallery):

    P*_i = {j != i : y_j == y_i, d_ij > alpha - m}        (mined positives)
    N*_i = {j : y_j != y_i, d_ij < alpha}                  (mined negatives)
    w_ij = softmax over P*_i of tp * (d_ij - (alpha - m))  (positives)
           softmax over N*_i of tn * (alpha - d_ij)         (negatives), both treated as constants
    L_P(i) = sum_{P*_i} w_ij (d_ij - (alpha - m)),   L_N(i) = sum_{N*_i} w_ij (alpha - d_ij)
    L = sum_i q_i [(1 - lam) L_P(i) + lam L_N(i)]

An empty mined set contributes 0. The query weights `q_i` (constants, like the pair weights) are

- `query_weighting="official"` (default): `q_i = S(i) / sum_k S(k)` with
  `S(i) = sum_{P*_i} exp(tp (d_ij - (alpha - m))) + sum_{N*_i} exp(tn (alpha - d_ij))`, the query's
  un-normalised weight sum. This is what the authors' Caffe layer (`DistanceWeightedValidPairLossV12`)
  computes in its backward pass: its gradient is exactly the gradient of this `L`. Queries with many close
  negatives (hard queries) get most of the gradient. `q` is a softmax over queries of `log S(i)` (log-sums).
- `query_weighting="uniform"`: `q_i = 1 / B`, the mean over queries of eq. 14 of the paper.

The loss value under `"official"` is `sum_i q_i L(i)`, a weighted mean of the per-query losses (the weights
sum to 1), so it lies on the same scale as the uniform mean but emphasises the hard queries; it is the value
whose gradient (with `q` and the pair weights held constant) is the official layer's gradient. The Caffe layer
itself reports a different number (its forward pass), so loss curves are not comparable across the two
weightings, only their gradients' directions per query.
"""

import warnings

import keras
import numpy as np
from keras import ops

from tfdml.losses.arguments import DECLARED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.losses.portable import lowest
from tfdml.ops import (
    DISTANCES,
    as_scalar,
    distance_matrix,
    distance_name,
    masked_max,
    pair_masks,
    reference_embeddings,
    safe_divide,
    validate_inputs,
)


@keras.saving.register_keras_serializable(package="tfdml")
class LinearTemperature:
    """Linearly decaying temperature, eq. 15 of the RLL paper: `T(step) = T1 - step * (T1 - T2) / max_steps`.

    After `max_steps` the temperature stays at `T2`.

    Args:
        t1: temperature at step 0.
        t2: temperature from `max_steps` on.
        max_steps: number of training steps over which the temperature moves from `t1` to `t2` (> 0).

    Example:
        >>> schedule = LinearTemperature(t1=20.0, t2=5.0, max_steps=1000)
        >>> float(schedule(500))
        12.5
    """

    def __init__(self, t1, t2, max_steps):
        if int(max_steps) <= 0:
            raise ValueError(f"LinearTemperature needs max_steps > 0, got {max_steps}.")
        self.t1 = float(t1)
        self.t2 = float(t2)
        self.max_steps = int(max_steps)

    def __call__(self, step, dtype="float32"):
        step = ops.clip(ops.cast(step, dtype), 0.0, float(self.max_steps))
        return self.t1 - step * ((self.t1 - self.t2) / self.max_steps)

    def get_config(self):
        return {"t1": self.t1, "t2": self.t2, "max_steps": self.max_steps}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return f"LinearTemperature(t1={self.t1}, t2={self.t2}, max_steps={self.max_steps})"


QUERY_WEIGHTINGS = ("official", "uniform")


def _default_alpha(margin, alpha):
    return 1.0 + margin / 2.0 if alpha is None else alpha


def _check_query_weighting(query_weighting):
    if query_weighting not in QUERY_WEIGHTINGS:
        raise ValueError(f"query_weighting must be one of {QUERY_WEIGHTINGS}, got {query_weighting!r}.")


def _masked_exp_and_log_sum(logits, mask):
    """`(e, total, log_sum)`: `e = exp(logits - row_max)` on `mask` (0 elsewhere), its row sums and the row's
    `log sum_mask exp(logits)` (`-inf` for an empty row). Subtracting the row max keeps `tn = 50` finite."""
    row_max = masked_max(logits, mask, axis=1, keepdims=True)  # 0 for an empty row, where nothing is exp'd
    zeros = ops.zeros_like(logits)
    exp = ops.where(mask, ops.exp(ops.where(mask, logits - row_max, zeros)), zeros)
    total = ops.sum(exp, axis=1, keepdims=True)
    has_any = total > 0
    log_sum = ops.where(has_any, row_max + ops.log(ops.where(has_any, total, ops.ones_like(total))), -np.inf)
    return exp, total, log_sum


def _query_weights(log_s_pos, log_s_neg):
    """`q = S / sum_k S(k)` from the log-sums of the mined positives' and negatives' weights (`-inf` for an
    empty set): a softmax over the queries of `log S(i)`, 0 for a query with nothing mined."""
    floor = lowest(log_s_pos.dtype)
    mined_pos, mined_neg = ops.isfinite(log_s_pos), ops.isfinite(log_s_neg)
    log_s_pos = ops.where(mined_pos, log_s_pos, floor)
    log_s_neg = ops.where(mined_neg, log_s_neg, floor)
    high = ops.maximum(log_s_pos, log_s_neg)
    # log(e^a + e^b) = high + log(1 + e^(low - high)); an empty set's lowest value adds e^-huge = 0.
    log_s = ops.squeeze(high + ops.log1p(ops.exp(ops.minimum(log_s_pos, log_s_neg) - high)), axis=1)
    mined = ops.squeeze(mined_pos | mined_neg, axis=1)
    top = ops.max(ops.where(mined, log_s, floor))
    zeros = ops.zeros_like(log_s)
    s = ops.where(mined, ops.exp(ops.where(mined, log_s - top, zeros)), zeros)
    return safe_divide(s, ops.sum(s))


@defaults_from("RankedListLoss")
def ranked_list_weights(
    labels,
    distances,
    margin=DECLARED,
    alpha=DECLARED,
    tn=DECLARED,
    tp=DECLARED,
    lam=DECLARED,
    query_weighting=DECLARED,
    references=None,
):
    """Constant per-pair coefficients `(c_pos, c_neg)` of RLL: the loss is
    `sum_ij c_pos_ij (d_ij - (alpha - m)) + c_neg_ij (alpha - d_ij)` with `c` held constant.

    `c_pos = (1 - lam) q_i w_ij` on the mined positives, `c_neg = lam q_i w_ij` on the mined negatives (0
    elsewhere), `w` the pair weights normalised over each mined set and `q_i` the query weight: `1 / B`
    (`"uniform"`, eq. 14) or `S(i) / sum_k S(k)` (`"official"`, the authors' Caffe layer), with
    `S(i) = sum_{P*_i} exp(tp (d - (alpha - m))) + sum_{N*_i} exp(tn (alpha - d))` the query's un-normalised
    weight sum. `q` is a softmax over queries of `log S(i)`, computed from log-sums, so `tn = 50` cannot
    overflow; queries with empty mined sets get `q = 0`.

    The other arguments are `ranked_list_loss`'s, their defaults the declaration of `RankedListLoss`
    (`RankedListLoss.ARGUMENTS`).

    Args:
        labels: int32 `[B]`.
        distances: `[B, B]` distances, or `[B, G]` to the `references` (a `tfdml.ops.References`, whose
            rows form every query's gallery); only their values are used.

    Returns:
        `(c_pos, c_neg, q)`: `[B, B]`, `[B, B]` and `[B]`, all without gradient.
    """
    _check_query_weighting(query_weighting)
    dist = ops.stop_gradient(distances)
    dtype = dist.dtype
    alpha = as_scalar(_default_alpha(margin, alpha), dtype)
    pos_boundary = alpha - as_scalar(margin, dtype)
    lam = as_scalar(lam, dtype)
    # The pair masks exclude j == i (the query's own copy among references), whose distance is not exactly 0.
    positives, negatives = pair_masks(labels, references)
    mined_pos = positives & (dist > pos_boundary)
    mined_neg = negatives & (dist < alpha)
    if isinstance(tp, (int, float)) and tp == 0:
        # The default tp = 0 weighs every mined positive 1: S_P is their count (cheaper than the softmax).
        pos_exp = ops.cast(mined_pos, dtype)
        pos_sum = ops.sum(pos_exp, axis=1, keepdims=True)
        log_s_pos = ops.where(pos_sum > 0, ops.log(ops.maximum(pos_sum, 1.0)), -np.inf)
    else:
        pos_exp, pos_sum, log_s_pos = _masked_exp_and_log_sum(as_scalar(tp, dtype) * (dist - pos_boundary), mined_pos)
    neg_exp, neg_sum, log_s_neg = _masked_exp_and_log_sum(as_scalar(tn, dtype) * (alpha - dist), mined_neg)
    w_pos = safe_divide(pos_exp, pos_sum)
    w_neg = safe_divide(neg_exp, neg_sum)
    if query_weighting == "uniform":
        q = ops.ones_like(dist[:, 0]) / ops.cast(ops.shape(dist)[0], dtype)
    else:
        q = _query_weights(log_s_pos, log_s_neg)
    return (1.0 - lam) * q[:, None] * w_pos, lam * q[:, None] * w_neg, q


def _ranked_list_loss(
    labels,
    embeddings,
    *,
    margin,
    alpha,
    tn,
    tp,
    lam,
    stop_gallery_gradient,
    query_weighting,
    references=None,
    distance="euclidean",
):
    """RLL on validated inputs (int32 labels, float embeddings); see the module docstring."""
    dtype = embeddings.dtype
    if references is not None:
        # Each query's ranked list is the reference set (constants, whatever stop_gallery_gradient says).
        dist = distance_matrix(distance, embeddings, ops.stop_gradient(reference_embeddings(references)))
    elif stop_gallery_gradient:
        # Sec. 3.2: "in the ranked list of x_i we regard the features of other examples as constants".
        dist = distance_matrix(distance, embeddings, ops.stop_gradient(embeddings))
    else:
        dist = distance_matrix(distance, embeddings)
    c_pos, c_neg, _ = ranked_list_weights(
        labels,
        dist,
        margin=margin,
        alpha=alpha,
        tn=tn,
        tp=tp,
        lam=lam,
        query_weighting=query_weighting,
        references=references,
    )
    alpha = as_scalar(_default_alpha(margin, alpha), dtype)
    pos_boundary = alpha - as_scalar(margin, dtype)
    # Weights are constants (official code), so the loss is linear in the distances.
    return ops.sum(c_pos * (dist - pos_boundary) + c_neg * (alpha - dist))


@defaults_from("RankedListLoss")
def ranked_list_loss(
    labels,
    embeddings,
    margin=DECLARED,
    alpha=DECLARED,
    tn=DECLARED,
    tp=DECLARED,
    lam=DECLARED,
    stop_gallery_gradient=DECLARED,
    query_weighting=DECLARED,
    distance=DECLARED,
):
    """Ranked List Loss of a batch (see the module docstring for the formula).

    The defaults are those of `RankedListLoss`'s declaration (`RankedListLoss.ARGUMENTS`).

    Args:
        labels: integer class ids `[B]`.
        embeddings: float `[B, D]` (normally L2-normalised).
        margin: `m`, the gap between the positive boundary `alpha - m` and the negative boundary `alpha`.
        alpha: negative boundary; `None` means `1 + m / 2` ("RLL-Simpler").
        tn: negative temperature (scalar or scalar tensor; large values approach hardest-negative mining).
        tp: positive temperature (0 weighs every mined positive equally).
        lam: balance between the positive (`1 - lam`) and negative (`lam`) terms.
        stop_gallery_gradient: if True (as in the paper) the gallery side of every pair is a constant, so each
            query receives only the gradient of its own ranked list.
        query_weighting: `"official"`: query `i` weighs `q_i = S(i) / sum_k S(k)`, its share of the
            batch's un-normalised pair weights, as the authors' Caffe layer does (hard queries dominate);
            `"uniform"`: `q_i = 1 / B`, eq. 14 of the paper.
        distance: `"euclidean"` (the paper's), `"squared_euclidean"` or `"cosine"` (`tfdml.ops.DISTANCES`);
            `margin` and `alpha` are on its scale.

    Returns:
        Scalar loss `sum_i q_i L(i)` in the embeddings' compute dtype (with `q` held constant, so that its
        gradient is the official layer's).
    """
    _check_query_weighting(query_weighting)
    labels, embeddings = validate_inputs(labels, embeddings)
    return _ranked_list_loss(
        labels,
        embeddings,
        margin=margin,
        alpha=alpha,
        tn=tn,
        tp=tp,
        lam=lam,
        stop_gallery_gradient=stop_gallery_gradient,
        query_weighting=query_weighting,
        distance=distance_name(distance),
    )


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class RankedListLoss(MetricLoss):
    """Ranked List Loss, `L = sum_i q_i [(1 - lam) L_P(i) + lam L_N(i)]` (see `ranked_list_loss`).

    By default (`query_weighting="official"`) query `i` weighs `q_i = S(i) / sum_k S(k)`, its share of the
    batch's un-normalised pair weights, as in the authors' Caffe layer (reproduces the published numbers);
    `query_weighting="uniform"` gives every query `1 / B` (eq. 14 of the paper, the mean over queries).

    The defaults are the paper's (512-d GoogLeNet features). On small embeddings or short runs they train
    worse than a tuned setting: on the glyphs ("Choosing a loss" in the documentation) alpha = 1.2 mines
    nearly every negative and alpha - m = 0.8 almost no positive; tuned settings lower alpha - m, and the
    uniform weighting trains best there. Search margin, alpha and tn for new data.

    `tn` may be a number or a `LinearTemperature` schedule (eq. 15). A schedule needs the training step:
    `bind_step(optimizer.iterations)` (done by `tfdml.models.MetricModel.compile` and by the
    `tfdml.callbacks.DynamicTemperature` callback for plain `keras.Model.fit`). An unbound schedule uses
    its step-0 temperature `t1` and warns.

    Args (defaults, ranges and choices in `ARGUMENTS`, also the configuration's `loss.params`):
        margin, alpha, tn, tp, lam, stop_gallery_gradient: as in `ranked_list_loss`.
        query_weighting: `"official"` (default) or `"uniform"`, as in `ranked_list_loss`.
        distance: `"euclidean"` (default), `"squared_euclidean"` or `"cosine"`, as in `ranked_list_loss`.
        name: loss name.

    Example:
        >>> loss = RankedListLoss(margin=0.4, tn=LinearTemperature(20.0, 5.0, max_steps=10_000))
        >>> model.compile(optimizer="sgd", loss=loss)
        >>> model.fit(x, y, callbacks=[tfdml.callbacks.DynamicTemperature()])
    """

    DEFAULT_NAME = "ranked_list_loss"
    ARGUMENTS = (
        Argument("margin", 0.4, "m: gap between the positive and the negative boundary", minimum=0.0, maximum=180.0),
        Argument("alpha", None, "negative boundary (None: 1 + m / 2)", minimum=0.0, maximum=1e4),
        Argument("tn", 10.0, "negative temperature, or a LinearTemperature", minimum=0.0, maximum=1e4),
        Argument("tp", 0.0, "positive temperature (negative: harder positives weigh less)", minimum=-1e4, maximum=1e4),
        Argument("lam", 0.5, "weight of the negative term (1 - lam: the positive)", minimum=0.0, maximum=1.0),
        Argument("stop_gallery_gradient", True, "the gallery side of every pair is a constant"),
        Argument("query_weighting", "official", "weights of the queries", choices=QUERY_WEIGHTINGS),
        Argument("distance", "euclidean", "the pairs' distance (tfdml.ops.DISTANCES)", choices=tuple(DISTANCES)),
    )

    def setup(self):
        if isinstance(self.tn, dict):
            self.tn = keras.saving.deserialize_keras_object(self.tn)
        if not isinstance(self.tn, LinearTemperature):
            self.tn = float(self.tn)
        self.alpha = None if self.alpha is None else float(self.alpha)
        self._step = None

    @property
    def has_schedule(self):
        """True when `tn` changes with the training step."""
        return isinstance(self.tn, LinearTemperature)

    @property
    def bound_step(self):
        """The step counter (a variable) this loss reads its temperature schedule from, or None."""
        return self._step

    def bind_step(self, step):
        """Reads the training step from `step` (normally `optimizer.iterations`) at every call.

        Pass None to unbind. Binding must happen before the train function is traced.
        """
        self._step = step
        return self

    def temperature(self, step=None, dtype="float32"):
        """The negative temperature at `step` (default: the bound step counter's current value)."""
        if not self.has_schedule:
            return ops.convert_to_tensor(self.tn, dtype=dtype)
        if step is None:
            if self._step is None:
                warnings.warn(
                    "RankedListLoss has a temperature schedule but no step counter: using its step-0 "
                    "temperature. Use tfdml.models.MetricModel or the DynamicTemperature callback, or "
                    "call loss.bind_step(optimizer.iterations).",
                    stacklevel=2,
                )
                step = 0
            else:
                step = self._step
        return self.tn(ops.convert_to_tensor(step), dtype=dtype)

    supports_references = True

    def compute(self, labels, embeddings, references=None):
        return _ranked_list_loss(
            labels,
            embeddings,
            margin=self.margin,
            alpha=self.alpha,
            tn=self.temperature(dtype=embeddings.dtype),
            tp=self.tp,
            lam=self.lam,
            stop_gallery_gradient=self.stop_gallery_gradient,
            query_weighting=self.query_weighting,
            references=references,
            distance=self.distance,
        )

    def get_config(self):
        config = self.declared_config()
        config.update(tn=keras.saving.serialize_keras_object(self.tn) if self.has_schedule else self.tn)
        return config
