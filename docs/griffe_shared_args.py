"""Griffe extension (mkdocstrings' `extensions:` in mkdocs.yml) that reads tfdml's docstrings as they are written:

- Arguments that share a meaning are documented on one line, `name, version: the exported model`, which the
  Google style reads as one argument called "name, version" that the signature lacks. Such a line becomes one
  entry per name with the shared text before the docstring is parsed, so each argument is listed, and a name
  that is not in the signature still warns (and fails `mkdocs build --strict`).
- An argument documented as `as in `function`` (a class pointing at the function it wraps, or a function
  pointing at the settings class that declares its keywords, in the same module) gets that object's
  description of the argument, so the reference says what it is.
- `Example:` sections hold doctests: they are read as the Google style's `Examples:` (code, not prose).
- Attributes set in a method, without a docstring (`self.t1 = float(t1)`), are left out of the reference: the
  constructor's arguments document them.
"""

import re

import griffe

_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Keyword Args|Other Parameters):\s*$")
_SHARED = re.compile(r"^(\s+)(\*{0,2}\w+(?:,\s*\*{0,2}\w+)+),?\s*(?::\s*(.*))?$")


def split_shared_arguments(text, signature=None):
    """`text` with every `a, b: description` entry of an Args section written as `a: description` and
    `b: description` (continuation lines, also a name list continued on the next line, are kept). With
    `signature` (the names a function takes, for one that takes `**kwargs`), the names it lacks move to an
    "Other Parameters" section: they are passed on through `**kwargs`."""
    lines, out, i, in_args, entry_indent = text.split("\n"), [], 0, False, None
    passed_on = []
    while i < len(lines):
        line = lines[i]
        header = _SECTION.match(line)
        if header:
            in_args, entry_indent = True, None
            out.append(line)
            i += 1
            continue
        if in_args and line.strip() and entry_indent is None:
            entry_indent = len(line) - len(line.lstrip())
        indent = len(line) - len(line.lstrip())
        if in_args and line.strip() and indent < (entry_indent or 0):
            in_args = False
        match = _SHARED.match(line) if in_args and indent == entry_indent else None
        if not match:
            out.append(line)
            i += 1
            continue
        names, description = match.group(2), match.group(3)
        i += 1
        continued = []
        while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > indent:
            continued.append(lines[i])
            i += 1
        if description is None and continued:  # the name list goes on on the next line
            more = continued.pop(0).strip()
            more_names, _, description = more.partition(":")
            names = f"{names}, {more_names}"
            description = description.strip()
        for name in (n.strip() for n in names.split(",") if n.strip()):
            target = passed_on if signature is not None and name not in signature else out
            target.append(f"{' ' * indent}{name}: {description or ''}")
            target.extend(continued)
    if passed_on:
        while out and not out[-1].strip():
            out.pop()
        out += ["", "Other Parameters:", *passed_on]
    return "\n".join(out)


def _signature(function):
    """The parameter names of a function that takes `**kwargs`, else None."""
    if function is None or not any(p.kind and p.kind.value == "variadic keyword" for p in function.parameters):
        return None
    return {p.name for p in function.parameters}


_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)
_AS_IN = re.compile(r"^(\s+)(\w+): (.*?)as in `(\w+)`\.?\s*$")


def argument_descriptions(text):
    """`{argument: its description, continuation lines joined}` of a docstring's Args section."""
    found, current, indent, in_args = {}, None, None, False
    for line in split_shared_arguments(text).split("\n"):
        if _SECTION.match(line):
            in_args, indent = True, None
            continue
        if not in_args or not line.strip():
            current = None if not line.strip() else current
            continue
        here = len(line) - len(line.lstrip())
        indent = here if indent is None else indent
        if here < indent:
            in_args = False
        elif here == indent and ":" in line:
            current, _, description = line.strip().partition(":")
            found[current] = description.strip()
        elif current is not None:
            found[current] += " " + line.strip()
    return found


def resolve_as_in(text, lookup):
    """`name: as in `f`` lines of `text` with `f`'s description of `name` (`lookup(f)`: its docstring or
    None), the pointer kept after it; lines whose function or argument is not found stay as they are."""
    out = []
    for line in text.split("\n"):
        match = _AS_IN.match(line)
        source = lookup(match.group(4)) if match else None
        described = argument_descriptions(source).get(match.group(2)) if source else None
        if described:
            line = f"{match.group(1)}{match.group(2)}: {described} (as in `{match.group(4)}`)"
        out.append(line)
    return "\n".join(out)


def _rewrite(docstring, function, module=None):
    if docstring is not None:
        text = _EXAMPLE.sub(r"\1Examples:", docstring.value)
        text = split_shared_arguments(text, _signature(function)) if "," in text else text
        if module is not None and "as in `" in text:

            def lookup(name):
                member = module.members.get(name)
                return member.docstring.value if member is not None and member.docstring else None

            text = resolve_as_in(text, lookup)
        docstring.value = text


class SharedArguments(griffe.Extension):
    def on_function_instance(self, *, func, **kwargs):  # `as in` a class or function of the same module
        _rewrite(func.docstring, func, func.parent if func.parent is not None and func.parent.is_module else None)

    def on_class_members(self, *, cls, **kwargs):  # after __init__ is known: its docstring is the class's
        init = cls.members.get("__init__")
        _rewrite(cls.docstring, None if init is None or init.is_alias else init, cls.parent)
        for name, member in list(cls.members.items()):
            # Set in a method only (a dataclass field is also a class attribute, and its __init__ argument).
            if not member.is_alias and member.is_attribute and member.labels == {"instance-attribute"}:
                if member.docstring is None:
                    del cls.members[name]

    def on_module_members(self, *, mod, **kwargs):
        _rewrite(mod.docstring, None)
