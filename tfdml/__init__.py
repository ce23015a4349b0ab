"""tfdml: deep metric learning for TensorFlow/Keras.

Submodules load on first use (`tfdml.losses`, `tfdml.data`, `tfdml.models`, `tfdml.retrieval`,
`tfdml.export`, ...), so `import tfdml` stays cheap (milliseconds; TensorFlow alone takes seconds).

Each Keras-serializable class registers itself where it is defined
(`keras.saving.register_keras_serializable(package="tfdml")`), as Keras asks of custom objects: a file saved
with tfdml's classes loads once the module that defines them is imported. `import tfdml.models` registers the
models and the losses and optimizers they use (`import tfdml.models, keras;
keras.models.load_model("model.keras")`); `import tfdml.losses` registers the losses and their short names
(`compile(loss="ranked_list")`), on any Keras backend.
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
    "projector",
    "report_pages",
    "config",
    "pipeline",
    "recipes",
    "loss_names",
    "ala_options",
    "locks",
    "interrupts",
    "beam",  # needs the beam extra: without Apache Beam its ImportError says how to install it
    "ray",  # needs the ray extra: without Ray its ImportError says how to install it
    "catalogue",
    "embed_job",
)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"tfdml.{name}")
    raise AttributeError(f"module 'tfdml' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
