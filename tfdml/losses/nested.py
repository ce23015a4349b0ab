"""Nested (Matryoshka) embeddings (Kusupati et al., NeurIPS 2022): one loss on every prefix of the embedding.

    L = sum_m  c_m * loss(y, normalise(f[:, :d_m]))        d_1 < d_2 < ... < d_M <= D,  c_m > 0

The first `d_m` coordinates of the trained embedding are each a usable embedding of their own, so a gallery
can be searched on a short prefix and its shortlist re-ranked with the full vector (`tfdml.export`'s
`search_dims`). The paper weighs every prefix alike (`c_m = 1`), the default here.

Each prefix is L2-normalised before the wrapped loss sees it where that loss works on normalised
embeddings (every tfdml pair loss: distances of unit vectors; losses that normalise inside are unchanged by
it), not where the loss is told to take raw inner products (`NPairsLoss(normalize=False)`). A prefix of a
unit vector is not a unit vector, hence the re-normalisation: the search side normalises each prefix alike.

With a cross-batch memory the memory goes around the nested loss, `CrossBatchMemory(NestedLoss(...))`: it
stores the full vectors once and every prefix slices the queue as it slices the batch.
"""

import math

import keras

from tfdml.losses.base import _WrappedLoss
from tfdml.losses.cross_batch_memory import _FORWARDED, CrossBatchMemory
from tfdml.losses.group import GroupLoss
from tfdml.losses.noise import PRISM
from tfdml.losses.proxies import ProxyLoss
from tfdml.ops import References, l2_normalize


def nested_dims(dims, weights=None, owner="NestedLoss"):
    """`(dims, weights)` as tuples of ints and floats, checked: a non-empty, strictly increasing list of
    positive prefix sizes and one positive finite weight each (default 1 each). A `ValueError` that names
    `owner` and the problem otherwise."""
    if isinstance(dims, (int, float)) or not hasattr(dims, "__len__") or len(dims) == 0:
        raise ValueError(f"{owner}: dims must be a non-empty list of prefix sizes, e.g. [8, 16, 32, 64]; got {dims!r}.")
    checked = []
    for dim in dims:
        if isinstance(dim, bool) or not float(dim).is_integer() or int(dim) < 1:
            raise ValueError(f"{owner}: dims must be positive integers, got {list(dims)!r}.")
        checked.append(int(dim))
    if any(later <= earlier for earlier, later in zip(checked, checked[1:])):
        raise ValueError(f"{owner}: dims must be strictly increasing (each prefix longer), got {checked}.")
    if weights is None:
        return tuple(checked), (1.0,) * len(checked)
    weights = [float(w) for w in weights]
    if len(weights) != len(checked):
        raise ValueError(f"{owner}: {len(weights)} weights for {len(checked)} dims {checked}; give one weight per dim.")
    if not all(math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"{owner}: weights must be positive and finite, got {weights}.")
    return tuple(checked), tuple(weights)


def _shared_across_prefixes(loss):
    """A reason why one `loss` cannot score prefixes of several widths, or None."""
    if isinstance(loss, (CrossBatchMemory, PRISM)):
        return (
            f"{type(loss).__name__} stores full-width embeddings; put it around the nested loss instead, "
            f"{type(loss).__name__}(NestedLoss(loss, dims), ...): it stores the full vectors and each prefix "
            "slices them"
        )
    if isinstance(loss, ProxyLoss):
        return f"{type(loss).__name__} learns class proxies of one width; a prefix of another width has none"
    if isinstance(loss, GroupLoss):
        return "GroupLoss takes embeddings concatenated with class logits, whose prefixes are no embeddings"
    return None


@keras.saving.register_keras_serializable(package="tfdml")
class NestedLoss(_WrappedLoss):
    """Applies a tfdml metric loss to the prefixes `dims` of the embedding and sums them with `weights`.

    `L = sum_m weights[m] * loss(y, normalise(f[:, :dims[m]]))` (see the module docstring); the value of
    each prefix is `prefix_losses(labels, embeddings)`.

    Args:
        loss: the wrapped `MetricLoss` (or its serialized config): any loss on plain `[B, D]` embeddings
            (pair, triplet, ranked-list, softmax-contrastive losses). Losses with parameters of one width
            (proxies, classifiers, Group Loss) and memories of full-width embeddings are refused.
        dims: strictly increasing prefix sizes, e.g. `(8, 16, 32, 64)`; the last at most the embedding width
            (the full width itself is a prefix only if listed).
        weights: one positive weight per prefix (default 1 each, the paper's).
        normalize: `"auto"` (normalise each prefix unless the loss takes raw inner products: an attribute
            `normalize=False`), True or False.
        name: loss name.

    Example:
        >>> loss = NestedLoss(MultiSimilarityLoss(), dims=(8, 16, 32, 64))
        >>> model.compile(optimizer="adam", loss=loss)        # model: a 64-d tfdml embedder
        >>> loss = CrossBatchMemory(NestedLoss(ContrastiveLoss(), (16, 64)), memory_size=1024, embedding_dim=64)
    """

    def __init__(self, loss, dims, weights=None, normalize="auto", name="nested_loss", **kwargs):
        super().__init__(loss, name=name, **kwargs)
        reason = _shared_across_prefixes(self.loss)
        if reason:
            raise ValueError(f"NestedLoss cannot wrap {type(self.loss).__name__}: {reason}.")
        self.dims, self.weights = nested_dims(dims, weights)
        if normalize not in ("auto", True, False):
            raise ValueError(f"NestedLoss: normalize must be 'auto', True or False, got {normalize!r}.")
        self.normalize = normalize

    def __getattr__(self, name):
        if name in _FORWARDED and "loss" in self.__dict__:
            return getattr(self.__dict__["loss"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def supports_references(self):
        return self.loss.supports_references

    @property
    def normalizes_prefixes(self):
        """Whether each prefix is L2-normalised before the wrapped loss sees it."""
        if self.normalize == "auto":
            return getattr(self.loss, "normalize", True) is not False
        return bool(self.normalize)

    def prefix(self, embeddings, dim):
        """The first `dim` columns of `embeddings`, normalised when `normalizes_prefixes`."""
        part = embeddings[:, :dim]
        return l2_normalize(part) if self.normalizes_prefixes else part

    def _check_width(self, embeddings):
        width = embeddings.shape[-1]
        if width is not None and self.dims[-1] > width:
            raise ValueError(
                f"{self.name}: dims {list(self.dims)} go up to {self.dims[-1]} but the embeddings have width {width}."
            )

    def prefix_losses(self, labels, embeddings, references=None):
        """The wrapped loss on each prefix (unweighted), a list in the order of `dims`."""
        self._check_width(embeddings)
        values = []
        for dim in self.dims:
            if references is None:
                values.append(self.loss.compute(labels, self.prefix(embeddings, dim)))
            else:
                sliced = references._replace(embeddings=self.prefix(references.embeddings, dim))
                values.append(self.loss.compute(labels, self.prefix(embeddings, dim), sliced))
        return values

    def compute(self, labels, embeddings, references: References = None):
        values = self.prefix_losses(labels, embeddings, references)
        total = values[0] * self.weights[0]
        for value, weight in zip(values[1:], self.weights[1:]):
            total = total + value * weight
        return total

    def get_config(self):
        return {
            **super().get_config(),
            "dims": list(self.dims),
            "weights": list(self.weights),
            "normalize": self.normalize,
        }
