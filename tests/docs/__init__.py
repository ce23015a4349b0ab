"""Tests of the documentation (docs/, README.md, docstrings, scripts/)."""
