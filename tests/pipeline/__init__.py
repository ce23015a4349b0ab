"""Tests of tfdml.pipeline."""
