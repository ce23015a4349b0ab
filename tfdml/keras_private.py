"""The one place where tfdml uses Keras' private API (`keras.src`), and why.

Keras 3 has no public way to subclass `keras.Model` so that both `MyModel(inputs, outputs)` (functional) and
`MyModel()` (subclassed) work without Keras rewriting the subclass' bases: `keras.Model.__new__` turns the
class into a `Functional` subclass for good when it sees functional arguments
(`inject_functional_model_class`). `tfdml.models.MetricModel` avoids that by building its own functional
subclass, which needs three names that Keras does not export:

- `Functional`: the class of functional models (`keras.src.models.functional`);
- `Trainer`: the mixin holding `fit`/`compile` state, whose `__init__` a functional subclass must call itself
  (`keras.src.models.model`);
- `functional_init_arguments(args, kwargs)`: Keras' own test for "called with inputs and outputs".

`keras.losses.get("mse")` looks a string up in one table only, `keras.src.losses.ALL_OBJECTS_DICT`, with no
public way to add a name to it; `tfdml.losses.register_aliases` adds tfdml's loss names there
(`LOSS_NAMES_TABLE`), so that `model.compile(loss="ranked_list")` works as for Keras' own losses.

`tests/test_keras_private.py` checks that these names still exist and behave as tfdml relies on, so a Keras
release that moves them fails there, by name, rather than somewhere inside model construction.
"""

from keras.src.losses import ALL_OBJECTS_DICT as LOSS_NAMES_TABLE
from keras.src.models.functional import Functional
from keras.src.models.model import Trainer, functional_init_arguments

__all__ = ["Functional", "LOSS_NAMES_TABLE", "Trainer", "functional_init_arguments"]
