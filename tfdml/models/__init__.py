"""Metric models: embedders, training wrappers (MetricModel, ALAModel) and their building blocks."""

from tfdml.models.ala import ALAModel
from tfdml.models.assessor import TupleAssessor
from tfdml.models.backbones import DEFAULT_TAPS, get_backbone, small_cnn
from tfdml.models.base import MetricModel
from tfdml.models.embedder import Embedder
from tfdml.models.heads import AuxiliaryEmbeddingHead, GlobalEmbeddingHead, L2Normalize
from tfdml.models.multilevel import MultiLevelEmbedder
