"""Each loss's arguments, declared once: name, default, range or choices, one line of meaning.

A loss class lists its `Argument`s in `ARGUMENTS` and is decorated with `declared`; from that one declaration
follow its `__init__` (signature, defaults, checks with messages that state the range), its `get_config` and the
configuration's defaults, ranges and messages (`tfdml.config.schema` reads `argument_ranges(cls)`).

    @declared
    class ContrastiveLoss(MetricLoss):
        ARGUMENTS = (
            Argument("pos_margin", 0.0, "distance below which positive pairs cost nothing", minimum=0.0, maximum=4.0),
            ...
        )
"""

import dataclasses
import inspect
import math


@dataclasses.dataclass(frozen=True)
class Argument:
    """One argument of a loss: `name`, `default`, `doc`; a number's `minimum` / `above` (exclusive) /
    `maximum`, or a string's `choices`; `attribute`: where the loss keeps the value (default: `name`)."""

    name: str
    default: object
    doc: str
    minimum: float = None
    above: float = None
    maximum: float = None
    choices: tuple = None
    attribute: str = None

    @property
    def kept_as(self):
        return self.attribute or self.name

    def range(self):
        """The range in the configuration schema's form (`{"minimum": ..., "maximum": ...}`; {} for none)."""
        keys = ("minimum", "above", "maximum")
        return {key: getattr(self, key) for key in keys if getattr(self, key) is not None}

    def range_text(self):
        low = (
            f"({self.above:g}"
            if self.above is not None
            else f"[{'-inf' if self.minimum is None else f'{self.minimum:g}'}"
        )
        return f"{low}, {'inf' if self.maximum is None else f'{self.maximum:g}'}]"

    def convert(self, value, owner):
        """`value` checked (and a number converted to the default's type); a `ValueError` naming `owner`, the
        argument and its range or choices if it is outside. Tensors and variables pass unchanged."""
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(f"{owner}: {self.name} must be one of {self.choices}, got {value!r}.")
            return value
        if isinstance(self.default, bool):
            return bool(value)
        if self.default is REQUIRED and isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        if not (math.isfinite(value) and self._inside(value)):
            raise ValueError(f"{owner}: {self.name} must be in {self.range_text()}, got {value!r}.")
        return type(self.default)(value) if isinstance(self.default, (int, float)) else value

    def _inside(self, value):
        low_ok = (self.above is None or value > self.above) and (self.minimum is None or value >= self.minimum)
        return low_ok and (self.maximum is None or value <= self.maximum)


# The default of an argument that has none (`GroupLoss`'s `num_classes`).
REQUIRED = inspect.Parameter.empty


def _signature(arguments, default_name):
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("self", kind)]
    params += [inspect.Parameter(a.name, kind, default=a.default) for a in arguments]
    params.append(inspect.Parameter("name", kind, default=default_name))
    params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def declared(cls):
    """Gives `cls` the `__init__` and `get_config` of its `ARGUMENTS` (module docstring). `__init__` sets
    each argument as an attribute, then calls `cls.setup(self)` if the class defines one (variables, ...)."""
    arguments, default_name = cls.ARGUMENTS, cls.DEFAULT_NAME
    signature = _signature(arguments, default_name)
    parent = cls.__mro__[1]

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        values.pop("self")
        parent.__init__(self, name=values.pop("name"), **values.pop("kwargs"))
        for argument in arguments:
            setattr(self, argument.kept_as, argument.convert(values[argument.name], type(self).__name__))
        if "setup" in vars(cls):
            cls.setup(self)

    def get_config(self):
        config = parent.get_config(self)
        config.update({a.name: getattr(self, a.kept_as) for a in arguments})
        return config

    __init__.__signature__ = signature
    cls.__init__ = __init__
    cls.declared_config = get_config  # for a class whose get_config adjusts a value (a serialized schedule)
    if "get_config" not in vars(cls):
        cls.get_config = get_config
    return cls


def argument_ranges(cls):
    """`{name: range}` of a declared loss class's numeric arguments ({} for a class without declaration)."""
    return {a.name: a.range() for a in getattr(cls, "ARGUMENTS", ())}
