"""The run directory: whose it is, what a run may remove from it, and who may write it.

A run claims its directory by writing ``MARKER`` (what created it: the package version, the
time, the command) under the run's lock; a directory is a run's only when it says so. Only
what a run writes (``RUN_FILES`` and ``RUN_DIRS``' files, by name) is ever removed, and only
from a directory that is a run's: ``overwrite`` and the fresh start of a run stopped before
its first checkpoint refuse a directory that holds anything else, naming it, before they
remove anything. A directory written before runs had the marker is a run when it holds a
training state (``last.safetensors``): it resumes (and takes the marker), and is overwritten
when it holds nothing but a run's files; any other directory that is not empty is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import filelock

from seq2seq.errors import Seq2SeqError
from seq2seq.fileio import atomic_write_text, published_name, remove_temporaries
from seq2seq.run.checkpoint import (
    AVERAGED_FILE,
    BEST_FILE,
    CONFIG_FILE,
    KEPT_DIR,
    LAST_FILE,
    holds_training_state,
)
from seq2seq.version import __version__

MARKER = ".seq2seq-run.json"  # written when a run claims its directory
LOCK_FILE = ".lock"
_PROBE = ".write-test"

# What a run writes at its top level, and what its commands add (evaluate's scores, average's
# weights: a weights file loads with its run's config and tokenizer, so it goes with the run).
RUN_FILES = (
    CONFIG_FILE,
    BEST_FILE,
    LAST_FILE,
    AVERAGED_FILE,
    "metrics.jsonl",
    "data_summary.json",
    "environment.json",
    "train.log",
    "curves.png",
    "spm.model",
    "spm_src.model",
    "spm_tgt.model",
)
SCORES_GLOB = "hyps.*"  # `seq2seq evaluate`'s hypotheses and scores
WEIGHTS_GLOB = "*.safetensors"
_STORE = (("manifest.json",), ("*_ids.bin",), ("*_offsets.bin",))  # seq2seq.data.store's files
# A run's folders, each with the paths (name patterns, one a level) of the files it writes there:
# the tokenized corpus, its sampled segmentations (seq2seq.data.subword), the attention maps,
# TensorBoard's events, the kept weights.
RUN_DIRS: dict[str, tuple[tuple[str, ...], ...]] = {
    "data": _STORE,
    "subword": tuple(("epoch_*", *path) for path in _STORE),
    "attention": (("step_*", "sentence_*.png"), ("step_*", "sentence_*.json")),
    "tensorboard": (("events.out.tfevents.*",),),
    KEPT_DIR: (("step_*.safetensors",),),
}


@dataclass(frozen=True)
class Words:
    """How a message names the caller's options: the command line's or the Python API's."""

    resume: str
    overwrite: str
    out: str
    again: str  # the same request once more


FLAGS = Words("--resume", "--overwrite", "--out", "run the same command")
ARGUMENTS = Words("resume=True", "overwrite=True", "out", "call seq2seq.train again")


