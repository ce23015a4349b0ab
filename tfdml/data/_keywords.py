"""Settings of `tfdml.data` declared once, as frozen dataclasses (`GlyphRendering`, `StreamOptions`): each
field's name and default is written there and checked when the object is made, and the functions that take the
settings accept the fields as keyword arguments of the same names (an unknown one is a `TypeError` naming it)."""

import dataclasses
import inspect


def takes_fields(options_class):
    """Decorator of a function that takes `options_class`'s fields through `**options`: its signature
    (`inspect.signature`, `help`, `tfdml.data.embedded_source`) lists each field as a keyword-only argument with
    its default in place of `**options`."""

    def decorate(function):
        signature = inspect.signature(function)
        named = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        kind = inspect.Parameter.KEYWORD_ONLY
        fields = [inspect.Parameter(f.name, kind, default=f.default) for f in dataclasses.fields(options_class)]
        function.__signature__ = signature.replace(parameters=named + fields)
        return function

    return decorate
