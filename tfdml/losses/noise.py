"""Training under label noise: two ways to drop the terms of a tuple loss that mislabelled samples make.

Web-scraped metric-learning data carry 20-50 % wrong labels; a wrong label turns a pair of different
objects into a "positive" pair that the loss pulls together. Both methods here keep the base loss as the user
compiled it (its tuples, reduction and balance) and give some of its terms weight 0:

- `SmallLossWeighting` (the small-loss heuristic): within each batch, the fraction `drop_rate` of the
  positive pairs with the largest anchor-positive distance are taken for mislabelled; every term built on
  such a pair (a positive pair of a contrastive loss, a triplet with that anchor and positive) weighs 0.
- `PRISM` (Liu et al., "Noise-resistant Deep Metric Learning with Ranking-based Instance Selection",
  CVPR 2021, the AvgSim rule with class centres): a memory of the embeddings and labels of past selected
  samples gives each class a centre `c_k` (the mean of its stored embeddings); the probability that sample
  `i`'s label is clean is `p_i = exp(f_i . c_{y_i}) / sum_k exp(f_i . c_k)` over the classes in memory (1
  when its class has no stored sample yet). The `floor(noise_rate * B)` lowest `p_i` of a batch are dropped
  at first; the `p` of the last of them is kept in a window of the last `window_size` batches, and then a
  sample is kept when `p_i` exceeds the window's mean (all of the lowest ones dropped instead when that keeps
  nobody, the window then reduced to its latest value). Every term with a dropped sample weighs 0, and only
  kept samples enter the memory. The paper's official code is the reference for these semantics
  (github.com/alibaba-edu/Ranking-based-Instance-Selection, `losses/PRISM.py` and its trainer); it updates
  the centres of the classes of the last batch only, here every centre is the mean of what the memory holds
  (the paper's average similarity).

The selection carries no gradient. Both wrappers are `MetricLoss`es for `model.compile`; PRISM's memory and
window are non-trainable variables that `tfdml.models.MetricModel` tracks and saves, and evaluation steps
leave them alone (`loss.training`).
"""

import dataclasses

import keras
import numpy as np
from keras import ops

from tfdml.losses.base import _state_variable, _WrappedLoss
from tfdml.losses.cross_batch_memory import _positive_int
from tfdml.losses.memory import MemoryState, require_tensorflow
from tfdml.ops import masked_logsumexp, pairwise_distance, positive_mask, reduce_terms, safe_divide


def _check_rate(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= float(value) < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}.")
    return float(value)


# ------------------------------------------------------------------------------------------------ heuristic
def _positions(vector):
    """int32 `[N]`: `0, 1, ..., N - 1` for a `[N]` tensor (a cumulative sum: no static length needed)."""
    return ops.cumsum(ops.ones_like(vector, dtype="int32")) - 1


def _ranks(values, descending=False):
    """int32 `[N]`: each entry's position in the sorted order of `values` (ties: the backend's sort order, the
    lower index first on TensorFlow and JAX)."""
    order = ops.argsort(-values if descending else values)
    return ops.cast(ops.argsort(order), "int32")  # the inverse permutation


def _unordered_positive_pairs(labels, embeddings):
    """`(pairs, distances)`: bool `[B, B]`, the unordered positive pairs `i < j`, and every distance `||f_i - f_j||`
    (no gradient)."""
    distances = pairwise_distance(ops.stop_gradient(ops.convert_to_tensor(embeddings)))
    positions = _positions(labels)
    return positive_mask(labels) & (positions[:, None] < positions[None, :]), distances


