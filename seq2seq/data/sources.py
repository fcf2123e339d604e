"""A corpus's splits as readers of raw pairs, and the sources on disk: folders of line-aligned
``{split}.{lang}[.gz]`` files (the Multi30k layout) and TSV files or folders of them.

Every source (these, and the Hub's in ``seq2seq.data.hub``) gives ``{split name: SplitReader}``;
``seq2seq.data.registry`` chooses the source a ``--data`` names, ``seq2seq.data.corpora`` the splits.
Files are read a line at a time, never whole.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import itertools
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from seq2seq.data.tsv import LANG_CODE, tsv_layout, tsv_pairs
from seq2seq.errors import Seq2SeqError

VALIDATION_NAMES = ("validation", "valid", "val", "dev")  # in order of preference


@dataclass(frozen=True)
class SplitReader:
    """One split of a source: ``read()`` gives its raw pairs afresh at every call, one at a
    time; ``files`` are the files they come from."""

    read: Callable[[], Iterator[tuple[str, str]]]
    files: tuple[Path, ...]


def is_split_name(name: str) -> bool:
    return name == "train" or name in VALIDATION_NAMES or name.startswith("test")


def check_languages(held: list[str], src: str, tgt: str, description: str) -> None:
    for lang in (src, tgt):
        if lang not in held:
            raise Seq2SeqError(
                f"{description} has no '{lang}' side; languages it holds: {', '.join(sorted(held))}"
            )


def file_lines(path: Path) -> Iterator[str]:
    """The lines of a plain or gzipped UTF-8 file, one at a time, without their line ends."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            # Binary lines end at "\n" only: a lone "\r" or U+2028 inside a sentence must not
            # break alignment, as universal-newline or splitlines() reading would.
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise Seq2SeqError(f"{path}: invalid UTF-8 on line {number}") from None
                yield line.removesuffix("\n").rstrip("\r")
    except (gzip.BadGzipFile, EOFError, zlib.error):
        raise Seq2SeqError(f"{path} is not a valid gzip file") from None
    except OSError as e:
        raise Seq2SeqError(f"cannot read {path}: {e.strerror or e}") from None


def _head(path: Path) -> tuple[str, ...]:
    """The first line of a file (what ``tsv_layout`` reads), or () when it has none."""
    with contextlib.closing(file_lines(path)) as lines:
        return tuple(itertools.islice(lines, 1))


# ---------------------------------------------------------------------------------------
# Line-aligned files: {split}.{lang}[.gz]


def _aligned(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """The pairs of two line-aligned files; a one-line error when their lengths differ."""
    pairs = itertools.zip_longest(file_lines(src_path), file_lines(tgt_path))
    for n, (s, t) in enumerate(pairs):
        if s is None or t is None:  # one file ended after n lines: count the rest of the other
            rest = 1 + sum(1 for _ in pairs)
            n_src, n_tgt = (n + rest, n) if t is None else (n, n + rest)
            raise Seq2SeqError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}")
        yield s, t


def parallel_files(folder: Path) -> dict[str, dict[str, Path]]:
    """``{split}.{lang}`` / ``{split}.{lang}.gz`` files of a folder: split -> lang -> path."""
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        name = path.name.removesuffix(".gz")
        split, _, lang = name.rpartition(".")
        if path.is_file() and is_split_name(split) and LANG_CODE.fullmatch(lang):
            found.setdefault(split, {}).setdefault(lang, path)
    return found


def read_parallel_folder(folder: Path, src: str, tgt: str) -> tuple[str, dict[str, SplitReader]]:
    description = f"parallel text files in {folder}"
    files = parallel_files(folder)
    check_languages(
        sorted({lang for langs in files.values() for lang in langs}), src, tgt, description
    )

    readers = {
        split: SplitReader(
            functools.partial(_aligned, langs[src], langs[tgt]), (langs[src], langs[tgt])
        )
        for split, langs in files.items()
        if src in langs and tgt in langs
    }
    return description, readers


# ---------------------------------------------------------------------------------------
# TSV: a file (the training split) or a folder of {split}.tsv files


def _tsv_reader(path: Path, src: str, tgt: str, columns: str | None) -> SplitReader:
    def read() -> Iterator[tuple[str, str]]:
        return tsv_pairs(file_lines(path), path, tsv_layout(_head(path), path, src, tgt, columns))

    return SplitReader(read, (path,))


def read_tsv_source(
    path: Path, src: str, tgt: str, columns: str | None, notes: list[str]
) -> tuple[str, dict[str, SplitReader]]:
    if path.is_file():
        files = {"train": path}
        description = f"TSV file {path}"
    else:
        files = {
            p.name.removesuffix(".tsv"): p
            for p in sorted(path.glob("*.tsv"))
            if is_split_name(p.name.removesuffix(".tsv"))
        }
        description = f"TSV files in {path}"
    if "train" in files:  # its columns checked now, before any reading of the other splits
        layout = tsv_layout(_head(files["train"]), files["train"], src, tgt, columns)
        note = layout.note(files["train"], src, tgt)
        if note:
            notes.append(note)
    return description, {split: _tsv_reader(p, src, tgt, columns) for split, p in files.items()}
