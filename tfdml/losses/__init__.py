"""Metric-learning losses: each a pure function plus a serializable `keras.losses.Loss` subclass."""

from tfdml.losses.aliases import get, register_aliases
from tfdml.losses.base import MetricLoss
from tfdml.losses.classifier import (
    ArcFaceLoss,
    CosFaceLoss,
    NormalizedSoftmaxLoss,
    arcface_loss,
    cosface_loss,
    normalized_softmax_loss,
)
from tfdml.losses.contrastive import ContrastiveLoss, contrastive_loss
from tfdml.losses.cross_batch_memory import CrossBatchMemory
from tfdml.losses.group import GroupLoss, group_loss
from tfdml.losses.margin import MarginLoss, margin_loss, margin_loss_for_triplets
from tfdml.losses.nested import NestedLoss
from tfdml.losses.noise import PRISM, SmallLossWeighting
from tfdml.losses.pair_based import (
    CircleLoss,
    LiftedStructureLoss,
    MultiSimilarityLoss,
    circle_loss,
    lifted_structure_loss,
    multi_similarity_loss,
    multi_similarity_mining,
)
from tfdml.losses.proxies import ProxyAnchorLoss, ProxyLoss, ProxyNCALoss, proxy_anchor_loss, proxy_nca_loss
from tfdml.losses.ranked_list import LinearTemperature, RankedListLoss, ranked_list_loss
from tfdml.losses.smooth_ap import SmoothAPLoss, smooth_ap_loss
from tfdml.losses.softmax_contrastive import (
    NPairsLoss,
    NTXentLoss,
    SupConLoss,
    n_pairs_loss,
    ntxent_loss,
    supcon_loss,
)
from tfdml.losses.triplet import (
    TripletHardLoss,
    TripletLoss,
    TripletSemiHardLoss,
    triplet_hard_loss,
    triplet_loss,
    triplet_semihard_loss,
)

register_aliases()  # model.compile(loss="ranked_list"), as Keras names its own losses
