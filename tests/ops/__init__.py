"""Tests of tfdml.ops."""