def farthest_positive_pairs(labels, embeddings, drop_rate):
    """bool `[B, B]`, symmetric: the positive pairs `{i, j}` (same label, `i != j`) among the
    `round(drop_rate * P)` of the `P` unordered positive pairs of the batch with the largest distance
    `||f_i - f_j||` (halves rounded up; ties broken by row-major order). No gradient."""
    pairs, distances = _unordered_positive_pairs(labels, embeddings)
    count = ops.sum(ops.cast(pairs, "float32"))
    drop = ops.floor(count * float(drop_rate) + 0.5)
    # Distances are >= 0: the -1 of the other entries ranks them after every pair.
    flat_pairs = ops.reshape(pairs, (-1,))
    ranks = _ranks(ops.where(flat_pairs, ops.reshape(distances, (-1,)), -1.0), descending=True)
    chosen = ops.reshape(flat_pairs & (ops.cast(ranks, "float32") < drop), ops.shape(pairs))
    return chosen | ops.transpose(chosen)


def positive_distance_quantile(labels, embeddings, quantile):
    """The `quantile` (in (0, 1]) of the distances `||f_i - f_j||` of the unordered positive pairs of a batch,
    by nearest rank: the `ceil(quantile * P)`-th smallest of the `P` distances; inf when the batch has no
    positive pair (so that nothing lies beyond it). No gradient."""
    pairs, distances = _unordered_positive_pairs(labels, embeddings)
    pairs = ops.reshape(pairs, (-1,))
    count = ops.sum(ops.cast(pairs, "int32"))
    # The pairs' distances first in ascending order, every other entry (inf) after them.
    ordered = ops.sort(ops.where(pairs, ops.reshape(distances, (-1,)), np.inf))
    rank = ops.cast(ops.ceil(float(quantile) * ops.cast(count, "float32")), "int32") - 1
    value = ops.take(ordered, ops.maximum(rank, 0))
    return ops.where(count > 0, value, np.inf)


def positive_pairs_beyond(labels, embeddings, threshold):
    """bool `[B, B]`, symmetric: the positive pairs `{i, j}` (same label, `i != j`) whose distance exceeds
    `threshold`. No gradient."""
    distances = pairwise_distance(ops.stop_gradient(ops.convert_to_tensor(embeddings)))
    return positive_mask(labels) & (distances > ops.cast(threshold, distances.dtype))


def terms_on_pairs(terms, pairs):
    """bool, one per term (shaped as `terms.values`): whether the term's (anchor, positive), or its pair for a
    pair loss, is one of `pairs` (bool `[B, B]`)."""
    if getattr(terms, "valid", None) is None:  # listed terms: their (anchor, positive) rows
        size = ops.shape(pairs)[0]
        flat = ops.cast(terms.indices[:, 0], "int32") * size + ops.cast(terms.indices[:, 1], "int32")
        hit = ops.take(ops.reshape(pairs, (-1,)), flat)
    else:  # dense terms: [B, B] pairs or [B, B, B] (anchor, positive, negative) triplets
        hit = pairs if terms.kind == "pair" else pairs[:, :, None]
    return hit & ops.ones_like(terms.values, dtype="bool")


def terms_without_pairs(terms, pairs):
    """`terms` without those on `pairs` (bool `[B, B]`): listed terms lose their rows (a data-dependent
    length), dense terms their tuples' validity, so that the loss's reduction of what is left is its value
    with those tuples never mined."""
    kept = ops.logical_not(terms_on_pairs(terms, pairs))
    if getattr(terms, "valid", None) is not None:
        return dataclasses.replace(terms, valid=terms.valid & kept)
    (kept,) = ops.nonzero(kept)
    return terms.map_tuples(lambda values: ops.take(values, kept, axis=0))


