"""Smooth-AP (Brown et al., ECCV 2020): average precision with the ranking's indicator replaced by a sigmoid.

For anchor `a` of the batch, its positives `P_a` (the samples of its class, `a` itself included, as in the
authors' code and pytorch-metric-learning's `SmoothAPLoss`), cosine similarities `s` and a temperature `t`:

    R(a, x)     = 1 + sum_{y != x}         sigmoid((s_ay - s_ax) / t)     smoothed rank of x among all
    R_P(a, x)   = 1 + sum_{y != x, y in P_a} sigmoid((s_ay - s_ax) / t)   smoothed rank among the positives
    AP_a        = 1 / |P_a| sum_{x in P_a} R_P(a, x) / R(a, x)
    L           = mean_a (1 - AP_a)

(`y` runs over the whole batch, the anchor included.) The pairwise rank differences make it O(B^3) in time
and memory (`[B, B, B]`), like the reference implementations.

pytorch-metric-learning 2.9 computes the same for batches whose labels come in consecutive blocks of equal
size with as many classes as samples per class (`[A, A, A, B, B, B, C, C, C]`); it refuses classes of unequal
sizes, and for other block layouts (e.g. 4 classes x 2) its grouping of the batch (it reshapes the batch into
`[samples per class, classes]` blocks) does not follow the labels. This loss reads the positives from the
labels, for any batch; `tests/losses/test_losses_smooth_ap.py` checks it against PML where PML applies.
"""

import keras
from keras import ops

from tfdml.losses.arguments import DECLARED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.losses.portable import mean
from tfdml.ops import (
    as_scalar,
    pairwise_cosine_similarity,
    same_label_mask,
    validate_inputs,
)


def _smooth_ap_loss(labels, embeddings, temperature):
    sim = pairwise_cosine_similarity(embeddings)  # [B, B]: s_ay
    dtype = sim.dtype
    positions = ops.cumsum(ops.ones_like(labels)) - 1
    other = ops.cast(positions[:, None] != positions[None, :], dtype)  # y != x
    same = ops.cast(same_label_mask(labels), dtype)  # P_a, the anchor included
    # steps[a, x, y] = sigmoid((s_ay - s_ax) / t), without the y == x term.
    steps = ops.sigmoid((sim[:, None, :] - sim[:, :, None]) / as_scalar(temperature, dtype))
    steps = steps * other[None, :, :]
    rank_all = 1.0 + ops.sum(steps, axis=2)
    rank_pos = 1.0 + ops.sum(steps * same[:, None, :], axis=2)
    ap = ops.sum(same * rank_pos / rank_all, axis=1) / ops.sum(same, axis=1)
    return mean(1.0 - ap)


@defaults_from("SmoothAPLoss")
def smooth_ap_loss(labels, embeddings, temperature=DECLARED):
    """Smooth-AP loss of a batch, `mean_a (1 - AP_a)` with sigmoid-smoothed ranks (see the module docstring).

    Args:
        labels: integer class ids `[B]` (any class sizes and order).
        embeddings: float `[B, D]` (compared by cosine similarity).
        temperature: sigmoid temperature `t` (by default the paper's and PML's, `SmoothAPLoss.ARGUMENTS`).

    Returns:
        Scalar loss in `[0, 1)`.
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _smooth_ap_loss(labels, embeddings, temperature)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class SmoothAPLoss(MetricLoss):
    """Smooth-AP (Brown et al. 2020), as pytorch-metric-learning's `SmoothAPLoss(temperature)`.

    `L = mean_a (1 - AP_a)`, `AP_a = 1/|P_a| sum_{x in P_a} R_P(a, x) / R(a, x)` with the ranks smoothed by
    `sigmoid((s_ay - s_ax) / t)` over cosine similarities (see `tfdml.losses.smooth_ap`). O(B^3) memory.

    Args (default and range in `ARGUMENTS`, also the configuration's `loss.params`):
        temperature: sigmoid temperature.
        name: loss name.

    Example:
        >>> model.compile(optimizer="adam", loss=SmoothAPLoss(temperature=0.01))
    """

    DEFAULT_NAME = "smooth_ap_loss"
    ARGUMENTS = (Argument("temperature", 0.01, "sigmoid temperature of the smoothed ranks", above=0.0, maximum=1e4),)

    def compute(self, labels, embeddings):
        return _smooth_ap_loss(labels, embeddings, self.temperature)
