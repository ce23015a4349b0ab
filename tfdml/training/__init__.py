"""Training loops beyond `model.fit`: `fit_distributed` runs the same step on one device, N devices
(`MirroredStrategy`) and N machines (`MultiWorkerMirroredStrategy`, where Keras 3 `fit` fails), with
checkpointing and resuming."""

from tfdml.training.loop import fit_distributed, replica_slice

__all__ = ["fit_distributed", "replica_slice"]
