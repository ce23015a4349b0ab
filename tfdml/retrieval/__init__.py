"""Retrieval: ScaNN nearest-neighbour index, the DML evaluation protocol (Recall@K, MAP@R, NMI, F1) and
match calibration (the score threshold of a target precision)."""

from tfdml.retrieval.calibration import Calibration, calibrate
from tfdml.retrieval.evaluation import METRICS, embed_batches, evaluate
from tfdml.retrieval.index import ScannIndex, auto_settings

__all__ = ["Calibration", "calibrate", "ScannIndex", "auto_settings", "embed_batches", "evaluate", "METRICS"]
