"""Tests of tfdml.models."""
