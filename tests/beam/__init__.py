"""Tests of tfdml.beam."""
