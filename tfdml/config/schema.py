"""The validation machinery of the configuration: typed dataclass fields with their rules (`_field`:
choices, ranges, custom parsers), the conversion of plain YAML values to the annotated types, the one-line
`ConfigError` naming the key, and the checks of output paths. No TensorFlow is imported here."""

import copy
import dataclasses
import difflib
import inspect
import math
import os
import tempfile
import types
import typing
from typing import Any

# `Optional[X]` and `X | None` annotations: both mean "X or null" to the validator.
_UNIONS = (typing.Union, types.UnionType)


class ConfigError(ValueError):
    """A configuration value that does not fit the schema; the message is one line naming the key."""


# Numbers without a stated maximum: integers that fit TensorFlow's int32 shapes, floats far beyond any
# setting that trains (every number has a range, and NaN or infinity is never one).
MAX_INT = 2**31 - 1
MAX_FLOAT = 1e6


def _field(default=None, *, factory=None, choices=None, minimum=None, above=None, maximum=None, convert=None):
    """A dataclass field with its validation rules: `choices` (allowed values), `minimum` (>=), `above`
    (>), `maximum` (<=; default `MAX_INT` or `MAX_FLOAT`), `convert(value, key)` (a custom parser)."""
    metadata = {"choices": choices, "minimum": minimum, "above": above, "maximum": maximum, "convert": convert}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _names(items):
    return ", ".join(sorted(getattr(i, "name", i) for i in items))


