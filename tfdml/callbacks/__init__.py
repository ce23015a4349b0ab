"""Keras callbacks for metric-learning training."""

from tfdml.callbacks.checkpoint import (
    CheckpointSequence,
    EpochLog,
    checked_weights,
    completed_epochs,
    previous_epochs,
    restore_point,
    resume_stream,
    save_checked_weights,
)
from tfdml.callbacks.pretraining import ClassificationPretraining
from tfdml.callbacks.retrieval import RetrievalEvaluation
from tfdml.callbacks.temperature import DynamicTemperature
from tfdml.callbacks.timing import EpochTimeEstimate
