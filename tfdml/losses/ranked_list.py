"""Ranked List Loss (Wang et al., TPAMI / CVPR 2019), with its dynamic negative temperature (eq. 15).

For every query `i` of the batch (every sample is a query, the others form its gallery):

    P*_i = {j != i : y_j == y_i, d_ij > alpha - m}        (mined positives)
    N*_i = {j : y_j != y_i, d_ij < alpha}                  (mined negatives)
    w_ij = softmax over P*_i of tp * (d_ij - (alpha - m))  (positives)
           softmax over N*_i of tn * (alpha - d_ij)         (negatives), both treated as constants
    L_P(i) = sum_{P*_i} w_ij (d_ij - (alpha - m)),   L_N(i) = sum_{N*_i} w_ij (alpha - d_ij)
    L = mean_i [(1 - lam) L_P(i) + lam L_N(i)]

An empty mined set contributes 0.
"""

import warnings

import keras
import tensorflow as tf

from tfdml.losses.base import MetricLoss
from tfdml.ops import (as_scalar, masked_softmax, negative_mask, pairwise_distance, positive_mask,
                       safe_divide, validate_inputs)


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

    def __call__(self, step, dtype=tf.float32):
        step = tf.minimum(tf.cast(step, dtype), tf.cast(self.max_steps, dtype))
        step = tf.maximum(step, tf.zeros_like(step))
        return self.t1 - step * ((self.t1 - self.t2) / self.max_steps)

    def get_config(self):
        return {"t1": self.t1, "t2": self.t2, "max_steps": self.max_steps}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return f"LinearTemperature(t1={self.t1}, t2={self.t2}, max_steps={self.max_steps})"


def _default_alpha(margin, alpha):
    return 1.0 + margin / 2.0 if alpha is None else alpha


def _ranked_list_loss(labels, embeddings, margin, alpha, tn, tp, lam, stop_gallery_gradient):
    """RLL on validated inputs (int32 labels, float embeddings); see the module docstring."""
    dtype = embeddings.dtype
    alpha = _default_alpha(margin, alpha)
    if stop_gallery_gradient:
        # Sec. 3.2: "in the ranked list of x_i we regard the features of other examples as constants".
        dist = pairwise_distance(embeddings, tf.stop_gradient(embeddings))
    else:
        dist = pairwise_distance(embeddings)
    alpha = as_scalar(alpha, dtype)
    pos_boundary = alpha - as_scalar(margin, dtype)
    lam = as_scalar(lam, dtype)

    # positive_mask excludes j == i, which also matters with a separate gallery (its diagonal is not 0).
    mined_pos = tf.logical_and(positive_mask(labels), dist > pos_boundary)
    mined_neg = tf.logical_and(negative_mask(labels), dist < alpha)

    # Official code: weights are constants. Zero weight outside each mined set.
    const_dist = tf.stop_gradient(dist)
    if isinstance(tp, (int, float)) and tp == 0:
        # The default tp = 0 weighs every mined positive equally: the softmax of a constant, cheaper.
        mined_pos_f = tf.cast(mined_pos, dtype)
        w_pos = safe_divide(mined_pos_f, tf.reduce_sum(mined_pos_f, axis=1, keepdims=True))
    else:
        w_pos = masked_softmax(as_scalar(tp, dtype) * (const_dist - pos_boundary), mined_pos)
    w_neg = masked_softmax(as_scalar(tn, dtype) * (alpha - const_dist), mined_neg)

    per_pair = (1.0 - lam) * w_pos * (dist - pos_boundary) + lam * w_neg * (alpha - dist)
    return safe_divide(tf.reduce_sum(per_pair), tf.shape(dist)[0])


