"""Retrieval: ScaNN nearest-neighbour index, the DML evaluation protocol (Recall@K, MAP@R, NMI, F1),
match calibration (the score threshold of a target precision), search over a sharded gallery, re-ranking by
query expansion and database-side augmentation, and the worst queries of an embedding."""

from tfdml.retrieval.calibration import Calibration, calibrate
from tfdml.retrieval.evaluation import METRICS, embed_batches, evaluate
from tfdml.retrieval.expansion import database_augmentation, query_expansion
from tfdml.retrieval.index import ScannIndex, auto_settings
from tfdml.retrieval.sharded import ShardedIndex, merge_top_k
from tfdml.retrieval.worst import WorstQueries, WorstQuery, worst_queries

__all__ = [
    "Calibration",
    "calibrate",
    "ScannIndex",
    "ShardedIndex",
    "auto_settings",
    "database_augmentation",
    "embed_batches",
    "evaluate",
    "merge_top_k",
    "query_expansion",
    "METRICS",
    "WorstQueries",
    "WorstQuery",
    "worst_queries",
]
