"""Every number of the configuration, fed bad values through `tfdml train --set`: NaN, infinities, a huge
value, a negative one and zero where the field's range excludes them, a string, and a fraction for an integer;
every field with a list of choices, a value that is none of them. Each must end in one line naming the key
(and, for a number, its range and the value; for a choice, the choices) and exit status 2, before any data
is read: in-process through the CLI's `main` for every field, and for a few in a real
subprocess."""

import dataclasses
import inspect
import subprocess
import sys
import typing

import pytest

from tests import cli_process
from tfdml import cli, losses, pipeline
from tfdml.config import DEFAULT_JOB, LOSSES, Config
from tfdml.config.schema import number_bounds


def _number_type(hint):
    """`(int or float, is a list)` for a numeric field's annotation, else None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, type(int | None)) and len(args) == 1:
        hint = args[0]
    if typing.get_origin(hint) is list:
        inner = typing.get_args(hint)[0]
        return (inner, True) if inner in (int, float) else None
    return (hint, False) if hint in (int, float) else None


def _leaf_fields(cls, prefix=""):
    """`(key, annotation, field)` of every value of the configuration, nested sections (also those that are
    null by default, e.g. loss.cross_batch_memory) walked into."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint, key = hints[field.name], f"{prefix}{field.name}"
        section = next((a for a in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(a)), None)
        if section is not None:
            yield from _leaf_fields(section, key + ".")
        else:
            yield key, hint, field


# `(key, int or float, is a list, field metadata)` of every number in the configuration.
FIELDS = [(key, *_number_type(hint), field.metadata) for key, hint, field in _leaf_fields(Config) if _number_type(hint)]
# `(key, choices)` of every field that takes one of a list of values.
CHOICE_FIELDS = [
    (key, tuple(field.metadata["choices"])) for key, _, field in _leaf_fields(Config) if field.metadata.get("choices")
]
DEFAULT_LOSS = getattr(losses, LOSSES[DEFAULT_JOB["loss"]["name"]])
LOSS_PARAMS = [
    name
    for name, p in inspect.signature(DEFAULT_LOSS).parameters.items()
    if isinstance(p.default, (int, float)) and not isinstance(p.default, bool)
]


def _bad_values(kind, meta):
    """`(YAML text, the value as the message shows it or None)` out of the field's range or of its type."""
    low, included, _ = number_bounds(meta, kind is int)
    values = [("abc", None)]
    if kind is int:  # not integers: the type is named
        values += [(".nan", None), (".inf", None), ("-.inf", None), ("1.5", None)]
        values.append(("1000000000000000000", "1000000000000000000"))
    else:
        values += [(".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf"), ("1e30", "1e+30")]
    for number in (-1, 0):
        if low is not None and (number < low or (number == low and not included)):
            values.append((str(number), str(number) if kind is int else f"{float(number)}"))
    return values


def _below_range(name):
    """A number below the loss argument's declared minimum: -3, or -1e5 for an argument that may be negative
    (RankedListLoss's tp lies in [-1e4, 1e4])."""
    argument = {a.name: a for a in DEFAULT_LOSS.ARGUMENTS}.get(name)
    bounds = {} if argument is None else argument.range()
    low = bounds.get("minimum", bounds.get("above"))
    return ("-3", "-3.0") if low is None or low > -3 else ("-1e5", "-100000.0")


CASES = [
    pytest.param(key, kind, is_list, text, shown, id=f"{key}={text}")
    for key, kind, is_list, meta in FIELDS
    for text, shown in _bad_values(kind, meta)
] + [
    pytest.param(f"loss.params.{name}", float, False, text, shown, id=f"loss.params.{name}={text}")
    for name in LOSS_PARAMS
    for text, shown in (_below_range(name), (".nan", "nan"), (".inf", "inf"), ("1e30", "1e+30"))
]


def test_every_number_has_a_stated_range():
    assert len(FIELDS) > 40  # every section's numbers were found
    for key, kind, _, meta in FIELDS:
        low, _, high = number_bounds(meta, kind is int)
        assert low is not None and high is not None, key


@pytest.fixture
def no_data(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("data read before the configuration was checked")

    monkeypatch.setattr(pipeline.job, "load_sources", refuse)
    monkeypatch.setattr(pipeline.data_lib, "embedded_source", refuse)


@pytest.mark.parametrize("key, kind, is_list, text, shown", CASES)
def test_bad_number_is_one_line_and_exit_2(key, kind, is_list, text, shown, no_data, capsys):
    value = f"[{text}]" if is_list else text
    assert cli.main(["train", "--set", f"{key}={value}"]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("tfdml train: error: ") and err.count("\n") == 1 and not captured.out, err
    assert f"{key}[0]" in err if is_list else key in err, err
    if shown is None:  # a string, or no integer for an integer: the type is named
        assert "expected" in err, err
    else:  # the range and the value
        assert f"got {shown}" in err and (" in [" in err or " in (" in err), err


def test_every_choice_field_is_found():
    keys = dict(CHOICE_FIELDS)
    assert {"data.source", "optimizer.name", "export.gallery_dtype", "export.match_mode"} <= set(keys)
    assert keys["export.match_mode"] == ("auto", "open", "closed")


@pytest.mark.parametrize("key, choices", CHOICE_FIELDS, ids=[key for key, _ in CHOICE_FIELDS])
def test_bad_choice_is_one_line_and_exit_2(key, choices, no_data, capsys):
    value = "not_a_choice"
    assert cli.main(["train", "--set", f"{key}={value}"]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("tfdml train: error: ") and err.count("\n") == 1 and not captured.out, err
    assert key in err and "not_a_choice" in err and choices[-1] in err, err


@pytest.mark.slow
def test_bad_numbers_in_real_processes(tmp_path):
    values = ["optimizer.learning_rate=.nan", "loss.params.margin=-3", "data.image_size=100000"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tfdml", "train", "--set", value],
            cwd=tmp_path,
            env=cli_process.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for value in values
    ]
    expected = [
        "optimizer.learning_rate: must be a number in (0, 100], got nan",
        "loss.params.margin: must be a number in [0, 180], got -3.0",
        "data.image_size: must be an integer in [1, 4096], got 100000",
    ]
    for proc, message in zip(procs, expected):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and err == f"tfdml train: error: {message}\n" and not out, err
    assert not list(tmp_path.iterdir())  # nothing made: no report folder, no data cache
