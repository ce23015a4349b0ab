"""Tests of tfdml.cli."""
