"""The one exception type the CLI turns into a one-line message and a non-zero exit, and the
one reading of a whole number typed by a user (an option, a form field, an HTTP header)."""

import re

_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII only: str.isdigit() takes "²", which int() refuses


class Seq2SeqError(Exception):
    """A user-facing error: bad input, bad data, a broken run directory.

    Raised anywhere in the library with a message that already says what is wrong
    and, where possible, what to do; ``seq2seq.commands.cli.main`` prints it as one line and
    exits with status 2. Programming errors stay ordinary exceptions.
    """


def whole_number(text: str) -> int | None:
    """``text`` as an int if it is ASCII digits only (at most 18 of them), else None."""
    return int(text) if _DIGITS.fullmatch(text) else None