def ranked_list_loss(labels, embeddings, margin=0.4, alpha=None, tn=10.0, tp=0.0, lam=0.5,
                     stop_gallery_gradient=True):
    """Ranked List Loss of a batch (see the module docstring for the formula).

    Args:
        labels: integer class ids `[B]`.
        embeddings: float `[B, D]` (normally L2-normalised).
        margin: `m`, the gap between the positive boundary `alpha - m` and the negative boundary `alpha`.
        alpha: negative boundary; `None` means `1 + m / 2` ("RLL-Simpler").
        tn: negative temperature (scalar or scalar tensor; large values approach hardest-negative mining).
        tp: positive temperature (0 weighs every mined positive equally).
        lam: balance between the positive (`1 - lam`) and negative (`lam`) terms.
        stop_gallery_gradient: if True (default, as in the paper) the gallery side of every pair is a
            constant, so each query receives only the gradient of its own ranked list.

    Returns:
        Scalar loss in the embeddings' compute dtype.
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _ranked_list_loss(labels, embeddings, margin, alpha, tn, tp, lam, stop_gallery_gradient)


@keras.saving.register_keras_serializable(package="tfdml")
class RankedListLoss(MetricLoss):
    """Ranked List Loss, `L = mean_i [(1 - lam) L_P(i) + lam L_N(i)]` (see `ranked_list_loss`).

    `tn` may be a number or a `LinearTemperature` schedule (eq. 15). A schedule needs the training step:
    `bind_step(optimizer.iterations)` (done by `tfdml.models.MetricModel.compile` and by the
    `tfdml.callbacks.DynamicTemperature` callback for plain `keras.Model.fit`). An unbound schedule uses
    its step-0 temperature `t1` and warns.

    Args:
        margin, alpha, tn, tp, lam, stop_gallery_gradient: as in `ranked_list_loss`.
        name: loss name.

    Example:
        >>> loss = RankedListLoss(margin=0.4, tn=LinearTemperature(20.0, 5.0, max_steps=10_000))
        >>> model.compile(optimizer="sgd", loss=loss)
        >>> model.fit(x, y, callbacks=[tfdml.callbacks.DynamicTemperature()])
    """

    def __init__(self, margin=0.4, alpha=None, tn=10.0, tp=0.0, lam=0.5, stop_gallery_gradient=True,
                 name="ranked_list_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        if isinstance(tn, dict):
            tn = keras.saving.deserialize_keras_object(tn)
        if not isinstance(tn, LinearTemperature):
            tn = float(tn)
            if tn < 0:
                raise ValueError(f"tn must be >= 0 (0 weighs mined negatives equally), got {tn}.")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}.")
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam balances the positive and negative terms and must lie in [0, 1], got {lam}.")
        self.margin = float(margin)
        self.alpha = None if alpha is None else float(alpha)
        self.tn = tn
        self.tp = float(tp)
        self.lam = float(lam)
        self.stop_gallery_gradient = bool(stop_gallery_gradient)
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

    def temperature(self, step=None, dtype=tf.float32):
        """The negative temperature at `step` (default: the bound step counter's current value)."""
        if not self.has_schedule:
            return tf.constant(self.tn, dtype)
        if step is None:
            if self._step is None:
                warnings.warn(
                    "RankedListLoss has a temperature schedule but no step counter: using its step-0 "
                    "temperature. Use tfdml.models.MetricModel or the DynamicTemperature callback, or "
                    "call loss.bind_step(optimizer.iterations).", stacklevel=2)
                step = 0
            else:
                step = self._step
        return self.tn(tf.convert_to_tensor(step), dtype=dtype)

    def compute(self, labels, embeddings):
        tn = self.temperature(dtype=embeddings.dtype)
        return _ranked_list_loss(labels, embeddings, self.margin, self.alpha, tn, self.tp, self.lam,
                                 self.stop_gallery_gradient)

    def get_config(self):
        config = super().get_config()
        tn = keras.saving.serialize_keras_object(self.tn) if self.has_schedule else self.tn
        config.update(margin=self.margin, alpha=self.alpha, tn=tn, tp=self.tp, lam=self.lam,
                      stop_gallery_gradient=self.stop_gallery_gradient)
        return config
