"""Atomic writes: the destination is the old file or the whole new one, and no temp is left."""

import os
import tempfile
from pathlib import Path

import pytest

from seq2seq.fileio import atomic_path, atomic_write_bytes, atomic_write_text


def test_writes_create_parents_and_replace(tmp_path):
    path = tmp_path / "a" / "b" / "out.txt"
    assert atomic_write_text(path, "first ✓") == path
    assert path.read_text(encoding="utf-8") == "first ✓"
    atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert os.listdir(path.parent) == ["out.txt"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_temp_path_keeps_the_suffix_and_directory(tmp_path):
    with atomic_path(tmp_path / "figure.png") as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png"
        tmp.write_bytes(b"png")
    assert (tmp_path / "figure.png").read_bytes() == b"png"


def test_failure_keeps_the_old_file_and_removes_the_temp(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    path.chmod(0o600)
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer failed")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]
    atomic_write_text(path, "new")
    assert path.stat().st_mode & 0o777 == 0o600  # an existing file keeps its mode


def test_remove_temporaries_deletes_only_what_a_killed_write_left(tmp_path):
    from seq2seq.fileio import remove_temporaries

    kept = ["last.safetensors", ".lock", "metrics.jsonl", ".other-k2j3h4x9.safetensors"]
    for name in kept:
        (tmp_path / name).write_bytes(b"x")
    # the temporaries atomic_path makes on the way to these two, as a kill leaves them
    left = [
        Path(tempfile.mkstemp(dir=tmp_path, prefix=f".{stem}-", suffix=suffix)[1]).name
        for stem, suffix in (("last", ".safetensors"), ("config", ".yaml"))
    ]
    wanted = {"last.safetensors", "config.yaml", "metrics.jsonl"}.__contains__
    removed = remove_temporaries(tmp_path, wanted)
    assert sorted(p.name for p in removed) == sorted(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
