"""Atomic file writes: a reader sees the old file or the whole new one, never half of one.

Every writer goes through ``atomic_path``: write to a temporary file in the destination's
directory (same filesystem, so the rename is atomic), fsync it, then ``os.replace`` it onto
the destination. A failure part-way leaves the destination untouched and removes the
temporary file.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

# mkstemp creates files 0600; the files we publish (figures, reports, checkpoints) are
# meant to be read by others, like any file written with open().
_NEW_FILE_MODE = 0o644


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path``.

    The temporary file keeps ``path``'s suffix so tools that infer a format from the
    name (matplotlib, PIL) still do. Missing parent directories are created. An existing
    destination keeps its permission bits.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        mode = path.stat().st_mode & 0o7777 if path.exists() else _NEW_FILE_MODE
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (UTF-8 unless told otherwise); return the path."""
    return atomic_write_bytes(path, text.encode(encoding))


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform/filesystem allows it.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def published_name(name: str) -> str | None:
    """The file that ``name`` is ``atomic_path``'s temporary for (``.last-k3j_9x2a.safetensors``
    is on its way to ``last.safetensors``), or None when it is no such temporary."""
    match = re.fullmatch(r"\.(.+)-[a-z0-9_]{8}(\.[^.]+)?", name)  # mkstemp's 8 random letters
    return match[1] + (match[2] or "") if match else None


def remove_temporaries(directory: str | Path, wanted: Callable[[str], bool]) -> list[Path]:
    """Delete the temporary files ``atomic_path`` left in ``directory`` when a process died
    mid-write to a file whose name ``wanted`` accepts (the published files themselves are
    never touched); returns what it removed."""
    removed = []
    for path in sorted(Path(directory).iterdir()):
        published = published_name(path.name)
        if published and wanted(published) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
