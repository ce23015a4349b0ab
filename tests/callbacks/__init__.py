"""Tests of tfdml.callbacks."""
