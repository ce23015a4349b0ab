"""Tests of tfdml.ray."""
