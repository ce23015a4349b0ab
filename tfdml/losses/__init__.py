"""Metric-learning losses: each a pure function plus a serializable `keras.losses.Loss` subclass."""

from tfdml.losses.base import MetricLoss