def _check_keys(mapping, known, key, nested=None):
    """A `ConfigError` for the first name of `mapping` not in `known`, with the nearest key: one of `nested`
    (a function of no argument giving `{known name: the names it holds}`, called only for an unknown name) where
    the name is one level too high (`loss.margin` for `loss.params.margin`), else a close spelling here."""
    for name in mapping:
        if name not in known:
            where = f"{key}.{name}" if key else str(name)
            deeper = [
                f"{key}.{parent}.{name}" if key else f"{parent}.{name}"
                for parent, names in (nested() if nested else {}).items()
                if name in names
            ]
            close = deeper[:1] or difflib.get_close_matches(str(name), list(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"unknown configuration key '{where}'{hint}; valid keys here: {_names(known)}")


def _nested_names(cls):
    """`{field: the keys it holds}` of the fields of the dataclass `cls` that are sections, or loss arguments
    (`params`: the argument names some loss declares; the loss class checks them later)."""
    hints = typing.get_type_hints(cls)
    nested = {}
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        section = next((c for c in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(c)), None)
        if section is not None:
            nested[field.name] = {f.name for f in dataclasses.fields(section)}
        elif field.name.endswith("params"):
            nested[field.name] = _loss_argument_names()
    return nested


def _loss_argument_names():
    """Every argument name a tfdml loss declares (`ARGUMENTS`); imported only to suggest a key, as TensorFlow
    comes with the losses."""
    from tfdml import losses
    from tfdml.loss_names import LOSSES

    return {argument.name for name in LOSSES.values() for argument in getattr(losses, name).ARGUMENTS}


def _type_name(tp):
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if tp in names:
        return names[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        return " or ".join([_type_name(a) for a in args if a is not type(None)] + ["null"])
    if origin is list:
        return f"a list of {_type_name(args[0]).replace('an ', '').replace('a ', '')}s"
    return "a mapping"


def _convert(value, tp, key):
    """`value` as type `tp` (int, float, bool, str, Optional/List/Dict of these, a dataclass) or a
    `ConfigError` naming `key`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        if value is None:
            return None
        return _convert(value, next(a for a in args if a is not type(None)), key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    ok = None
    if tp is bool:
        ok = value if isinstance(value, bool) else None
    elif tp is int:
        ok = value if isinstance(value, int) and not isinstance(value, bool) else None
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ok = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                ok = float(value)
            except ValueError:
                ok = None
    elif tp is str:
        ok = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    elif origin is list:
        if isinstance(value, (list, tuple)):
            return [_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    elif origin is dict or tp is Any:
        if isinstance(value, dict) or tp is Any:
            return copy.deepcopy(value)
    if ok is None:
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    return ok


def number_bounds(meta, integer):
    """`(low, low included, high)` of a number field (high: its maximum, else `MAX_INT` / `MAX_FLOAT`)."""
    high = meta.get("maximum")
    high = (MAX_INT if integer else MAX_FLOAT) if high is None else high
    if meta.get("above") is not None:
        return meta["above"], False, high
    return meta.get("minimum"), True, high


def range_text(meta, integer):
    """`[1, 4096]`, `(0, 1]`: the range of a number field, as the messages state it."""
    low, included, high = number_bounds(meta, integer)
    text = lambda x: str(x) if isinstance(x, int) else f"{x:g}"  # noqa: E731
    return f"{'[' if included else '('}{'-inf' if low is None else text(low)}, {text(high)}]"


def _check_number(item, meta, key):
    low, included, high = number_bounds(meta, isinstance(item, int))
    inside = math.isfinite(item) and item <= high
    if low is not None:
        inside = inside and (item >= low if included else item > low)
    if not inside:
        kind = "an integer" if isinstance(item, int) else "a number"
        raise ConfigError(f"{key}: must be {kind} in {range_text(meta, isinstance(item, int))}, got {item!r}")


def _check_value(value, meta, key):
    items = [(f"{key}[{i}]", item) for i, item in enumerate(value)] if isinstance(value, list) else [(key, value)]
    for where, item in items:
        if item is None:
            continue
        choices = meta.get("choices")
        if choices and item not in choices:
            raise ConfigError(f"{where}: must be one of {', '.join(map(str, choices))}, got {item!r}")
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            _check_number(item, meta, where)


def _build(cls, mapping, key=""):
    """An instance of the dataclass `cls` from `mapping` (missing keys keep their defaults), validated."""
    if isinstance(mapping, cls):
        return mapping
    if not isinstance(mapping, dict):
        raise ConfigError(f"{key or 'the configuration'}: expected a mapping, got {mapping!r}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    _check_keys(mapping, known, key, lambda: _nested_names(cls))
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in mapping.items():
        where = f"{key}.{name}" if key else name
        meta = known[name].metadata
        try:
            value = meta["convert"](value, where) if meta.get("convert") else _convert(value, hints[name], where)
        except ConfigError:
            if meta.get("choices") and typing.get_origin(hints[name]) is list:
                raise ConfigError(
                    f"{where}: expected a list drawn from {', '.join(meta['choices'])} "
                    f"(e.g. [{meta['choices'][-1]}]), got {value!r}"
                ) from None
            raise
        _check_value(value, meta, where)
        values[name] = value
    instance = cls(**values)
    check = getattr(instance, "check", None)
    if check is not None:
        check(key)
    return instance


def _plain(value):
    """Dataclasses and tuples -> dicts and lists (YAML- and JSON-safe)."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _check_with_library(instance, key):
    """The second pass: `check_with_library(key)` of every section, nested ones first."""
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _check_with_library(value, f"{key}.{field.name}" if key else field.name)
    check = getattr(instance, "check_with_library", None)
    if check is not None:
        check(key)


class _Section:
    """Mapping-style helpers shared by every section."""

    @classmethod
    def from_dict(cls, mapping, key=None):
        key = cls._KEY if key is None else key
        instance = _build(cls, mapping, key)
        _check_with_library(instance, key)
        return instance

    def to_dict(self):
        return _plain(self)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def _check_arguments(function, params, key, skip=()):
    """`params` against the named arguments of `function`, a loss class: unknown names and values of the wrong
    kind (a number where the default is a number, true/false where it is a bool) are `ConfigError`s, and a
    number outside the range the class declares for it or a string outside its choices (`tfdml.losses.arguments`:
    its `ARGUMENTS`; a class or function without a declaration: the default range of every number)."""
    declaration = {a.name: a for a in getattr(function, "ARGUMENTS", ())}
    signature = inspect.signature(function)
    known = {
        name: p
        for name, p in signature.parameters.items()
        if name not in skip and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }
    _check_keys(params, known, key)
    for name, value in params.items():
        default = known[name].default
        ranges = declaration[name].range() if name in declaration else {}
        choices = declaration[name].choices if name in declaration else None
        if choices is not None and value not in choices:
            raise ConfigError(f"{key}.{name}: must be one of {', '.join(map(str, choices))}, got {value!r}")
        if isinstance(default, bool):
            _convert(value, bool, f"{key}.{name}")
        elif isinstance(default, (int, float)) and value is not None:
            number = _convert(value, int if isinstance(default, int) else float, f"{key}.{name}")
            _check_number(number, ranges, f"{key}.{name}")


def output_dir_problem(path, writable=False):
    """Why no folder can be made at `path` (a file in the way; with `writable`, no write permission on
    the nearest existing folder), or None."""
    path = os.path.abspath(os.fspath(path))
    current = path
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
    if not os.path.isdir(current):
        return (
            f"{current} is a file, not a folder"
            if current == path
            else f"{current} is a file, so the folder {path} cannot be made"
        )
    if writable:
        return _write_problem(path)
    return None


def _write_problem(path):
    """Why `path` cannot be made and written in, found by doing it: the folders are made, a file is
    written in the last and removed, and the folders made are removed again (permission bits alone miss
    read-only file systems, /proc, and root's rights)."""
    made = []
    try:
        missing, current = [], path
        while not os.path.isdir(current):
            missing.append(current)
            current = os.path.dirname(current)
        for folder in reversed(missing):
            os.mkdir(folder)
            made.append(folder)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        where = error.filename or path
        return f"cannot write in {path} ({error.strerror or error}: {where})"
    finally:
        for folder in reversed(made):
            try:
                os.rmdir(folder)
            except OSError:
                pass
    return None


def output_file_problem(path):
    """Why the file `path` cannot be written (a folder in the way, or its folder cannot be made or written
    in), or None; nothing is left behind."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return f"{path} is a folder, not a file"
    return output_dir_problem(os.path.dirname(path), writable=True)
