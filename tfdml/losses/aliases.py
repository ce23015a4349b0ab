"""Short names for the tfdml losses in Keras, as Keras names its own ("mse", "categorical_crossentropy"):
`model.compile(loss="ranked_list")`. The names are the configuration's and the command line's
(`tfdml.loss_names.LOSSES`).

`keras.losses.get` looks a string up in Keras' own table of losses only, so the names are added to that
table (`register_aliases`, run when `tfdml.losses` is imported), beside Keras' names and never over them:
"circle" stays Keras' own `keras.losses.Circle` for a plain `keras.Model`. Every tfdml model
(`tfdml.models.MetricModel`) resolves the names itself with `get` first, so there "circle" is tfdml's
`CircleLoss`, as in a configuration, and a loss that owns variables (the margin loss' `beta`, proxies) given by
name is tracked and trained like one given as an instance.
"""

import inspect

import keras

from tfdml.keras_private import LOSS_NAMES_TABLE
from tfdml.loss_names import LOSSES


def loss_class(name):
    """The `tfdml.losses` class of a short name ("ranked_list" -> `RankedListLoss`), found where Keras keeps
    the registered classes (every tfdml loss is registered as "tfdml>ClassName" when `tfdml.losses` loads)."""
    cls = keras.saving.get_registered_object(f"tfdml>{LOSSES[name]}")
    if cls is None:  # only when this module is loaded without its package
        raise ValueError(f"loss {name!r}: tfdml.losses.{LOSSES[name]} is not registered; import tfdml.losses.")
    return cls


def get(identifier):
    """A loss instance for a tfdml short name (default arguments), else `keras.losses.get(identifier)`.

    A loss that cannot be built without arguments (e.g. "group" needs `num_classes`) raises a `ValueError`
    that names them and the class to build instead.
    """
    if isinstance(identifier, str) and identifier in LOSSES:
        cls = loss_class(identifier)
        required = [
            name
            for name, p in inspect.signature(cls).parameters.items()
            if p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        if required:
            raise ValueError(
                f"loss {identifier!r} needs arguments ({', '.join(required)}): pass "
                f"tfdml.losses.{cls.__name__}({', '.join(f'{r}=...' for r in required)}) instead "
                "of its name."
            )
        return cls()
    return keras.losses.get(identifier)


def register_aliases():
    """Adds every short name that Keras does not already use to `keras.losses.get`'s table; returns the
    names added."""
    added = []
    for name in LOSSES:
        if name not in LOSS_NAMES_TABLE:
            LOSS_NAMES_TABLE[name] = loss_class(name)
            added.append(name)
    return added