# ------------------------------------------------------------------------------------------------ PRISM
def _class_centres(memory_labels, memory_embeddings, memory_valid):
    """`(centres [M, D], centre_labels [M], present bool [M])`: one row per class of the valid memory slots (the
    mean of its embeddings), in label order, then rows that stand for no class (`present` false). Static
    shapes: the slots sorted by label form one segment per class."""
    valid = ops.cast(memory_valid, "bool")
    size = memory_labels.shape[0]
    # Empty slots sort last (their label is the largest int32) and weigh 0 in any segment they share.
    keys = ops.where(valid, ops.cast(memory_labels, "int32"), np.iinfo(np.int32).max)
    order = ops.argsort(keys)
    sorted_labels = ops.take(keys, order)
    sorted_valid = ops.take(valid, order)
    weights = ops.cast(sorted_valid, memory_embeddings.dtype)[:, None]
    starts = ops.concatenate([ops.ones_like(sorted_valid[:1]), sorted_labels[1:] != sorted_labels[:-1]], axis=0)
    segment = ops.cumsum(ops.cast(starts, "int32")) - 1
    sums = ops.segment_sum(ops.take(memory_embeddings, order, axis=0) * weights, segment, num_segments=size)
    sizes = ops.segment_sum(weights, segment, num_segments=size)
    centre_labels = ops.segment_max(sorted_labels, segment, num_segments=size)
    return safe_divide(sums, sizes), centre_labels, sizes[:, 0] > 0


def prism_clean_probability(labels, embeddings, memory_labels, memory_embeddings, memory_valid):
    """PRISM's probability that each label of the batch is clean, float `[B]` (no gradient).

    `p_i = exp(f_i . c_{y_i}) / sum_k exp(f_i . c_k)`, `c_k` the mean of the valid memory embeddings of class
    `k` and the sum over the classes with a valid memory entry; 1 where class `y_i` has none.
    """
    embeddings = ops.stop_gradient(ops.convert_to_tensor(embeddings))
    memory_labels = ops.convert_to_tensor(memory_labels)
    memory_embeddings = ops.cast(memory_embeddings, embeddings.dtype)
    if memory_labels.shape[0] == 0:  # no memory at all: no class is scored
        return ops.ones_like(embeddings[:, 0])
    centres, centre_labels, present = _class_centres(memory_labels, memory_embeddings, memory_valid)
    logits = ops.matmul(embeddings, ops.transpose(centres))  # [B, M]
    own = (ops.cast(labels, centre_labels.dtype)[:, None] == centre_labels[None, :]) & present[None, :]
    log_p = ops.sum(ops.where(own, logits, 0.0), axis=1) - masked_logsumexp(logits, present[None, :], axis=1)
    return ops.where(ops.any(own, axis=1), ops.exp(log_p), 1.0)


def _pushed(window, window_count, value):
    """The window with `value` appended: at slot `window_count` of a window that is not full, else at the end
    after the oldest value leaves."""
    width = window.shape[0]
    slots = _positions(window)
    full = window_count >= width
    shifted = ops.where(full, ops.roll(window, -1), window)
    return ops.where(slots == ops.minimum(window_count, width - 1), ops.cast(value, window.dtype), shifted)


def prism_keep(scores, noise_rate, window, window_count, has_memory=True):
    """PRISM's selection of one batch: `(keep bool [B], new window, new window count)`.

    `window` float `[W]` holds the window's values in its first `window_count` slots (oldest first). With
    `r = floor(noise_rate * B)` and `q` the `r`-th lowest score, `q` joins the window (the oldest value leaves
    a full window) unless it is 1 (an unscored sample) or not finite. Then a sample is kept when its score
    exceeds the window's mean; with an empty window, or when that keeps nobody (the window then reduced to its
    latest value), every sample but the `r` lowest is kept. Without memory (`has_memory` False) every sample
    is kept and the window is unchanged.
    """
    scores, window = ops.convert_to_tensor(scores), ops.convert_to_tensor(window)
    window_count = ops.cast(window_count, "int32")
    removed = ops.cast(ops.floor(ops.cast(ops.shape(scores)[0], "float32") * float(noise_rate)), "int32")
    ranks = _ranks(scores)
    lowest = ranks < removed
    quantile = ops.sum(ops.where(ranks == ops.maximum(removed - 1, 0), scores, 0.0))
    push = (removed > 0) & ops.isfinite(quantile) & (quantile != 1) & has_memory
    width = window.shape[0]
    window = ops.where(push, _pushed(window, window_count, quantile), window)
    window_count = ops.where(push, ops.minimum(window_count + 1, width), window_count)
    slots = _positions(window)
    threshold = safe_divide(ops.sum(ops.where(slots < window_count, window, 0.0)), window_count)
    above = scores > ops.cast(threshold, scores.dtype)
    nobody = ops.logical_not(ops.any(above))
    keep = ops.where((window_count > 0) & ops.logical_not(nobody), above, ops.logical_not(lowest))
    latest = ops.sum(ops.where(slots == ops.maximum(window_count - 1, 0), window, 0.0))
    reset = (window_count > 0) & nobody
    window = ops.where(reset & (slots == 0), latest, window)
    window_count = ops.where(reset, 1, window_count)
    keep = ops.where(has_memory, keep, True)
    return keep, window, window_count