class RunLock:
    """An exclusive lock on ``run_dir/.lock`` (``filelock``: flock on POSIX, msvcrt on
    Windows), released by the operating system if the holder dies; it holds the holder's pid."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self.lock = filelock.FileLock(self.path, timeout=0)

    def __enter__(self) -> RunLock:
        try:
            self.lock.acquire()
        except filelock.Timeout:
            try:
                holder = self.path.read_text().strip() or "unknown"
            except OSError:
                holder = "unknown"
            raise Seq2SeqError(
                f"{self.path.parent} is in use by another training process (pid {holder})"
            ) from None
        with contextlib.suppress(OSError):  # a lock that cannot name its holder still locks
            self.path.write_text(str(os.getpid()))
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


@contextlib.contextmanager
def claimed(run_dir: Path, resume: bool, overwrite: bool, words: Words) -> Iterator[bool]:
    """Hold ``run_dir`` for one run: refused (one line) before anything is written, even the
    lock, when it must not be written; then locked, and ``prepare_run_dir``'d under the lock.
    Yields whether a run that stopped before its first checkpoint starts afresh."""
    _decide(run_dir, resume, overwrite, words)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / _PROBE
        probe.write_bytes(b"0" * 4096)
        probe.unlink()
    except OSError as e:
        raise Seq2SeqError(f"cannot write to {run_dir}: {e.strerror or e}") from None
    with RunLock(run_dir):
        yield prepare_run_dir(run_dir, resume, overwrite, words)


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool, words: Words) -> bool:
    """Under the run's lock: decide again what ``run_dir`` is to this run, remove what an
    earlier run wrote when it is overwritten or started afresh, and mark it as this run's.
    True when it is a run stopped before its first checkpoint, started afresh."""
    plan = _decide(run_dir, resume, overwrite, words)
    if plan in ("overwrite", "afresh"):
        clear_run_dir(run_dir)
    remove_temporaries(run_dir, _is_run_file)  # left by a process killed mid-write
    if plan != "resume" or not (run_dir / MARKER).is_file():
        _mark(run_dir, "resumed a run written before runs were marked" if plan == "resume" else "")
    return plan == "afresh"


def _mark(run_dir: Path, note: str) -> None:
    claim = {
        "created_by": f"seq2seq {__version__}",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": sys.argv,
        "pid": os.getpid(),
    }
    atomic_write_text(run_dir / MARKER, json.dumps(claim | ({"note": note} if note else {})))


def _decide(run_dir: Path, resume: bool, overwrite: bool, words: Words) -> str:
    """What this run does with ``run_dir``: "new" (absent or empty), "resume", "afresh" (a run
    of ours stopped before its first checkpoint), "overwrite"; raises where it may not."""
    if run_dir.exists() and not run_dir.is_dir():
        raise Seq2SeqError(f"cannot write to {run_dir}: not a directory")
    marked, last = (run_dir / MARKER).is_file(), run_dir / LAST_FILE
    ours = marked or (last.is_file() and holds_training_state(last))
    if resume:
        if last.is_file() and ours:
            return "resume"
        if marked and not _holds_weights(run_dir):
            raise Seq2SeqError(
                f"cannot resume: {run_dir} stopped before its first checkpoint; "
                f"{words.again} without {words.resume} to start it afresh"
            )
        if last.is_file():
            raise Seq2SeqError(f"cannot resume: {last} is not a training state of seq2seq")
        raise Seq2SeqError(f"cannot resume: {last} does not exist")
    entries = [p for p in run_dir.iterdir() if p.name != LOCK_FILE] if run_dir.exists() else []
    if not entries:
        return "new"
    if not ours:
        raise Seq2SeqError(
            f"{run_dir} already holds files and is not a seq2seq run (no {MARKER}): "
            f"{_listed(sorted(_name(p) for p in entries))}; nothing in it was changed; "
            f"train into a new or empty {words.out}"
        )
    afresh = marked and not _holds_weights(run_dir)
    if not (overwrite or afresh):
        raise Seq2SeqError(
            f"{run_dir} already holds a run; use {words.resume} to continue it or "
            f"{words.overwrite} to replace it"
        )
    foreign = foreign_entries(run_dir)
    if foreign:
        why = words.overwrite if overwrite else "starting afresh"
        raise Seq2SeqError(
            f"{run_dir} holds {_listed(foreign)}, which no run wrote, and {why} removes only "
            f"a run's files: move them out or train into another {words.out}; nothing was changed"
        )
    return "overwrite" if overwrite else "afresh"


def _name(path: Path) -> str:
    return path.name + ("/" if path.is_dir() and not path.is_symlink() else "")


def _listed(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _holds_weights(run_dir: Path) -> bool:
    return any(run_dir.glob(WEIGHTS_GLOB)) or any((run_dir / KEPT_DIR).glob(WEIGHTS_GLOB))


def _is_run_file(name: str) -> bool:
    return name in RUN_FILES or any(fnmatchcase(name, g) for g in (WEIGHTS_GLOB, SCORES_GLOB))


def _in_run_dir(parts: tuple[str, ...], patterns: tuple[tuple[str, ...], ...]) -> bool:
    """Whether ``parts`` (a file's path under a run's folder) is one the folder's ``patterns``
    name, or a temporary file on its way to one."""
    published = published_name(parts[-1])
    names = (*parts[:-1], published) if published else parts
    return any(
        len(names) == len(pattern) and all(map(fnmatchcase, names, pattern)) for pattern in patterns
    )


def _foreign_in(folder: Path, patterns: tuple[tuple[str, ...], ...]) -> list[Path]:
    """The files (and links) under a run's ``folder`` that no run writes there."""
    return [
        path
        for path in sorted(folder.rglob("*"))
        if path.is_symlink()
        or (not path.is_dir() and not _in_run_dir(path.relative_to(folder).parts, patterns))
    ]


def foreign_entries(run_dir: Path) -> list[str]:
    """What in ``run_dir`` no run wrote, by name (a folder's first such file): whatever a run
    replaces or removes must not hold any of it."""
    found = []
    for path in sorted(run_dir.iterdir()):
        if path.is_symlink():
            found.append(path.name)
        elif path.is_dir():
            patterns = RUN_DIRS.get(path.name)
            inside = _foreign_in(path, patterns) if patterns else [path]
            if inside:
                found.append(inside[0].relative_to(run_dir).as_posix() + ("/" * inside[0].is_dir()))
        elif path.name not in (LOCK_FILE, MARKER, _PROBE) and not _is_run_file(
            published_name(path.name) or path.name
        ):
            found.append(path.name)
    return found


def clear_run_dir(run_dir: Path) -> None:
    """Remove what an earlier run wrote into ``run_dir`` (it holds nothing else: see
    ``foreign_entries``), file by file, then the run's folders left empty; the marker and the
    lock stay."""
    for path in run_dir.iterdir():
        if path.is_file() and not path.is_symlink() and _is_run_file(path.name):
            path.unlink(missing_ok=True)
    for name, patterns in RUN_DIRS.items():
        folder = run_dir / name
        if not folder.is_dir() or folder.is_symlink():
            continue
        for path in sorted(folder.rglob("*"), reverse=True):  # a folder after its files
            if path.is_symlink():
                continue
            if not path.is_dir():
                if _in_run_dir(path.relative_to(folder).parts, patterns):
                    path.unlink(missing_ok=True)
            else:
                with contextlib.suppress(OSError):  # not empty: something else is in it
                    path.rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()


def clear_scores(run_dir: Path) -> list[str]:
    """Remove ``seq2seq evaluate``'s hypotheses and scores from ``run_dir`` (a resume that
    trains further: the weights they scored are being replaced); returns the names removed."""
    removed = sorted(p for p in run_dir.glob(SCORES_GLOB) if p.is_file() and not p.is_symlink())
    for path in removed:
        path.unlink(missing_ok=True)
    return [path.name for path in removed]
