"""Tests of tfdml.data."""
