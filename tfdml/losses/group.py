"""Group Loss (Elezi et al., ECCV 2020): label propagation by replicator dynamics over the batch.

    W    = relu(pearson(f))                 W_ii = 1 (official code) or 0 (paper, `zero_diagonal=True`)
    X(0) = softmax(logits / T)              anchors (first `num_anchors` samples of each class in the
                                            batch) replaced by the one-hot row of their label
    X   <- X * (W X), each row renormalised (`num_iterations` times; official: 1; a row with no
                                            support, i.e. an isolated sample under W_ii = 0, is kept)
    L    = mean_i -log(X[i, y_i] + 1e-12) + ce_weight * CE(logits, y)

Gradients flow through `W` (the embeddings) and the prior (the logits).
"""

import keras
import numpy as np
from keras import ops

from tfdml.losses.arguments import DECLARED, REQUIRED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.losses.label_checks import check_label_range
from tfdml.losses.portable import mean
from tfdml.ops import pairwise_pearson_similarity, same_label_mask, validate_embeddings, validate_inputs

_LOG_EPSILON = 1e-12
_LOG_ZERO = -1e30


def _positions(labels):
    """int32 `[B]`: `0, 1, ..., B - 1` (a cumulative sum, so that it needs no static batch size)."""
    return ops.cumsum(ops.ones_like(labels, dtype="int32")) - 1


def anchor_mask(labels, num_anchors):
    """`[B]` bool: true for the first `num_anchors` samples (in batch order) of each class."""
    positions = _positions(labels)
    # earlier[i, j]: j comes before i; the rank of sample i among its class = same-class samples before it.
    earlier = positions[None, :] < positions[:, None]
    rank = ops.sum(ops.cast(same_label_mask(labels) & earlier, "int32"), axis=1)
    return rank < num_anchors


@defaults_from("GroupLoss")
def replicator_dynamics(similarity, log_probabilities, num_iterations=DECLARED):
    """`num_iterations` steps of `X <- X * (W X)`, rows renormalised, computed on log-probabilities.

    Working in log space keeps the update exact when a row's mass moves to classes where it had (numerically)
    none, e.g. a sharp prior (small temperature) against neighbours of another class: the plain
    product underflows to 0/0 in float32 while the normalised result is well defined. `W X` is evaluated
    as `exp(c) * (W @ exp(log X - c))` with `c` the column max, floored at `sqrt(tiny)` so its log and
    gradient stay finite. A row with no support at all (an isolated sample under `W_ii = 0`) keeps its
    distribution.

    Args:
        similarity: `[B, B]` non-negative `W`.
        log_probabilities: `[B, m]` log of `X(0)` (rows sum to 1; very negative entries stand for 0).

    Returns:
        `[B, m]` log of `X(num_iterations)`.
    """
    log_x = log_probabilities
    for _ in range(num_iterations):
        shift = ops.stop_gradient(ops.max(log_x, axis=0, keepdims=True))
        support = ops.matmul(similarity, ops.exp(log_x - shift))
        # The floor of the product's own dtype (Keras' PyTorch backend multiplies float64 in float32).
        floor = float(np.sqrt(np.finfo(keras.backend.standardize_dtype(support.dtype)).tiny))
        updated = ops.log_softmax(log_x + shift + ops.log(ops.maximum(support, floor)), axis=1)
        isolated = ops.all(support <= floor, axis=1, keepdims=True)
        log_x = ops.where(isolated, log_x, updated)
    return log_x


def _check_group_params(temperature, num_iterations, num_anchors):
    if num_iterations < 0:
        raise ValueError(f"num_iterations must be >= 0, got {num_iterations}.")
    if num_anchors < 0:
        raise ValueError(f"num_anchors must be >= 0, got {num_anchors}.")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")


