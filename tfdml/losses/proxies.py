"""Proxy-based losses: Proxy-Anchor (Kim et al. 2020) and ProxyNCA (Movshovitz-Attias et al. 2017), with
pytorch-metric-learning's (PML 2.9) default semantics, and `ProxyLoss`, the base class of every loss that owns a
trainable `[num_classes, embedding_dim]` matrix of proxies (also the classifier losses of
`tfdml.losses.classifier`).

With `s_ic` the cosine similarity of sample `i` and proxy `c`, `B_c` the samples of class `c`, `C+` the
classes present in the batch and `C` the number of classes:

    proxy-anchor  L = 1/|C+| sum_{c in C+} log(1 + sum_{i in B_c} exp(-alpha (s_ic - margin)))
                    + 1/C    sum_c        log(1 + sum_{i not in B_c} exp(alpha (s_ic + margin)))
    proxy-nca     l_i = -log softmax_c(-scale ||f_i - p_c||^2)[y_i]   (L2-normalised f and p),  L = mean_i l_i

Training the proxies: a loss's proxies are a variable (`loss.proxies`, `loss.trainable_variables`).
`tfdml.models.MetricModel.compile` tracks them, so `fit` trains them and `model.save` / checkpoints keep them.
By default the model's optimizer trains them; `proxy_optimizer` gives them their own optimizer (as the margin
loss' `beta`), and `tfdml.optimizers.learning_rate_multipliers` scales their rate relative to the network's,
schedule included (Proxy-Anchor's recipe: proxies at 100x the backbone rate):

    >>> loss = ProxyAnchorLoss(num_classes=100, embedding_dim=512)
    >>> optimizer = learning_rate_multipliers(keras.optimizers.AdamW(1e-4), [(loss.proxies, 100.0)])
    >>> model.compile(optimizer=optimizer, loss=loss)
"""

import copy
import math

import keras
from keras import ops

from tfdml.losses.arguments import DECLARED, REQUIRED, Argument, declared, defaults_from
from tfdml.losses.base import MetricLoss
from tfdml.losses.label_checks import check_label_range
from tfdml.ops import (
    DISTANCES,
    as_scalar,
    distance_matrix,
    distance_name,
    l2_normalize,
    masked_logsumexp,
    pairwise_cosine_similarity,
    safe_divide,
    validate_inputs,
)


def _class_mask(labels, num_classes):
    """bool `[B, num_classes]`: `mask[i, c] = labels[i] == c`."""
    return labels[:, None] == ops.arange(num_classes, dtype=labels.dtype)[None, :]


def _proxy_anchor_loss(labels, embeddings, proxies, margin, alpha):
    cos = pairwise_cosine_similarity(embeddings, proxies)  # [B, C]
    dtype = cos.dtype
    num_classes = proxies.shape[0]
    positives = _class_mask(labels, num_classes)
    margin, alpha = as_scalar(margin, dtype), as_scalar(alpha, dtype)
    pos_term = masked_logsumexp(-alpha * (cos - margin), positives, axis=0, add_one=True)  # [C]
    neg_term = masked_logsumexp(alpha * (cos + margin), ops.logical_not(positives), axis=0, add_one=True)
    classes_present = ops.sum(ops.cast(ops.any(positives, axis=0), dtype))
    return safe_divide(ops.sum(pos_term), classes_present) + ops.sum(neg_term) / num_classes


