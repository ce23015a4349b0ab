"""Tests of tfdml.config."""
