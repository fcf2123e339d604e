"""The one exception type the CLI turns into a one-line message and a non-zero exit, and the
one reading of a number typed by a user (an option, a ``--set`` or YAML value, a form field,
an HTTP header): ASCII digits only, and a float only when finite."""

import math
import re

_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII only: str.isdigit() takes "²", which int() refuses
# float() also takes Unicode digits ("٠.٥"), underscores ("1_0"), "nan" and "inf"
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


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