@defaults_from("ProxyAnchorLoss")
def proxy_anchor_loss(labels, embeddings, proxies, margin=DECLARED, alpha=DECLARED):
    """Proxy-Anchor loss (Kim et al. 2020); see the module docstring.

    The defaults are those of `ProxyAnchorLoss`'s declaration (`ProxyAnchorLoss.ARGUMENTS`).

    Args:
        labels: integer class ids `[B]` in `[0, num_classes)`.
        embeddings: float `[B, D]` (L2-normalised inside).
        proxies: float `[num_classes, D]` (L2-normalised inside).
        margin: `delta`.
        alpha: scale.

    Returns:
        Scalar loss (PML's `DivisorReducer`: positive terms over the classes present, negative terms over all).
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    return _proxy_anchor_loss(labels, embeddings, ops.cast(proxies, embeddings.dtype), margin, alpha)


def _proxy_nca_loss(labels, embeddings, proxies, softmax_scale, distance="squared_euclidean"):
    dist = distance_matrix(distance, l2_normalize(embeddings), l2_normalize(proxies))
    logits = -as_scalar(softmax_scale, dist.dtype) * dist
    per_sample = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    # PML drops samples whose class probability underflows to 0 (and averages over the rest).
    kept = ops.cast(ops.exp(-per_sample) > 0, dist.dtype)
    return safe_divide(ops.sum(per_sample * kept), ops.sum(kept))


@defaults_from("ProxyNCALoss")
def proxy_nca_loss(labels, embeddings, proxies, softmax_scale=DECLARED, distance=DECLARED):
    """ProxyNCA loss (Movshovitz-Attias et al. 2017) with PML's defaults: squared Euclidean distances of
    L2-normalised embeddings and proxies, softmax over all proxies (the own class included).

    The defaults are those of `ProxyNCALoss`'s declaration (`ProxyNCALoss.ARGUMENTS`).

    Args:
        softmax_scale: multiplies the negative distances before the softmax.
        distance: `"squared_euclidean"` (PML's default), `"euclidean"` or `"cosine"` (`tfdml.ops.DISTANCES`)
            between the normalised embeddings and proxies.

    Returns:
        Scalar loss: mean over the samples.
    """
    labels, embeddings = validate_inputs(labels, embeddings)
    proxies = ops.cast(proxies, embeddings.dtype)
    return _proxy_nca_loss(labels, embeddings, proxies, softmax_scale, distance_name(distance))


def _copied(spec):
    return copy.deepcopy(spec) if isinstance(spec, dict) else spec


@declared
class ProxyLoss(MetricLoss):
    """Base class of the losses that own trainable proxies (one row per class).

    Args (in `ARGUMENTS`, which every proxy loss's declaration starts with):
        num_classes: number of training classes; labels must lie in `[0, num_classes)`.
        embedding_dim: embedding size `D`; the proxies are `[num_classes, D]`.
        proxy_optimizer: `None` (default): the model's optimizer trains the proxies (scale their learning rate
            with `tfdml.optimizers.learning_rate_multipliers`, selecting `loss.proxies`); else an optimizer
            (instance, name or config) that trains the proxies alone (`variable_optimizer`), whatever trains
            the network.
        proxy_initializer: Keras initializer of the proxies; `None` for PML's initialisation of this loss.
        name: loss name (also the prefix of the variable's name, `<name>_proxies`).

    Subclasses are declared (`tfdml.losses.arguments`) with `ARGUMENTS = (*ProxyLoss.ARGUMENTS, ...)` and define
    `loss_fn(labels, embeddings, proxies, **hyper_parameters)` and `default_initializer()`; the hyper-parameters
    are their own arguments.
    """

    DEFAULT_NAME = None
    ARGUMENTS = (
        Argument("num_classes", REQUIRED, "training classes (one proxy each)", minimum=1),
        Argument("embedding_dim", REQUIRED, "embedding size (the proxies' width)", minimum=1),
        Argument("proxy_optimizer", None, "optimizer of the proxies alone (None: the model's)"),
        Argument("proxy_initializer", None, "Keras initializer of the proxies (None: PML's)"),
    )

    def setup(self):
        self.num_classes = int(self.num_classes)
        self.embedding_dim = int(self.embedding_dim)
        # Instances from here on: their serialisation is then the same before and after a round trip. Keras'
        # deserialisation edits a config dict in place, hence the copies.
        optimizer, initializer = self.proxy_optimizer, self.proxy_initializer
        self.proxy_optimizer = None if optimizer is None else keras.optimizers.get(_copied(optimizer))
        self.proxy_initializer = None if initializer is None else keras.initializers.get(_copied(initializer))
        self._proxies = None

    def default_initializer(self):
        return keras.initializers.RandomNormal(mean=0.0, stddev=1.0)  # PML's torch.nn.init.normal_

    @property
    def proxies(self):
        """The `[num_classes, embedding_dim]` float32 variable, created on first use (so that a loss built
        inside a `tf.distribute` scope gets a mirrored variable)."""
        if self._proxies is None:
            initializer = self.proxy_initializer or self.default_initializer()
            self._proxies = keras.Variable(
                initializer,
                shape=(self.num_classes, self.embedding_dim),
                dtype="float32",
                trainable=True,
                name=f"{self.name}_proxies",
            )
        return self._proxies

    @property
    def trainable_variables(self):
        return [self.proxies]

    @property
    def variable_optimizer(self):
        return self.proxy_optimizer

    def hyper_parameters(self):
        """The subclass's own arguments (those after `ProxyLoss.ARGUMENTS`), as `loss_fn` takes them."""
        own = type(self).ARGUMENTS[len(ProxyLoss.ARGUMENTS) :]
        return {a.name: getattr(self, a.kept_as) for a in own}

    def compute(self, labels, embeddings):
        dim = embeddings.shape[-1]
        if dim is not None and dim != self.embedding_dim:
            raise ValueError(
                f"{self.name}: embeddings have dimension {dim} but the proxies have embedding_dim={self.embedding_dim}."
            )
        labels = check_label_range(
            labels,
            self.num_classes,
            f"{self.name}: labels must be < num_classes={self.num_classes} (one proxy per class)",
            f"{self.name}: labels must be >= 0",
        )
        proxies = ops.cast(self.proxies.value, embeddings.dtype)
        return type(self).loss_fn(labels, embeddings, proxies, **self.hyper_parameters())

    def get_config(self):
        config = self.declared_config()
        optimizer = None if self.proxy_optimizer is None else keras.saving.serialize_keras_object(self.proxy_optimizer)
        initializer = (
            None if self.proxy_initializer is None else keras.saving.serialize_keras_object(self.proxy_initializer)
        )
        config.update(proxy_optimizer=optimizer, proxy_initializer=initializer, **self.hyper_parameters())
        return config


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class ProxyAnchorLoss(ProxyLoss):
    """Proxy-Anchor loss (Kim et al. 2020), as PML's `ProxyAnchorLoss(num_classes, embedding_size, margin, alpha)`.

    `L = 1/|C+| sum_{c in C+} log(1 + sum_{i in B_c} exp(-alpha (s_ic - margin)))
       + 1/C sum_c log(1 + sum_{i not in B_c} exp(alpha (s_ic + margin)))` (cosine similarities `s`).

    Proxies start as PML's: Kaiming normal with fan-out, `N(0, 2 / num_classes)`. The paper trains them at 100x
    the network's learning rate: see the `tfdml.losses.proxies` module docstring.

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        num_classes, embedding_dim, proxy_optimizer, proxy_initializer: see `ProxyLoss`.
        margin: `delta`.
        alpha: scale.

    Example:
        >>> loss = ProxyAnchorLoss(100, 512, proxy_optimizer=keras.optimizers.AdamW(1e-2))
        >>> model.compile(optimizer=keras.optimizers.AdamW(1e-4), loss=loss)  # a tfdml.models.MetricModel
    """

    loss_fn = staticmethod(_proxy_anchor_loss)

    DEFAULT_NAME = "proxy_anchor_loss"
    ARGUMENTS = (
        *ProxyLoss.ARGUMENTS,
        Argument("margin", 0.1, "delta, the margin of the similarities", minimum=0.0, maximum=180.0),
        Argument("alpha", 32.0, "scale", above=0.0, maximum=1e4),
    )

    def default_initializer(self):
        # torch.nn.init.kaiming_normal_(mode="fan_out") on PML's [num_classes, D] proxies: fan_out = num_classes.
        return keras.initializers.RandomNormal(mean=0.0, stddev=math.sqrt(2.0 / self.num_classes))


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class ProxyNCALoss(ProxyLoss):
    """ProxyNCA loss (Movshovitz-Attias et al. 2017), as PML's `ProxyNCALoss(num_classes, embedding_size,
    softmax_scale)`: `l_i = -log softmax_c(-softmax_scale d(f_i, p_c))[y_i]` on L2-normalised embeddings and
    proxies, `d` the squared Euclidean distance by default (PML's `LpDistance(power=2)`), `L = mean_i l_i`.
    Proxies start as PML's, `N(0, 1)`.

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        num_classes, embedding_dim, proxy_optimizer, proxy_initializer: see `ProxyLoss`.
        softmax_scale: scale of the logits.
        distance: `"squared_euclidean"`, `"euclidean"` or `"cosine"` (`tfdml.ops.DISTANCES`).
    """

    loss_fn = staticmethod(_proxy_nca_loss)

    DEFAULT_NAME = "proxy_nca_loss"
    ARGUMENTS = (
        *ProxyLoss.ARGUMENTS,
        Argument("softmax_scale", 1.0, "scale of the logits", above=0.0, maximum=1e4),
        Argument(
            "distance", "squared_euclidean", "embedding-proxy distance (tfdml.ops.DISTANCES)", choices=tuple(DISTANCES)
        ),
    )
