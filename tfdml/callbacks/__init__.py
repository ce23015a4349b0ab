"""Keras callbacks for metric-learning training."""

from tfdml.callbacks.checkpoint import EpochLog, completed_epochs, previous_epochs, resume_stream
from tfdml.callbacks.pretraining import ClassificationPretraining
from tfdml.callbacks.retrieval import RetrievalEvaluation
from tfdml.callbacks.temperature import DynamicTemperature
from tfdml.callbacks.timing import EpochTimeEstimate
