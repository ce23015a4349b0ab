"""Retrieval: ScaNN nearest-neighbour index and the DML evaluation protocol (Recall@K, MAP@R, NMI, F1)."""

from tfdml.retrieval.evaluation import METRICS, embed_batches, evaluate
from tfdml.retrieval.index import ScannIndex, auto_settings

__all__ = ["ScannIndex", "auto_settings", "embed_batches", "evaluate", "METRICS"]
