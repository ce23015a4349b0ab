"""Tests of tfdml.training."""
