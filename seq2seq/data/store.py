"""Tokenized pairs on disk: written once, then read by every start of a run.

The layout is fairseq's: per side, the subword ids of all pairs end to end in one flat
array (``src_ids.bin``: uint16 when the vocabulary has at most 65,536 pieces, else int32)
and the offset where each pair starts (``src_offsets.bin``, int64, one more than there
are pairs, so pair ``i`` is ``ids[offsets[i]:offsets[i + 1]]``). A batch reads only its
own pairs' bytes (``PairStore``), the page cache keeps what is hot, and every process that
reads the same files (the ranks of ``torchrun``, a resumed run, data-loading workers)
shares that one copy in memory. Raw rather than ``.npy``:
the number of ids is known only when the last pair is written, and an ``.npy`` header
states its shape first; ``manifest.json`` says what the arrays hold instead.

The arrays are written under temporary names and renamed into place when whole; the
manifest is written after them, atomically, and a new store begins by removing the old
manifest. So a directory whose manifest is missing, unreadable or disagrees with its
arrays' sizes (a preparation interrupted at any moment) is never read: ``read_manifest``
returns None for it, and the caller writes the store again.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from seq2seq.fileio import atomic_path, atomic_write_text, published_name

MANIFEST = "manifest.json"
FORMAT = 1  # of the arrays and of the manifest's fields on them: a store of another is rebuilt
SIDES = ("src", "tgt")


def ids_dtype(vocab_size: int) -> np.dtype:
    """The narrowest array type that holds every id of a vocabulary of ``vocab_size``."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


def _ids_file(side: str) -> str:
    return f"{side}_ids.bin"


def _offsets_file(side: str) -> str:
    return f"{side}_offsets.bin"


_FILES = [name(side) for side in SIDES for name in (_ids_file, _offsets_file)]


def _canonical(values: np.ndarray) -> bytes:
    """Ids and offsets as the digest reads them: int64, whatever type the file stores."""
    return values.astype(np.int64).tobytes()


def _combined(hashes: dict[str, Any]) -> str:
    return hashlib.sha256("".join(hashes[n].hexdigest() for n in _FILES).encode()).hexdigest()


def digest(directory: Path, manifest: dict[str, Any]) -> str:
    """The sha256 of a whole store's pairs (``manifest["sha256"]`` of a store written since
    there was one), read from its arrays: equal for two stores of the same pairs."""
    dtypes = {_ids_file(s): np.dtype(manifest["dtype"]) for s in SIDES}
    hashes = {name: hashlib.sha256() for name in _FILES}
    for name in _FILES:
        dtype = dtypes.get(name, np.dtype(np.int64))
        with open(directory / name, "rb") as f:
            while chunk := f.read(dtype.itemsize << 20):
                hashes[name].update(_canonical(np.frombuffer(chunk, dtype)))
    return _combined(hashes)


class PairWriter:
    """Appends encoded pairs to the arrays of a new store (see ``write_pairs``)."""

    def __init__(self, files: dict[str, BinaryIO], dtype: np.dtype) -> None:
        self.files, self.dtype = files, dtype
        self.hashes = {name: hashlib.sha256() for name in _FILES}  # what the pairs are: digest()
        self.n_pairs = 0
        self.n_ids = dict.fromkeys(SIDES, 0)
        for side in SIDES:  # every pair's start, the first one's included
            self._write(_offsets_file(side), np.zeros(1, np.int64))

    def append(self, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]]) -> None:
        """Add pairs: the source and target ids of each (no BOS/EOS)."""
        if len(src_ids) != len(tgt_ids):
            raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
        for side, ids in zip(SIDES, (src_ids, tgt_ids), strict=True):
            lengths = np.fromiter(map(len, ids), np.int64, len(ids))
            flat = np.fromiter(itertools.chain.from_iterable(ids), self.dtype, int(lengths.sum()))
            self._write(_ids_file(side), flat)
            self._write(_offsets_file(side), self.n_ids[side] + np.cumsum(lengths))
            self.n_ids[side] += len(flat)
        self.n_pairs += len(src_ids)

    def _write(self, name: str, values: np.ndarray) -> None:
        self.files[name].write(values.tobytes())
        self.hashes[name].update(_canonical(values))

    def description(self) -> dict[str, Any]:
        """What the arrays hold: the manifest's fields that ``read_manifest`` checks."""
        return {
            "format": FORMAT,
            "pairs": self.n_pairs,
            "dtype": self.dtype.name,
            "ids": self.n_ids,
            "sha256": _combined(self.hashes),  # the same pairs give the same, any id dtype
        }


