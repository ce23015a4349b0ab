"""What each configuration key means, read from one place: the comments the sections give their fields (the
comment lines right above a field and the comment at the end of its line). `tfdml train --print-config` prints
them as YAML comments, and the generated page of the configuration keys shows them. No TensorFlow is imported
here."""

import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize
import typing

import yaml

# Keys of `model` that only a multilevel model reads (a single-level one has one head on the last feature map).
MULTILEVEL_ONLY = ("taps", "levels", "level_weights", "head_filters", "head_units")

_WIDTH = 100  # of a printed comment line, indentation included


@functools.cache
def _own_comments(cls):
    source = inspect.getsource(cls)
    comment_at = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    comments, above = {}, []
    for number, text in enumerate(source.splitlines(), 1):
        if text.strip().startswith("#"):
            above.append(comment_at[number])
            continue
        match = re.match(r"    (\w+)\s*:", text)  # a field of the class body
        if match:
            comments[match.group(1)] = " ".join([*above, comment_at.get(number, "")]).strip()
        above = []
    return comments


def field_comments(cls):
    """`{field: comment}` of the dataclass `cls`, also for the fields it takes from the dataclasses it extends
    (`ala.params`: `tfdml.ala_options.ALAOptions`)."""
    comments = {}
    for base in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        comments.update(_own_comments(base))
    return comments


def section_class(tp):
    """The dataclass a field's type holds (also behind `X | None`), or None."""
    for candidate in (tp, *typing.get_args(tp)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def section_summary(cls):
    """The first paragraph of a section's docstring, on one line ("" for dataclasses' generated one)."""
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def shown_config(config):
    """`config.to_dict()` without the keys that its settings leave unread (a single-level model's levels and
    auxiliary heads), as `--print-config` shows it."""
    plain = config.to_dict()
    if plain["model"]["type"] == "single":
        plain["model"] = {key: value for key, value in plain["model"].items() if key not in MULTILEVEL_ONLY}
    return plain


def commented_yaml(config):
    """The YAML of `shown_config(config)` with each key's description as a comment above it; it loads back to
    the same mapping."""
    lines = []
    _section_lines(type(config), shown_config(config), "", lines)
    return "\n".join(lines) + "\n"


def _comment(text, indent, lines):
    for line in textwrap.wrap(text, width=_WIDTH - len(indent) - 2, break_on_hyphens=False):
        lines.append(f"{indent}# {line}")


def _section_lines(cls, mapping, indent, lines):
    comments = field_comments(cls)
    hints = typing.get_type_hints(cls)
    for key, value in mapping.items():
        child = section_class(hints[key])
        if child is not None and isinstance(value, dict):
            if lines and indent == "":
                lines.append("")
            _comment(" ".join(filter(None, [comments.get(key, ""), section_summary(child)])), indent, lines)
            lines.append(f"{indent}{key}:")
            _section_lines(child, value, indent + "  ", lines)
            continue
        _comment(comments.get(key, ""), indent, lines)
        lines.append(f"{indent}{key}: {_flow(value)}")


def _flow(value):
    """`value` as one line of YAML (a scalar, or a list or mapping in flow style)."""
    text = yaml.safe_dump(value, sort_keys=False, default_flow_style=True, width=10**6, allow_unicode=True).strip()
    return text.removesuffix("...").strip()  # PyYAML ends a lone scalar with the document end marker
