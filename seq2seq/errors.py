"""The one exception type the CLI turns into a one-line message and a non-zero exit, and the
one reading of a number typed by a user (an option, a ``--set`` or YAML value, a form field,
an HTTP header): ASCII digits only, and a float only when finite; and so the one reading of a
config value typed in a YAML file or a ``--set``, by the type of its field."""

import contextlib
import math
import re
import types
import typing
from typing import Any

import yaml

_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII only: str.isdigit() takes "²", which int() refuses
# float() also takes Unicode digits ("٠.٥"), underscores ("1_0"), "nan" and "inf"
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


WHOLE_NUMBER = "a whole number of at most 18 ASCII digits"


class Seq2SeqError(Exception):
    """A user-facing error: bad input, bad data, a broken run directory.

    Raised anywhere in the library with a message that already says what is wrong
    and, where possible, what to do; ``seq2seq.commands.cli.main`` prints it as one line and
    exits with status 2. Programming errors stay ordinary exceptions.
    """


def whole_number(text: str) -> int | None:
    """``text`` as an int if it is ASCII digits only (at most 18 of them), else None."""
    return int(text) if _DIGITS.fullmatch(text) else None


def finite_number(value: object) -> float | None:
    """``value`` as a finite float: an int or a float (not a bool), or text in ASCII decimal
    notation (``2e-3``, ``-.5``); else None: NaN and infinities (a decoding setting or a rate
    that is one fails far from where it was typed), a number beyond a float, other digits."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = float(value)  # "1e999" is inf, refused below
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int of 309 digits
            return None
    else:
        return None
    return number if math.isfinite(number) else None


class _TextLoader(yaml.SafeLoader):
    """YAML whose plain scalars stay the text typed, null alone read as None: each field's
    type reads its text (``read_field``) as the flag of that field reads it, so ``src: no`` is a
    language and not YAML 1.1's false, ``010`` is ten, and ``0x1F``, ``1_000`` or ``1:30``
    are not numbers at all."""


_TextLoader.yaml_implicit_resolvers = {}
_TextLoader.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
# YAML 1.2's spellings (true, True, TRUE, ...); yes, no, on and off are words
_BOOLEANS = {s: b for b in (True, False) for s in (str(b).lower(), str(b), str(b).upper())}


def read_yaml(text: str) -> Any:
    """``text`` as YAML, its scalars left as text for the config's fields to read."""
    return yaml.load(text, Loader=_TextLoader)  # a SafeLoader: no Python objects


def read_field(value: Any, annotation: Any, where: str) -> Any:
    """``value`` as a config field of type ``annotation`` (named ``where``) takes it: a value
    of that type, or text read the way a flag of that type reads it (``whole_number``,
    ``finite_number``); else a one-line error naming the field."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        *first, last = [a for a in args if a is not type(None)]
        for inner in first:  # bool | str: "true" is a bool, "auto" the text
            with contextlib.suppress(Seq2SeqError):
                return read_field(value, inner, where)
        return read_field(value, last, where)
    if origin is tuple:
        if isinstance(value, str):  # a --set value: "[0.9, 0.98]"
            with contextlib.suppress(yaml.YAMLError):
                value = read_yaml(value)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise Seq2SeqError(
                f"config {where}: expected a list of {len(args)} values, got {value!r}"
            )
        return tuple(read_field(v, a, where) for v, a in zip(value, args, strict=False))
    if annotation is bool:
        if isinstance(value, bool) or (isinstance(value, str) and value in _BOOLEANS):
            return _BOOLEANS.get(value, value)
        raise Seq2SeqError(f"config {where}: expected true or false, got {value!r}")
    if annotation is int:  # what a flag could have typed, from Python too: no sign, 18 digits
        text = value if isinstance(value, str) else str(value) if type(value) is int else ""
        number = whole_number(text)
        if number is not None:
            return number
        raise Seq2SeqError(f"config {where}: expected {WHOLE_NUMBER}, got {value!r}")
    if annotation is float:
        number = finite_number(value)
        if number is None:
            raise Seq2SeqError(
                f"config {where}: expected a finite number in ASCII digits, got {value!r}"
            )
        return number
    if annotation is str:
        if isinstance(value, str):
            return value
        raise Seq2SeqError(f"config {where}: expected a string, got {value!r}")
    return value
