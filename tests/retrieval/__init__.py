"""Tests of tfdml.retrieval."""
