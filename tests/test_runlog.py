"""What a run records of the code that ran: the commit, whether the package's files are that
commit's, and a digest of the files themselves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from helpers import child_env

import seq2seq
from seq2seq.run.runlog import code_of, code_sha256, machine, write_environment
from seq2seq.run.runtime import Runtime


def git(checkout: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
        env=child_env(),
    )
    return done.stdout.strip()


def test_a_run_names_its_commit_whether_its_files_are_that_commit_and_their_digest(tmp_path):
    checkout, package = tmp_path / "checkout", tmp_path / "checkout" / "pkg"
    package.mkdir(parents=True)
    (checkout / ".gitignore").write_text("__pycache__/\n")
    (package / "a.py").write_text("x = 1\n")
    git(checkout, "init", "-q")
    git(checkout, "add", ".")
    git(checkout, "commit", "-qm", "one")
    first = git(checkout, "rev-parse", "HEAD")
    clean = code_of(package)
    assert clean == {"git_commit": first, "git_dirty": False, "code_sha256": code_sha256(package)}

    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")  # not the code
    assert code_of(package) == clean
    (package / "a.py").write_text("x = 2\n")  # an uncommitted change
    changed = code_of(package)
    assert changed["git_commit"] == first and changed["git_dirty"] is True
    assert changed["code_sha256"] != clean["code_sha256"]
    (package / "a.py").write_text("x = 1\n")
    (package / "b.py").write_text("")  # an untracked module is code that may run
    assert code_of(package)["git_dirty"] is True
    (package / "b.py").unlink()
    assert code_of(package) == clean  # the same files, the same digest

    # A copy whose .git is older than its files (the second commit's files, the first's HEAD)
    (package / "a.py").write_text("x = 2\n")
    git(checkout, "commit", "-qam", "two")
    git(checkout, "reset", "-q", "--mixed", first)
    stale = code_of(package)
    assert stale["git_commit"] == first and stale["git_dirty"] is True
    assert stale["code_sha256"] == changed["code_sha256"]  # the files name the code that ran


def test_outside_a_git_checkout_only_the_digest_names_the_code(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    found = code_of(tmp_path)
    assert found == {"git_commit": None, "git_dirty": None, "code_sha256": code_sha256(tmp_path)}


def test_every_record_carries_the_code_of_the_package_imported(tmp_path):
    here = Path(seq2seq.__file__).resolve().parent
    assert machine()["code_sha256"] == code_sha256(here)
    write_environment(tmp_path, Runtime(device=torch.device("cpu")), "fp32", None)
    [segment] = json.loads((tmp_path / "environment.json").read_text())["segments"]
    assert segment["code_sha256"] == code_sha256(here)
    assert segment["git_dirty"] in (True, False, None) and "git_commit" in segment
