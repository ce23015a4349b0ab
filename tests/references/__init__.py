"""Independent NumPy reference implementations used by the tests (never import tfdml here)."""
