"""Each loss's arguments, declared once: name, default, range or choices, one line of meaning.

A loss class lists its `Argument`s in `ARGUMENTS` and is decorated with `declared`; from that one declaration
follow its `__init__` (signature, defaults, checks with messages that state the range), its `get_config`, the
configuration's defaults, ranges and messages (`tfdml.config.schema` reads `ARGUMENTS`), the defaults of its pure
function (the parameters whose default is `DECLARED`, filled in by `defaults_from`) and the losses guide's table
of arguments (`docs/hooks.py`). Everything reads the declaration when it is used, so one edit of `ARGUMENTS`
reaches all of them.

    @defaults_from("ContrastiveLoss")
    def contrastive_loss(labels, embeddings, pos_margin=DECLARED, neg_margin=DECLARED): ...

    @declared
    class ContrastiveLoss(MetricLoss):
        ARGUMENTS = (
            Argument("pos_margin", 0.0, "distance below which positive pairs cost nothing", minimum=0.0, maximum=4.0),
            ...
        )

A declared class may extend another (`ProxyAnchorLoss` extends `ProxyLoss`): it lists the base's arguments
first (`ARGUMENTS = (*ProxyLoss.ARGUMENTS, ...)`), and its `setup` and `get_config` are inherited.
"""

import dataclasses
import functools
import inspect
import math
import numbers


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
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return value
        if not (math.isfinite(value) and self._inside(value)):
            raise ValueError(f"{owner}: {self.name} must be in {self.range_text()}, got {value!r}.")
        return type(self.default)(value) if isinstance(self.default, (int, float)) else value

    def _inside(self, value):
        low_ok = (self.above is None or value > self.above) and (self.minimum is None or value >= self.minimum)
        return low_ok and (self.maximum is None or value <= self.maximum)


# The default of an argument that has none (`GroupLoss`'s `num_classes`).
REQUIRED = inspect.Parameter.empty


class _Declared:
    def __repr__(self):
        return "DECLARED"


# The default of a pure function's parameter that takes the loss class's declared default (`defaults_from`).
DECLARED = _Declared()


def _signature(arguments, default_name):
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("self", kind)]
    params += [inspect.Parameter(a.name, kind, default=a.default) for a in arguments]
    params.append(inspect.Parameter("name", kind, default=default_name))
    params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


class _ClassSignature:
    """`inspect.signature(cls)` of a declared class, built from its `ARGUMENTS` when it is asked for (an instance
    is a callable loss: its signature is `__call__`'s; an undeclared subclass has its own `__init__`'s)."""

    def __get__(self, instance, owner):
        if instance is not None or not _is_declared(owner):  # a subclass with its own __init__: inspect reads it
            return None
        signature = _signature(owner.ARGUMENTS, owner.DEFAULT_NAME)
        return signature.replace(parameters=list(signature.parameters.values())[1:])


def _is_declared(cls):
    return vars(cls).get("_declared", False)


def declared(cls):
    """Gives `cls` the `__init__` and `get_config` of its `ARGUMENTS` (module docstring). `__init__` sets
    each argument as an attribute, then calls `setup(self)` if the class has one (variables, ...). The first
    base class that is not declared (`MetricLoss`) takes `name` and the other keyword arguments."""
    base = next(c for c in cls.__mro__[1:] if not _is_declared(c))

    def __init__(self, *args, **kwargs):
        arguments = cls.ARGUMENTS
        bound = _signature(arguments, cls.DEFAULT_NAME).bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        values.pop("self")
        base.__init__(self, name=values.pop("name"), **values.pop("kwargs"))
        for argument in arguments:
            setattr(self, argument.kept_as, argument.convert(values[argument.name], type(self).__name__))
        setup = getattr(cls, "setup", None)
        if setup is not None:
            setup(self)

    def declared_config(self):
        config = base.get_config(self)
        config.update({a.name: getattr(self, a.kept_as) for a in cls.ARGUMENTS})
        return config

    declared_config._declared = True
    inherited = cls.get_config
    cls.__init__ = __init__
    cls.__signature__ = _ClassSignature()
    cls._declared = True
    cls.declared_config = declared_config  # for a get_config that adjusts a value (a serialized schedule)
    if "get_config" not in vars(cls) and (inherited is base.get_config or getattr(inherited, "_declared", False)):
        cls.get_config = declared_config
    return cls


def declared_defaults(cls):
    """`{name: default}` of a declared loss class's arguments, as its declaration states them now."""
    return {a.name: a.default for a in cls.ARGUMENTS}


def defaults_from(class_name):
    """Decorator of a loss's pure function: each parameter whose default is `DECLARED` takes, when the call
    leaves it out, the default that the declared class `class_name` (of the function's module) gives the
    argument of the same name, read at the call (`tfdml.losses.arguments`)."""

    def decorate(function):
        signature = inspect.signature(function)
        names = [name for name, p in signature.parameters.items() if p.default is DECLARED]

        @functools.wraps(function)
        def with_defaults(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            missing = [name for name in names if name not in bound.arguments]
            if missing:
                defaults = declared_defaults(function.__globals__[class_name])
                for name in missing:
                    bound.arguments[name] = defaults[name]
            return function(*bound.args, **bound.kwargs)

        with_defaults.defaults_from = class_name
        return with_defaults

    return decorate