def _has_terms(loss):
    return loss.tuple_kind is not None


@keras.saving.register_keras_serializable(package="tfdml")
class SmallLossWeighting(_WrappedLoss):
    """The small-loss heuristic: the wrapped loss with the terms of the farthest positive pairs weighted 0.

    Per batch, the `round(drop_rate * P)` of the `P` positive pairs with the largest anchor-positive distance
    (`farthest_positive_pairs`) are taken for mislabelled; every term of the wrapped loss whose anchor and
    positive (or whose pair, for a pair loss) is one of them gets weight 0 in the loss's own reduction
    (`tfdml.ops.reduce_terms`: dropped from its sums and counts). `drop_rate=0` is the wrapped loss.

    Args:
        loss: a tuple loss that lists its terms (`TripletLoss`, `MarginLoss`, `ContrastiveLoss`).
        drop_rate: the fraction of positive pairs dropped per batch, in [0, 1); choose it on a validation
            split of the training classes.
        name: loss name.

    Example:
        >>> loss = SmallLossWeighting(ContrastiveLoss(), drop_rate=0.3)
        >>> model.compile(optimizer="adam", loss=loss)
        >>> ala = tfdml.models.ALAModel(embedder, base_loss=loss)   # DML-ALA weighs the kept pairs
    """

    def __init__(self, loss, drop_rate, name="small_loss_weighting", **kwargs):
        super().__init__(loss, name=name, **kwargs)
        if not _has_terms(self.loss):
            raise ValueError(
                f"SmallLossWeighting needs a loss that lists its per-tuple terms (TripletLoss, MarginLoss, "
                f"ContrastiveLoss), got {type(self.loss).__name__}."
            )
        self.drop_rate = _check_rate(drop_rate, "drop_rate")

    def weights(self, labels, embeddings, terms):
        """Float, one per term (shaped as `terms.values`): 0 for the terms on a dropped positive pair, else 1."""
        dropped = farthest_positive_pairs(labels, embeddings, self.drop_rate)
        return 1 - ops.cast(terms_on_pairs(terms, dropped), terms.values.dtype)

    @property
    def tuple_kind(self):
        return self.loss.tuple_kind

    def compute(self, labels, embeddings):
        terms = self.loss.terms(labels, embeddings)
        return reduce_terms(terms, self.weights(labels, embeddings, terms))

    def terms(self, labels, embeddings):
        """The wrapped loss's terms without those of the dropped pairs (`reduce_terms` of them is `compute`:
        a weight 0 removes a term from the sums and the counts), so that a method weighting tuples, such as
        `tfdml.models.ALAModel`, weighs the kept ones."""
        terms = self.loss.terms(labels, embeddings)
        return terms_without_pairs(terms, farthest_positive_pairs(labels, embeddings, self.drop_rate))

    def get_config(self):
        return {**super().get_config(), "drop_rate": self.drop_rate}


