"""Normalised-classifier losses: NormSoftmax (Zhai & Wu 2019), CosFace (Wang et al. 2018) and ArcFace (Deng et
al. 2019), with pytorch-metric-learning's (PML 2.9) default semantics. The class weights are the loss's trainable
proxies (`tfdml.losses.proxies.ProxyLoss`; PML's `W` is their transpose).

With `cos_ic` the cosine similarity of sample `i` and class weight `c`, and `y_i` its class:

    normalized softmax  l_i = CE(cos_i. / temperature, y_i)
    cosface             l_i = CE(scale (cos_i. - margin [c == y_i]), y_i)
    arcface             l_i = CE(scale cos'_i., y_i),  cos'_ic = cos_ic for c != y_i, and for the target class
                        cos(theta + m) if theta <= pi - m, else cos(theta) - m sin(m)   (theta = arccos cos_iy)

`L = mean_i l_i`. ArcFace's `cos(theta + m)` is computed as `cos m cos - sin m sqrt(1 - cos^2)` (the same value
as PML's `cos(arccos(cos) + m)`) with a gradient-safe square root, so `cos = +-1` (an embedding on its class
weight) gives a finite gradient where `arccos` would give NaN.
"""

import math

import keras
from keras import ops

from tfdml.losses.arguments import DECLARED, Argument, declared, defaults_from
from tfdml.losses.portable import mean
from tfdml.losses.proxies import ProxyLoss
from tfdml.ops import as_scalar, pairwise_cosine_similarity, safe_sqrt, validate_inputs


def _cross_entropy(labels, logits):
    return mean(ops.sparse_categorical_crossentropy(labels, logits, from_logits=True))


def _normalized_softmax_loss(labels, embeddings, proxies, temperature):
    cos = pairwise_cosine_similarity(embeddings, proxies)
    return _cross_entropy(labels, cos / as_scalar(temperature, cos.dtype))


def _cosface_loss(labels, embeddings, proxies, margin, scale):
    cos = pairwise_cosine_similarity(embeddings, proxies)
    target = ops.one_hot(labels, proxies.shape[0], dtype=cos.dtype)
    return _cross_entropy(labels, as_scalar(scale, cos.dtype) * (cos - as_scalar(margin, cos.dtype) * target))


def _arcface_loss(labels, embeddings, proxies, margin, scale):
    """`margin` in radians."""
    cos = pairwise_cosine_similarity(embeddings, proxies)
    dtype = cos.dtype
    target = ops.one_hot(labels, proxies.shape[0], dtype=dtype)
    target_cos = ops.clip(ops.sum(cos * target, axis=1), -1.0, 1.0)
    cos_m, sin_m = as_scalar(math.cos(margin), dtype), as_scalar(math.sin(margin), dtype)
    sin_theta = safe_sqrt(1.0 - ops.square(target_cos))
    # theta <= pi - m  <=>  cos(theta) >= cos(pi - m) = -cos(m); beyond it the logit keeps decreasing linearly.
    modified = ops.where(
        target_cos >= -cos_m,
        target_cos * cos_m - sin_theta * sin_m,
        target_cos - as_scalar(margin * math.sin(margin), dtype),
    )
    logits = cos + target * (modified - target_cos)[:, None]
    return _cross_entropy(labels, as_scalar(scale, dtype) * logits)


@defaults_from("NormalizedSoftmaxLoss")
def normalized_softmax_loss(labels, embeddings, proxies, temperature=DECLARED):
    """NormSoftmax: cross-entropy of the cosine similarities to the `[C, D]` class weights over `temperature`."""
    labels, embeddings = validate_inputs(labels, embeddings)
    return _normalized_softmax_loss(labels, embeddings, ops.cast(proxies, embeddings.dtype), temperature)


@defaults_from("CosFaceLoss")
def cosface_loss(labels, embeddings, proxies, margin=DECLARED, scale=DECLARED):
    """CosFace (large margin cosine loss): `CE(scale (cos - margin [c == y]), y)`."""
    labels, embeddings = validate_inputs(labels, embeddings)
    return _cosface_loss(labels, embeddings, ops.cast(proxies, embeddings.dtype), margin, scale)


@defaults_from("ArcFaceLoss")
def arcface_loss(labels, embeddings, proxies, margin=DECLARED, scale=DECLARED):
    """ArcFace (additive angular margin), `margin` in degrees (by default 28.6 = 0.5 rad, PML's); see the module
    docstring."""
    labels, embeddings = validate_inputs(labels, embeddings)
    return _arcface_loss(labels, embeddings, ops.cast(proxies, embeddings.dtype), math.radians(margin), scale)


def _scale():
    return Argument("scale", 64.0, "logit scale", above=0.0, maximum=1e4)


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class NormalizedSoftmaxLoss(ProxyLoss):
    """NormSoftmax (Zhai & Wu 2019), as PML's `NormalizedSoftmaxLoss(num_classes, embedding_size, temperature)`:
    `l_i = CE(cos(f_i, w_c) / temperature, y_i)`, `L = mean_i l_i`. Class weights start as PML's, `N(0, 1)`.

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        num_classes, embedding_dim, proxy_optimizer, proxy_initializer: see `tfdml.losses.ProxyLoss`.
        temperature: softmax temperature.
    """

    loss_fn = staticmethod(_normalized_softmax_loss)

    DEFAULT_NAME = "normalized_softmax_loss"
    ARGUMENTS = (*ProxyLoss.ARGUMENTS, Argument("temperature", 0.05, "softmax temperature", above=0.0, maximum=1e4))


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class CosFaceLoss(ProxyLoss):
    """CosFace (Wang et al. 2018), as PML's `CosFaceLoss(num_classes, embedding_size, margin, scale)`:
    `l_i = CE(scale (cos(f_i, w_c) - margin [c == y_i]), y_i)`. Class weights start as PML's, `N(0, 1)`.

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        num_classes, embedding_dim, proxy_optimizer, proxy_initializer: see `tfdml.losses.ProxyLoss`.
        margin: additive cosine margin.
        scale: logit scale.
    """

    loss_fn = staticmethod(_cosface_loss)

    DEFAULT_NAME = "cosface_loss"
    ARGUMENTS = (
        *ProxyLoss.ARGUMENTS,
        Argument("margin", 0.35, "additive cosine margin", minimum=0.0, maximum=180.0),
        _scale(),
    )


@keras.saving.register_keras_serializable(package="tfdml")
@declared
class ArcFaceLoss(ProxyLoss):
    """ArcFace (Deng et al. 2019), as PML's `ArcFaceLoss(num_classes, embedding_size, margin, scale)`: the target
    logit is `cos(theta + m)` (`cos(theta) - m sin(m)` beyond `theta = pi - m`), scaled by `scale`, then
    cross-entropy. Class weights start as PML's, `N(0, 1)`.

    Args (defaults and ranges in `ARGUMENTS`, also the configuration's `loss.params`):
        num_classes, embedding_dim, proxy_optimizer, proxy_initializer: see `tfdml.losses.ProxyLoss`.
        margin: additive angular margin in degrees (by default 0.5 rad, as in the paper).
        scale: logit scale.
    """

    DEFAULT_NAME = "arcface_loss"
    ARGUMENTS = (
        *ProxyLoss.ARGUMENTS,
        Argument("margin", 28.6, "additive angular margin, in degrees", minimum=0.0, maximum=180.0),
        _scale(),
    )

    @staticmethod
    def loss_fn(labels, embeddings, proxies, margin, scale):
        return _arcface_loss(labels, embeddings, proxies, math.radians(margin), scale)
