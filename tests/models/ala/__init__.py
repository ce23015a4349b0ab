"""Tests of tfdml.models.ala."""
