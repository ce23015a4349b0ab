"""tfdml: deep metric learning for TensorFlow/Keras.

Submodules load on first use (`tfdml.losses`, `tfdml.data`, `tfdml.models`, `tfdml.retrieval`,
`tfdml.export`, ...), so `import tfdml` stays cheap (milliseconds; TensorFlow alone takes seconds).

tfdml's Keras-serializable classes (`tfdml>Embedder`, the losses, the schedules) and its loss aliases
(`compile(loss="ranked_list")`) are registered as soon as Keras (and, on Keras' TensorFlow backend,
TensorFlow) is imported, before or after tfdml: `import keras, tfdml; keras.models.load_model("model.keras")`
loads a tfdml model, as it loads Keras' own. On the JAX and PyTorch backends only the losses are registered
(the models, schedules and pipeline are TensorFlow's), and TensorFlow is not imported for them.
"""

import importlib
import sys

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

# Importing these registers every class tfdml saves with `keras.saving.register_keras_serializable` (models,
# layers, losses with the cross-batch memory, learning-rate schedules) and the loss aliases.
_REGISTERING = ("tfdml.losses", "tfdml.models", "tfdml.optimizers")
# What registers on Keras' other backends: the losses (`keras.ops`); the rest is TensorFlow's.
_REGISTERING_ANY_BACKEND = ("tfdml.losses",)
# TensorFlow imports Keras while it initializes, and Keras imports TensorFlow: on Keras' TensorFlow backend
# registration waits for both, on the others for Keras only.
_FRAMEWORK = ("tensorflow", "keras")


def _initializing(module):
    # importlib marks a module's spec `_initializing` while its code runs (what `import` itself checks to
    # tell a partially imported module).
    return getattr(getattr(module, "__spec__", None), "_initializing", False)


def _register_when_ready(just_executed=None):
    """Imports the registering modules once TensorFlow and Keras are complete and no tfdml submodule is half
    imported (`import tfdml.losses` imports TensorFlow midway: registering then would import tfdml.models,
    which needs the complete tfdml.losses). True when done. The module whose loader just returned is complete.
    """
    keras = sys.modules.get("keras")
    if keras is None or ("keras" != just_executed and _initializing(keras)):
        return False
    on_tensorflow = keras.config.backend() == "tensorflow"
    tensorflow = sys.modules.get("tensorflow")
    if on_tensorflow and (tensorflow is None or ("tensorflow" != just_executed and _initializing(tensorflow))):
        return False
    if any(
        name.startswith("tfdml.") and name != just_executed and _initializing(module)
        for name, module in list(sys.modules.items())
    ):
        return False
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in _REGISTERING if on_tensorflow else _REGISTERING_ANY_BACKEND:
        importlib.import_module(name)
    return True


class _RegisterAfterLoad:
    """A loader that runs the framework module's own loader, then registers tfdml's classes. Everything
    else (resources, source, `is_package`) is the original loader's."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _register_when_ready(just_executed=module.__name__)


class _FrameworkFinder:
    """First on `sys.meta_path` until registration: finds `tensorflow`, `keras` and tfdml's submodules with
    the finders after it and wraps their loaders in `_RegisterAfterLoad` (a post-import hook, without
    importing anything now)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _FRAMEWORK and not fullname.startswith("tfdml."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisterAfterLoad(spec.loader)
                return spec
        return None


_FINDER = _FrameworkFinder()
if not _register_when_ready():
    sys.meta_path.insert(0, _FINDER)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"tfdml.{name}")
    raise AttributeError(f"module 'tfdml' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
