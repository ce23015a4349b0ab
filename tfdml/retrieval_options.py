"""Retrieval's shared choices and defaults as plain values, without TensorFlow: read by `tfdml.retrieval` (the
index and the match calibration), by the configuration (parsed before TensorFlow is imported) and by the CLI,
so that each is written once."""

# Recall@k against exact search that an approximate ScaNN index is tuned to reach (`ScannIndex.tune`).
TARGET_RECALL = 0.95
# `ScannIndex` modes: brute force below a size, else approximate ("auto"), or one of them always.
INDEX_MODES = ("auto", "exact", "approximate")
# How the served `match` decision is calibrated (`tfdml.retrieval.calibrate`): for queries of classes outside
# the gallery ("open"), inside it ("closed"), or chosen from the number of classes ("auto").
CALIBRATION_MODES = ("auto", "open", "closed")
