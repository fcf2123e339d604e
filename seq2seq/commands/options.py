"""Options several ``seq2seq`` commands share, added the one way so that a name keeps one
meaning across commands (``tests/test_cli_names.py``): a TSV corpus's columns, the device,
and an option renamed, whose former name still works.
"""

from __future__ import annotations

import argparse
import sys

from seq2seq.config import DEFAULT_DEVICE
from seq2seq.config_checks import MAX_THREADS
from seq2seq.errors import WHOLE_NUMBER, finite_number, whole_number

DEVICE_HELP = (
    f"auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps (default: {DEFAULT_DEVICE})"
)


def whole_number_arg(text: str) -> int:
    """``type=`` of every integer option: ASCII digits only, as ``errors.whole_number`` reads
    them (``int()`` takes "٤" and "1_0")."""
    number = whole_number(text)
    if number is None:
        raise argparse.ArgumentTypeError(f"expected {WHOLE_NUMBER}, got {text!r}")
    return number


def port_arg(text: str) -> int:
    """``type=`` of a TCP port: 0 (any free one) to 65535, refused here rather than by the
    socket once the run has loaded."""
    number = whole_number_arg(text)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return number


def threads_arg(text: str) -> int:
    """``type=`` of ``--threads``: 1 to ``MAX_THREADS``, as ``train.threads`` is bounded."""
    number = whole_number_arg(text)
    if not 1 <= number <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_THREADS} threads, got {text!r}")
    return number


def finite_number_arg(text: str) -> float:
    """``type=`` of every real-valued option: a finite number in ASCII digits, as
    ``errors.finite_number`` reads it (``float()`` takes "nan", "inf" and "٠.٥")."""
    number = finite_number(text)
    if number is None:
        raise argparse.ArgumentTypeError(f"expected a finite number in ASCII digits, got {text!r}")
    return number


class _OldSpelling(argparse.Action):
    """An option's former name: it still works, with a note on stderr naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"note: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_option(p: argparse.ArgumentParser, name: str, old: str, **kwargs) -> None:
    """The option ``name`` (``kwargs`` as for ``add_argument``), also read under its former
    name ``old``, which ``--help`` no longer shows."""
    action = p.add_argument(name, **kwargs)
    p.add_argument(
        old,
        dest=action.dest,
        type=action.type,
        metavar=action.metavar,
        action=_OldSpelling,
        new=name,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


def add_columns_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--columns",
        metavar="SRC,TGT",
        help="the source and target columns of a TSV corpus, by position from 1 or header name, "
        "e.g. 1,2 (default: a header naming the languages, else the first two)",
    )


def add_device_option(p: argparse.ArgumentParser, default: str | None = DEFAULT_DEVICE) -> None:
    """``--device`` and ``--threads``; ``default`` None leaves the device to the config
    (``train.device``). ``main`` sets the threads for the process before a command runs."""
    p.add_argument("--device", default=default, help=DEVICE_HELP)
    p.add_argument(
        "--threads",
        type=threads_arg,
        help="torch's CPU threads (default: the usable CPUs; docs/decoding.md says when fewer "
        "decode faster)",
    )
