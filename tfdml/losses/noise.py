"""Training under label noise: two ways to drop the terms of a tuple loss that mislabelled samples make.

Web-scraped metric-learning data carry 20-50 % wrong labels; a wrong label turns a pair of different
objects into a "positive" pair that the loss pulls together. Both methods here keep the base loss as the user
compiled it (its tuples, reduction and balance) and give some of its terms weight 0:

- `SmallLossWeighting` (the small-loss heuristic): within each batch, the fraction `drop_rate` of the
  positive pairs with the largest anchor-positive distance are taken for mislabelled; every term built on
  such a pair (a positive pair of a contrastive loss, a triplet with that anchor and positive) weighs 0.
  The distance alone separates mislabelled pairs well once the embedder has learnt something.
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
import tensorflow as tf

from tfdml.losses.base import _state_variable, _WrappedLoss
from tfdml.losses.cross_batch_memory import _positive_int
from tfdml.ops import pairwise_distance, positive_mask, reduce_terms, safe_divide


def _check_rate(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= float(value) < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}.")
    return float(value)


# ------------------------------------------------------------------------------------------------ heuristic
def farthest_positive_pairs(labels, embeddings, drop_rate):
    """bool `[B, B]`, symmetric: the positive pairs `{i, j}` (same label, `i != j`) among the
    `round(drop_rate * P)` of the `P` unordered positive pairs of the batch with the largest distance
    `||f_i - f_j||` (halves rounded up; ties broken by row-major order). No gradient."""
    embeddings = tf.stop_gradient(tf.convert_to_tensor(embeddings))
    distances = pairwise_distance(embeddings)
    size = tf.shape(labels)[0]
    upper = tf.linalg.band_part(tf.ones([size, size], tf.bool), 0, -1)
    pairs = tf.cast(tf.where(positive_mask(labels) & upper), tf.int32)  # [P, 2], i < j
    values = tf.gather_nd(distances, pairs)
    count = tf.shape(pairs)[0]
    drop = tf.cast(tf.floor(tf.cast(count, tf.float64) * float(drop_rate) + 0.5), tf.int32)
    _, farthest = tf.math.top_k(values, k=tf.minimum(drop, count))
    chosen = tf.gather(pairs, farthest)
    updates = tf.ones(tf.shape(chosen)[:1], tf.bool)
    mask = tf.scatter_nd(chosen, updates, [size, size])
    return mask | tf.transpose(mask)


# ------------------------------------------------------------------------------------------------ PRISM
def prism_clean_probability(labels, embeddings, memory_labels, memory_embeddings, memory_valid):
    """PRISM's probability that each label of the batch is clean, float `[B]` (no gradient).

    `p_i = exp(f_i . c_{y_i}) / sum_k exp(f_i . c_k)`, `c_k` the mean of the valid memory embeddings of class
    `k` and the sum over the classes with a valid memory entry; 1 where class `y_i` has none.
    """
    embeddings = tf.stop_gradient(tf.convert_to_tensor(embeddings))
    memory_embeddings = tf.cast(memory_embeddings, embeddings.dtype)
    stored_labels = tf.boolean_mask(memory_labels, memory_valid)
    stored = tf.boolean_mask(memory_embeddings, memory_valid)
    classes, slot_class = tf.unique(stored_labels)
    count = tf.shape(classes)[0]
    sums = tf.math.unsorted_segment_sum(stored, slot_class, count)
    sizes = tf.math.unsorted_segment_sum(tf.ones_like(stored[:, :1]), slot_class, count)
    centres = safe_divide(sums, sizes)  # [K, D]
    logits = tf.matmul(embeddings, centres, transpose_b=True)  # [B, K]
    own = tf.equal(labels[:, None], classes[None, :])
    log_p = tf.reduce_sum(tf.where(own, logits, tf.zeros_like(logits)), axis=1) - tf.reduce_logsumexp(logits, 1)
    return tf.where(tf.reduce_any(own, axis=1), tf.exp(log_p), tf.ones_like(log_p))


def prism_keep(scores, noise_rate, window, window_count, has_memory=True):
    """PRISM's selection of one batch: `(keep bool [B], new window, new window count)`.

    `window` float `[W]` holds the window's values in its first `window_count` slots (oldest first). With
    `r = floor(noise_rate * B)` and `q` the `r`-th lowest score, `q` joins the window (the oldest value leaves
    a full window) unless it is 1 (an unscored sample) or not finite. Then a sample is kept when its score
    exceeds the window's mean; with an empty window, or when that keeps nobody (the window then reduced to its
    latest value), every sample but the `r` lowest is kept. Without memory (`has_memory` False) every sample
    is kept and the window is unchanged.
    """
    scores = tf.convert_to_tensor(scores)
    size = tf.shape(scores)[0]
    width = tf.shape(window)[0]
    removed = tf.cast(tf.floor(tf.cast(size, tf.float64) * float(noise_rate)), tf.int32)
    order = tf.argsort(scores, stable=True)
    lowest = tf.scatter_nd(order[:removed, None], tf.ones([removed], tf.bool), [size])
    quantile = tf.gather(scores, order[tf.maximum(removed - 1, 0)])
    push = (removed > 0) & tf.math.is_finite(quantile) & tf.not_equal(quantile, 1) & has_memory
    window = tf.convert_to_tensor(window)
    shifted = tf.where(
        window_count < width,
        tf.tensor_scatter_nd_update(window, [[tf.minimum(window_count, width - 1)]], [tf.cast(quantile, window.dtype)]),
        tf.concat([window[1:], tf.cast(quantile[None], window.dtype)], axis=0),
    )
    window = tf.where(push, shifted, window)
    window_count = tf.where(push, tf.minimum(window_count + 1, width), window_count)
    filled = tf.range(width) < window_count
    threshold = safe_divide(tf.reduce_sum(tf.where(filled, window, tf.zeros_like(window))), window_count)
    above = scores > tf.cast(threshold, scores.dtype)
    nobody = tf.logical_not(tf.reduce_any(above))
    use_window = (window_count > 0) & tf.logical_not(nobody)
    keep = tf.where(use_window, above, tf.logical_not(lowest))
    latest = tf.gather(window, tf.maximum(window_count - 1, 0))
    reset = (window_count > 0) & nobody
    window = tf.where(reset, tf.tensor_scatter_nd_update(window, [[0]], [latest]), window)
    window_count = tf.where(reset, tf.ones_like(window_count), window_count)
    keep = tf.where(has_memory, keep, tf.ones_like(keep))
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
        """Float `[T]`: 0 for the terms on a dropped positive pair, 1 for the others."""
        dropped = farthest_positive_pairs(labels, embeddings, self.drop_rate)
        hit = tf.gather_nd(dropped, tf.cast(terms.indices[:, :2], tf.int32))
        return 1 - tf.cast(hit, terms.values.dtype)

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
        kept = tf.where(self.weights(labels, embeddings, terms) > 0)[:, 0]

        def keep(values):
            return None if values is None else tf.gather(values, kept)

        return dataclasses.replace(
            terms,
            values=keep(terms.values),
            indices=keep(terms.indices),
            divisors=keep(terms.divisors),
            groups=keep(terms.groups),
        )

    def get_config(self):
        return {**super().get_config(), "drop_rate": self.drop_rate}


@keras.saving.register_keras_serializable(package="tfdml")
class PRISM(_WrappedLoss):
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

    def __init__(self, loss, noise_rate, memory_size, embedding_dim, window_size=30, name="prism", **kwargs):
        super().__init__(loss, name=name, **kwargs)
        self.noise_rate = _check_rate(noise_rate, "noise_rate")
        self.memory_size = _positive_int(memory_size, "memory_size")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        self.window_size = _positive_int(window_size, "window_size")
        self.training = True  # set by MetricModel.compute_loss: False in test steps
        self._state = None

    def _variables(self):
        """`(embeddings [M, D], labels [M], count, window [W], window count)`, created on first use."""
        if self._state is None:
            self._state = (
                _state_variable(np.zeros((self.memory_size, self.embedding_dim)), self.dtype, "prism_embeddings"),
                _state_variable(np.zeros(self.memory_size), "int32", "prism_labels"),
                _state_variable(0, "int64", "prism_count"),
                _state_variable(np.zeros(self.window_size), "float64", "prism_window"),
                _state_variable(0, "int32", "prism_window_count"),
            )
        return self._state

    @property
    def memory_count(self):
        """How many kept samples were enqueued so far (the next slot is `count % memory_size`)."""
        return self._variables()[2]

    def stored(self):
        """`(labels [n], embeddings [n, D])` of the filled slots in slot order, `n = min(count, memory_size)`."""
        embeddings, labels, count = (v.value.numpy() for v in self._variables()[:3])
        filled = int(min(count, self.memory_size))
        return labels[:filled], embeddings[:filled]

    @property
    def non_trainable_variables(self):
        return list(self._variables()) + super().non_trainable_variables

    def select(self, labels, embeddings):
        """The keep mask of a training batch (bool `[B]`); updates the window and enqueues the kept samples."""
        memory, memory_labels, count, window, window_count = self._variables()
        size = self.memory_size
        batch = labels.shape[0]
        if batch is not None and batch > size:
            raise ValueError(f"{self.name}: a (global) batch of {batch} exceeds memory_size={size}; raise it.")
        valid = tf.range(size, dtype=tf.int64) < tf.minimum(count.value, size)
        scores = prism_clean_probability(labels, embeddings, memory_labels.value, memory.value, valid)
        keep, new_window, new_count = prism_keep(
            tf.cast(scores, tf.float64), self.noise_rate, window.value, window_count.value, count.value > 0
        )
        kept = tf.cast(tf.where(keep)[:, 0], tf.int32)
        slots = tf.cast(tf.math.floormod(count.value + tf.range(tf.size(kept), dtype=tf.int64), size), tf.int32)
        stored = tf.cast(tf.gather(tf.stop_gradient(embeddings), kept), memory.dtype)
        memory.assign(tf.tensor_scatter_nd_update(memory.value, slots[:, None], stored))
        memory_labels.assign(tf.tensor_scatter_nd_update(memory_labels.value, slots[:, None], tf.gather(labels, kept)))
        count.assign(count.value + tf.cast(tf.size(kept), tf.int64))
        window.assign(new_window)
        window_count.assign(new_count)
        return keep

    def compute(self, labels, embeddings):
        if not self.training:
            return self.loss.compute(labels, embeddings)
        keep = self.select(labels, embeddings)
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
