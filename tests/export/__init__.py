"""Tests of tfdml.export."""