def _group_loss(labels, embeddings, logits, temperature, num_iterations, num_anchors, ce_weight, zero_diagonal):
    """Group Loss on validated inputs (int32 labels, float embeddings and logits of the same dtype)."""
    num_classes = logits.shape[-1]
    similarity = ops.relu(pairwise_pearson_similarity(embeddings))
    positions = _positions(labels)
    diagonal = ops.cast(positions[:, None] == positions[None, :], similarity.dtype)
    similarity = similarity * (1.0 - diagonal) + (0.0 if zero_diagonal else diagonal)
    log_prior = ops.log_softmax(logits / ops.cast(temperature, logits.dtype), axis=1)
    one_hot = ops.one_hot(labels, num_classes, dtype=log_prior.dtype)
    # log of the anchors' one-hot rows; -1e30 stands for log 0 (exp gives exactly 0, sums stay finite).
    log_one_hot = ops.where(one_hot > 0, 0.0, ops.cast(_LOG_ZERO, one_hot.dtype))
    log_prior = ops.where(anchor_mask(labels, num_anchors)[:, None], log_one_hot, log_prior)
    log_probabilities = replicator_dynamics(similarity, log_prior, num_iterations)
    true_class = ops.exp(ops.sum(log_probabilities * one_hot, axis=1))
    propagation = -mean(ops.log(true_class + _LOG_EPSILON))
    cross_entropy = mean(ops.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    return propagation + ce_weight * cross_entropy


@defaults_from("GroupLoss")
def group_loss(
    labels,
    embeddings,
    logits,
    temperature=DECLARED,
    num_iterations=DECLARED,
    num_anchors=DECLARED,
    ce_weight=DECLARED,
    zero_diagonal=DECLARED,
):
    """Group Loss of `labels [B]` int, `embeddings [B, D]` and classifier `logits [B, m]`.

    Inputs are validated as by every tfdml loss (integer labels, rank-2 float embeddings and logits with the
    batch size of the labels, no NaN/Inf); labels must lie in `[0, m)`.

    The defaults are those of `GroupLoss`'s declaration (`GroupLoss.ARGUMENTS`).

    Args:
        temperature: softmax temperature of the prior `X(0) = softmax(logits / T)` (official: 24 CUB,
            79 Cars, 54 SOP).
        num_iterations: replicator-dynamics steps (official: 1).
        num_anchors: samples per class, in batch order, whose prior is their one-hot label (official: 2).
        ce_weight: weight of the cross-entropy on the logits (official: 1).
        zero_diagonal: `W_ii = 0` as in the paper; the default keeps `W_ii = 1` as the official code.

    Returns:
        Scalar loss.

    Example:
        >>> group_loss(labels, embeddings, logits, temperature=24.0)
    """
    _check_group_params(temperature, num_iterations, num_anchors)
    labels, embeddings = validate_inputs(labels, embeddings)
    logits = validate_embeddings(logits, name="logits", dtype=embeddings.dtype)
    if labels.shape[0] is not None and logits.shape[0] is not None and labels.shape[0] != logits.shape[0]:
        raise ValueError(
            f"labels has {labels.shape[0]} entries but logits has {logits.shape[0]} rows; they must match."
        )
    labels = check_label_range(
        labels,
        logits.shape[-1],
        "group_loss: labels must be < the number of logits columns",
        "group_loss: labels must be >= 0",
    )
    return _group_loss(labels, embeddings, logits, temperature, num_iterations, num_anchors, ce_weight, zero_diagonal)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class GroupLoss(MetricLoss):
    """Group Loss over a model output that carries both the embedding and the class logits.

    Convention: the model's training output is `concat([embeddings, logits], axis=-1)`, of width
    `D + num_classes`; the LAST `num_classes` columns are the logits over the training classes, the rest the
    embedding. At inference use the (L2-normalised) embedding only.

    `L = mean_i -log(X(T)[i, y_i] + 1e-12) + ce_weight * CE(logits, y)` with `X(T)` the replicator dynamics
    of `X(0) = softmax(logits / temperature)` over `W = relu(pearson(embeddings))` (see `tfdml.losses.group`).

    The defaults are the paper's (CUB, pretrained backbone); the choosing-a-loss guide says how they compare on
    glyphs and which tuned setting does better there.

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        num_classes: number of training classes `m` (width of the logits block); labels lie in `[0, m)`.
        temperature: prior softmax temperature (24, the official CUB value).
        num_iterations: replicator-dynamics steps (1).
        num_anchors: labelled anchors per class in the batch (2).
        ce_weight: weight of the cross-entropy term (1).
        zero_diagonal: paper's `W_ii = 0` instead of the official `W_ii = 1`.

    Example:
        >>> features = backbone(inputs)
        >>> embeddings = keras.layers.Dense(128)(features)
        >>> logits = keras.layers.Dense(num_classes)(embeddings)
        >>> model = keras.Model(inputs, keras.layers.Concatenate()([embeddings, logits]))
        >>> model.compile(keras.optimizers.Adam(2e-4), loss=GroupLoss(num_classes, temperature=24.0))
    """

    DEFAULT_NAME = "group_loss"
    ARGUMENTS = (
        Argument("num_classes", REQUIRED, "training classes (width of the logits block)", minimum=2, maximum=10**9),
        Argument("temperature", 24.0, "prior softmax temperature", above=0.0, maximum=1e4),
        Argument("num_iterations", 1, "replicator-dynamics steps", minimum=0, maximum=1_000),
        Argument("num_anchors", 2, "labelled anchors per class in the batch", minimum=0, maximum=100_000),
        Argument("ce_weight", 1.0, "weight of the cross-entropy term", minimum=0.0, maximum=1e4),
        Argument("zero_diagonal", False, "the paper's W_ii = 0 instead of the official W_ii = 1"),
    )

    def split(self, y_pred):
        """`(embeddings, logits)` from the concatenated output `[B, D + num_classes]`."""
        width = y_pred.shape[-1]
        if width is not None and width <= self.num_classes:
            raise ValueError(
                f"{self.name}: y_pred must be concat([embeddings, logits]) of width D + num_classes with D >= 1 "
                f"(the last num_classes={self.num_classes} columns are the logits); got width {width}."
            )
        return y_pred[:, : -self.num_classes], y_pred[:, -self.num_classes :]

    def compute(self, labels, embeddings):
        embeddings, logits = self.split(embeddings)
        labels = check_label_range(
            labels,
            self.num_classes,
            f"{self.name}: labels must be < num_classes={self.num_classes}",
            f"{self.name}: labels must be >= 0",
        )
        return _group_loss(
            labels,
            embeddings,
            logits,
            self.temperature,
            self.num_iterations,
            self.num_anchors,
            self.ce_weight,
            self.zero_diagonal,
        )