@contextlib.contextmanager
def write_pairs(directory: Path, dtype: np.dtype) -> Iterator[PairWriter]:
    """A writer of a new store in ``directory``, whose arrays appear (renamed from
    temporary files) only when the block ends without an error. An earlier store there
    goes first (``remove_store``); the caller writes the new manifest (``write_manifest``)
    after the block."""
    remove_store(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        files = {}
        for name in _FILES:
            tmp = stack.enter_context(atomic_path(directory / name))
            files[name] = stack.enter_context(open(tmp, "wb"))  # closed before its rename
        yield PairWriter(files, dtype)


def remove_store(directory: Path) -> None:
    """Remove the store in ``directory``, its manifest first, then its arrays and the
    temporaries of their writing, then the folder if that left it empty: only the files a
    store is made of go, whatever else the folder holds."""
    (directory / MANIFEST).unlink(missing_ok=True)
    if not directory.is_dir() or directory.is_symlink():
        return
    for path in directory.iterdir():
        name = published_name(path.name) or path.name
        if name in (MANIFEST, *_FILES) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: what is left is not the store's
        directory.rmdir()


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Publish the store: the manifest, atomically, after its arrays."""
    atomic_write_text(directory / MANIFEST, json.dumps(manifest) + "\n")


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a whole store in ``directory``, or None: no manifest (never
    written, or its writing interrupted), an unreadable one, another format, or arrays
    whose sizes disagree with it."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT:
            return None
        itemsize = np.dtype(manifest["dtype"]).itemsize
        expected = {_offsets_file(side): (manifest["pairs"] + 1) * 8 for side in SIDES}
        expected.update({_ids_file(s): manifest["ids"][s] * itemsize for s in SIDES})
        if any((directory / name).stat().st_size != size for name, size in expected.items()):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return manifest


class PairStore:
    """The pairs of a store: their lengths in memory, their ids read from disk as asked.

    ``src_lengths``/``tgt_lengths``: int32 subword ids per pair, EOS not counted.

    A batch's pairs are read with ``os.pread``, not through a memory map: a mapped page
    counts in the resident memory of the process that touched it, and a page fault maps
    its cached neighbours too (the kernel's fault-around, 64 KB), so random batches of a
    5M-pair store had mapped 260 MB more into the trainer after 20 steps, and would have
    mapped all of it in an epoch. Read, the same bytes stay in the page cache, shared by
    every process and run that reads them and given back under pressure, counted to none.
    """

    def __init__(self, directory: Path, dtype: str) -> None:
        self.directory, self.dtype = Path(directory), np.dtype(dtype)
        self.src_lengths, self.tgt_lengths = (self._lengths(side) for side in SIDES)

    def _lengths(self, side: str) -> np.ndarray:
        # int32: half of int64's memory; the offsets are read again pair by pair
        offsets = np.fromfile(self.directory / _offsets_file(side), dtype=np.int64)
        return np.diff(offsets).astype(np.int32)

    def __len__(self) -> int:
        return len(self.src_lengths)

    def __reduce__(self) -> tuple:
        # A worker process given the store reads the same files, rather than receiving a
        # copy of the lengths.
        return PairStore, (self.directory, self.dtype.name)

    def pairs(self, indices: Iterable[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The source and target ids (int64 arrays, no BOS/EOS) of the pairs at ``indices``."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"pair indices must be in [0, {len(self)})")
        src, tgt = (self._side(side, indices.tolist()) for side in SIDES)
        return src, tgt

    def _side(self, side: str, indices: list[int]) -> list[np.ndarray]:
        size = self.dtype.itemsize
        found = []
        with (
            _opened(self.directory / _ids_file(side)) as ids,
            _opened(self.directory / _offsets_file(side)) as offsets,
        ):
            for i in indices:  # pair i: ids[offsets[i]:offsets[i + 1]]
                start, end = np.frombuffer(_read_at(offsets, 16, 8 * i), np.int64).tolist()
                data = _read_at(ids, (end - start) * size, start * size)
                found.append(np.frombuffer(data, self.dtype).astype(np.int64))
        return found


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        yield fd
    finally:
        os.close(fd)


def _read_at(fd: int, n: int, offset: int) -> bytes:
    """``n`` bytes of the file ``fd`` from ``offset``, without moving a shared position
    (``os.pread``; where there is none, as on Windows, a seek and a read on this descriptor
    of this call's own)."""
    if hasattr(os, "pread"):
        data = os.pread(fd, n, offset)
    else:
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, n)
    if len(data) != n:
        raise OSError(f"store file ended early: {n} bytes asked at {offset}, {len(data)} read")
    return data
