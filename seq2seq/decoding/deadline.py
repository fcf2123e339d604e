"""A deadline for decoding, for a caller that must answer in time (``seq2seq serve``).

Within ``deadline(at)``, every search step (``seq2seq.decoding.search``) and every pass of
``influence.occlude`` calls ``check_deadline``, which raises ``DeadlinePassed`` once ``at`` is
past: the work stops there and its memory is freed. Without a deadline the check is a
context-variable lookup. It lives here, below the searches that check it, rather than beside
the server that sets it: the decoding layer cannot import the server's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# A context variable, not an argument: the deadline crosses every layer between a server
# and the loops (records, occlusion, interventions), and each thread has its own.
_DEADLINE: ContextVar[float | None] = ContextVar("seq2seq_deadline", default=None)


class DeadlinePassed(Exception):
    """Decoding was still running at the time ``deadline`` set."""


@contextmanager
def deadline(at: float) -> Iterator[None]:
    """Within it, decoding still running at ``at`` (``time.monotonic()`` seconds) raises
    ``DeadlinePassed`` at its next step: the work stops there and its memory is freed."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_deadline() -> None:
    """Raise ``DeadlinePassed`` if a ``deadline`` is set and over."""
    at = _DEADLINE.get()
    if at is not None and time.monotonic() > at:
        raise DeadlinePassed("decoding ran past its deadline")
