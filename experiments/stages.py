"""The stage runner of the checks run on a lent GPU (``gpu_check.py``, ``device_check.py``):
each stage a child process with a deadline, recorded as passed, failed, timed out or
skipped, and the record saved after every stage, so that whatever ran comes back even when
the call is cut short.

This module imports only the standard library at its top: a check's driver stays light and
leaves torch to its stages' children.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TAIL_LINES = 8  # of a stage's output, in the record; the whole of it goes to its log


def dry_run() -> list[str]:
    """``--set`` strings of a check's ``--cpu`` dry run: the tests' tiny run on the committed
    sample corpus, trained for seconds."""
    tests = str(REPO / "tests")  # the tiny run's settings live with the tests
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from helpers import TINY_RUN

    return [
        *TINY_RUN,
        "data.max_len=60",
        "data.max_tokens=160",
        "model.max_positions=64",
        "train.valid_bleu_sentences=4",
        "train.keep_last=0",
        "train.average_last=0",
        "train.max_steps=20",
    ]


@dataclass
class Stage:
    """One step of a check: a command for a child process, its deadline in seconds, and what
    to read back from its files when it succeeds (also when it was cut, with
    ``read_when_cut``: a stage that rewrites its results as it goes)."""

    name: str
    command: list[str]
    deadline: int
    read: Callable[[], dict] | None = None
    needs: list[str] = field(default_factory=list)  # stages that must have passed first
    read_when_cut: bool = False
    log: Path | None = None  # the child's whole output, written when it ends


def run_stage(stage: Stage, left: float) -> dict[str, Any]:
    """``stage`` in a child process, cut at its deadline or at the check's time ``left``.
    The child leads a process group of its own, and a cut ends the whole group: a server or
    a training the stage started must not run on into the next stage."""
    from seq2seq.data.subword import worker_env  # this checkout first on PYTHONPATH

    deadline = max(1, int(min(stage.deadline, left)))
    began = time.monotonic()
    with subprocess.Popen(
        stage.command,
        cwd=REPO,
        env=worker_env(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=os.setpgrp,  # a group of its own, in the check's session: a machine that
        # ends the session's processes when a call returns ends the stage's too
    ) as child:
        try:
            out, err = child.communicate(timeout=deadline)
            status, rc = ("passed" if child.returncode == 0 else "failed"), child.returncode
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, err = child.communicate()  # what it printed until then
            status, rc = "timed out", None
        except BaseException:  # the check itself stopped (Ctrl-C, SIGTERM): the stage with it
            os.killpg(child.pid, signal.SIGKILL)
            raise
    if stage.log is not None:
        stage.log.parent.mkdir(parents=True, exist_ok=True)
        stage.log.write_text(out + err, encoding="utf-8")
    result = {
        "status": status,
        **({} if rc is None else {"rc": rc}),
        "deadline_s": deadline,
        "seconds": round(time.monotonic() - began, 1),
        "tail": (out + err).strip().splitlines()[-TAIL_LINES:],
    }
    if stage.read is not None and (status == "passed" or stage.read_when_cut):
        try:
            result.update(stage.read())
        except (OSError, ValueError, KeyError) as e:
            if status == "passed":
                result["status"] = "failed"
                result["tail"].append(f"reading the stage's results: {e}")
    return result


def run_stages(
    stages: list[Stage],
    results: dict[str, dict],
    save: Callable[[], None],
    time_left: Callable[[], float],
    blocked: Callable[[Stage], str | None] = lambda stage: None,
    tag: str = "check",
) -> None:
    """Each stage in turn into ``results`` (by name), then ``save()``: skipped when a stage it
    needs did not pass, when ``blocked`` says why not, or when under 5 s are left. SIGTERM
    meanwhile (a call's time limit) ends the stage running, then the check."""
    with _terminated_as_exit():
        for stage in stages:
            try:
                _run_one(stage, results, time_left, blocked, tag)
            except (SystemExit, KeyboardInterrupt):
                results[stage.name] = {"status": "stopped", "why": "the check was stopped"}
                raise
            finally:
                save()


def _run_one(
    stage: Stage,
    results: dict[str, dict],
    time_left: Callable[[], float],
    blocked: Callable[[Stage], str | None],
    tag: str,
) -> None:
    """``stage`` run, or skipped with the reason, into ``results``; said on stderr."""
    left = time_left()
    missing = [n for n in stage.needs if results.get(n, {}).get("status") != "passed"]
    why = f"needs {', '.join(missing)}" if missing else blocked(stage)
    if why is None and left < 5:
        why = "no time left"
    result = {"status": "skipped", "why": why} if why else run_stage(stage, left)
    results[stage.name] = result
    print(f"{tag}: {stage.name}: {result['status']}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit inside this block (its default ends the process at once,
    leaving a stage's group running); the handler as it was after it."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    saved = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)


def write_json(path: Path, value: Any) -> None:
    """``value`` as JSON into ``path``, whole or not at all: a call cut while it writes still
    brings back the last whole record."""
    from seq2seq.fileio import atomic_write_text

    atomic_write_text(path, json.dumps(value, indent=2, default=str) + "\n")


def training_summary(run: Path) -> dict[str, Any]:
    """A run's steps, best validation BLEU, median tokens/s, peaks and precision, from its
    ``metrics.jsonl`` and ``environment.json`` as they are now (a run still training too)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in rows if r.get("kind") == "valid"]
    train = [r for r in rows if r.get("kind") == "train"]
    rates = sorted(r["tokens_per_s"] for r in train if "tokens_per_s" in r)
    return {
        "steps": max((r["step"] for r in rows if "step" in r), default=0),
        "best_valid_bleu": max((r["bleu"] for r in valid), default=None),
        "median_tokens_per_s": rates[len(rates) // 2] if rates else None,
        "cuda_peak_mb": max((r.get("cuda_peak_mb", 0) for r in rows), default=None),
        "peak_rss_mb": max((r.get("peak_rss_mb", 0) for r in rows), default=None),
        "precision": json.loads((run / "environment.json").read_text())["segments"][-1][
            "precision"
        ],
    }


def scores(path: Path) -> dict[str, Any]:
    """The scores of a ``seq2seq evaluate`` JSON that a check's record keeps."""
    record = json.loads(path.read_text())
    keep = ("bleu", "bleu_lowercased_tokenized", "chrf", "sentences", "beam", "stop_reasons")
    return {k: record[k] for k in keep if k in record}
