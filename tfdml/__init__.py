"""tfdml: deep metric learning for TensorFlow/Keras.

Submodules load on first use (`tfdml.losses`, `tfdml.data`, `tfdml.models`, `tfdml.retrieval`,
`tfdml.export`, ...), so `import tfdml` stays cheap.
"""

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "ops",
    "losses",
    "data",
    "models",
    "retrieval",
    "export",
    "optimizers",
    "callbacks",
    "distribute",
    "training",
    "cli",
    "plots",
    "config",
    "pipeline",
    "recipes",
)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"tfdml.{name}")
    raise AttributeError(f"module 'tfdml' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