@keras.saving.register_keras_serializable(package="tfdml")
class PRISM(MemoryState, _WrappedLoss):
    """PRISM (Liu et al., CVPR 2021): the wrapped loss on the samples of the batch whose label is likely clean.

    Each training call scores the batch against the memory's class centres (`prism_clean_probability`),
    selects the samples to keep (`prism_keep`: at first all but the `floor(noise_rate * B)` least likely
    clean, then those above the mean of a window of past thresholds), enqueues the kept samples' embeddings
    (without gradient) and labels, and returns the wrapped loss of the kept samples alone, as the paper's
    code computes its loss on the selected features: a dropped sample has weight 0 in every term. Evaluation
    calls (`loss.training` False, set by `MetricModel`) return the wrapped loss of the whole batch and leave
    the memory and window alone.

    Args:
        loss: the wrapped `MetricLoss` (any pair- or tuple-based loss: `ContrastiveLoss`, `TripletLoss`,
            `TripletSemiHardLoss`, `MarginLoss`, ...).
        noise_rate: the fraction of each batch dropped while the window fills (the paper sets it to the
            expected noise rate), in [0, 1).
        memory_size: how many kept embeddings the memory holds (the paper's configurations: about the
            training set); at least the global batch size.
        embedding_dim: width of the embeddings.
        window_size: how many past batches' thresholds the window averages (30 in the paper's configuration).
        name: loss name.

    Example:
        >>> loss = PRISM(ContrastiveLoss(), noise_rate=0.4, memory_size=3000, embedding_dim=64)
        >>> model.compile(optimizer="adam", loss=loss)   # model: a tfdml.models.MetricModel
    """

    _BUFFER_PREFIX = "prism"

    def __init__(self, loss, noise_rate, memory_size, embedding_dim, window_size=30, name="prism", **kwargs):
        require_tensorflow("PRISM")
        super().__init__(loss, name=name, **kwargs)
        self.noise_rate = _check_rate(noise_rate, "noise_rate")
        self.memory_size = _positive_int(memory_size, "memory_size")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        self.window_size = _positive_int(window_size, "window_size")
        self.training = True  # set by MetricModel.compute_loss: False in test steps

    def _extra_state(self):
        """`(window [W], window count)`: the past thresholds."""
        return (
            _state_variable(np.zeros(self.window_size), "float64", "prism_window"),
            _state_variable(0, "int32", "prism_window_count"),
        )

    def select(self, labels, embeddings):
        """The keep mask of a training batch (bool `[B]`); updates the window and enqueues the kept samples."""
        _, _, _, window, window_count = self._variables()
        buffer = self._buffer
        batch = labels.shape[0]
        if batch is not None and batch > self.memory_size:
            raise ValueError(
                f"{self.name}: a (global) batch of {batch} exceeds memory_size={self.memory_size}; raise it."
            )
        scores = prism_clean_probability(
            labels, embeddings, buffer.labels.value, buffer.embeddings.value, buffer.valid()
        )
        keep, new_window, new_count = prism_keep(
            ops.cast(scores, "float64"), self.noise_rate, window.value, window_count.value, buffer.count.value > 0
        )
        buffer.assign(*buffer.written(labels, embeddings, keep)[:3])
        window.assign(new_window)
        window_count.assign(new_count)
        return keep

    def compute(self, labels, embeddings):
        if not self.training:
            return self.loss.compute(labels, embeddings)
        keep = self.select(labels, embeddings)
        import tensorflow as tf  # the kept samples, a batch of data-dependent size: PRISM runs on TensorFlow only

        return self.loss.compute(tf.boolean_mask(labels, keep), tf.boolean_mask(embeddings, keep))

    def get_config(self):
        config = super().get_config()
        config.update(
            noise_rate=self.noise_rate,
            memory_size=self.memory_size,
            embedding_dim=self.embedding_dim,
            window_size=self.window_size,
            dtype=self.dtype,
        )
        return config
