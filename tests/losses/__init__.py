"""Tests of tfdml.losses."""
