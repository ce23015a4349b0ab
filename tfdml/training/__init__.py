"""Training loops beyond `model.fit`: `fit_distributed` runs the same step on one device, N devices
(`MirroredStrategy`) and N machines (`MultiWorkerMirroredStrategy`, where Keras 3 `fit` fails), with
checkpointing and resuming; `fit_heads` trains an embedder's heads on backbone features computed once
(`backbone_features`), the frozen-backbone mode that trains a head in seconds on a CPU."""

from tfdml.training.features import FeatureHeads, backbone_features, balanced_batches, dataset_features, fit_heads
from tfdml.training.loop import fit_distributed, replica_slice

__all__ = [
    "FeatureHeads",
    "backbone_features",
    "balanced_batches",
    "dataset_features",
    "fit_distributed",
    "fit_heads",
    "replica_slice",
]
