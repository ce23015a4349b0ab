"""The losses' short names: one table for the configuration (`loss.name`), the command line
(`--set loss.name=...`) and Keras (`model.compile(loss="ranked_list")`, registered by `tfdml.losses`).

Name -> class name in `tfdml.losses`. Plain strings, no TensorFlow: a configuration is checked against this
table before TensorFlow is imported.
"""

LOSSES = {
    "ranked_list": "RankedListLoss",
    "triplet": "TripletLoss",
    "triplet_semihard": "TripletSemiHardLoss",
    "triplet_hard": "TripletHardLoss",
    "margin": "MarginLoss",
    "contrastive": "ContrastiveLoss",
    "group": "GroupLoss",
    "multi_similarity": "MultiSimilarityLoss",
    "circle": "CircleLoss",
    "lifted_structure": "LiftedStructureLoss",
    "n_pairs": "NPairsLoss",
    "supcon": "SupConLoss",
    "ntxent": "NTXentLoss",
    "smooth_ap": "SmoothAPLoss",
    "proxy_anchor": "ProxyAnchorLoss",
    "proxy_nca": "ProxyNCALoss",
    "normalized_softmax": "NormalizedSoftmaxLoss",
    "arcface": "ArcFaceLoss",
    "cosface": "CosFaceLoss",
}

# The losses that list per-tuple terms (`loss.terms`, weighted by DML-ALA and the small-loss heuristic) and
# what their terms list: each class's `tuple_kind` reads this table, so "does this loss list terms?" has one
# answer, also for the configuration before TensorFlow is imported.
TUPLE_KINDS = {"triplet": "triplet", "margin": "triplet", "contrastive": "pair"}
