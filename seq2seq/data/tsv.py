"""TSV corpora: which columns hold the two languages, and the pairs on a file's lines.

A file may hold more columns than the two languages (Tatoeba exports: English, French,
attribution). The two are chosen by ``columns`` (``"1,2"`` or ``"en,fr"``: positions from 1
or header names, source first), else by a header line naming the languages, else they are
the first two columns; the rest are ignored, and ``TsvLayout.note`` says so. Every line
must have as many columns as the first: a tab inside a sentence would shift its pair.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from seq2seq.errors import Seq2SeqError, whole_number

LANG_CODE = re.compile(r"[a-z]{2,3}([_-][A-Za-z0-9]{2,4})?")


@dataclass(frozen=True)
class TsvLayout:
    src: int  # the source column, from 0
    tgt: int
    width: int  # columns on every line
    header: list[str]  # the header line's cells; [] when the file has none

    def note(self, path: Path, src: str, tgt: str) -> str | None:
        """One line on the columns left out, or None when every column is used."""
        if self.width <= 2:
            return None
        return (
            f"{path.name} has {self.width} columns: {src} from column {self.src + 1}, "
            f"{tgt} from column {self.tgt + 1}, the other {self.width - 2} ignored "
            "(--columns or data.columns chooses)"
        )


def _has_header(first: list[str], src: str, tgt: str, names: list[str]) -> bool:
    if src in first and tgt in first or names and all(name in first for name in names):
        return True
    return len(first) >= 2 and all(LANG_CODE.fullmatch(cell) for cell in first)


def tsv_layout(
    lines: tuple[str, ...], path: Path, src: str, tgt: str, columns: str | None = None
) -> TsvLayout:
    """Where ``src`` and ``tgt`` are in a file of these ``lines``; see the module docstring."""
    first = [cell.strip() for cell in lines[0].split("\t")] if lines else ["", ""]
    wanted = [c.strip() for c in columns.split(",")] if columns else []
    if columns and (len(wanted) != 2 or wanted[0] == wanted[1] or not all(wanted)):
        raise Seq2SeqError(
            f"--columns {columns}: give two different columns, source first, each a position "
            "from 1 or a header name, e.g. --columns 1,2"
        )
    header = (
        first
        if _has_header(first, src, tgt, [w for w in wanted if whole_number(w) is None])
        else []
    )
    if not wanted and header:
        for lang in (src, tgt):
            if lang not in header:
                held = ", ".join(sorted(header))
                raise Seq2SeqError(f"{path} has no '{lang}' side; languages it holds: {held}")
        wanted = [src, tgt]

    def index(column: str) -> int:
        position = whole_number(column)
        if position is not None and 1 <= position <= len(first):
            return position - 1
        if column in header:
            return header.index(column)
        names = f"; its header: {', '.join(header)}" if header else ", and no header line"
        raise Seq2SeqError(f"{path} has no column '{column}' (line 1 has {len(first)}{names})")

    src_column, tgt_column = (index(c) for c in wanted) if wanted else (0, 1)
    return TsvLayout(src_column, tgt_column, max(len(first), 2), header)


def tsv_pairs(lines: Iterable[str], path: Path, layout: TsvLayout) -> Iterator[tuple[str, str]]:
    """The (source, target) pair of every line after the header, one line at a time (a file
    larger than memory streams); an empty line gives an empty pair (counted later)."""
    n_header = 1 if layout.header else 0
    for number, line in enumerate(lines, start=1):
        if number <= n_header:
            continue
        if not line.strip():
            yield "", ""
            continue
        cells = line.split("\t")
        if len(cells) != layout.width:
            raise Seq2SeqError(
                f"{path}: line {number} has {len(cells)} tab-separated columns, "
                f"expected {layout.width}"
            )
        yield cells[layout.src], cells[layout.tgt]
