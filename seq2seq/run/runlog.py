"""What a run writes besides its checkpoints: ``metrics.jsonl`` (and TensorBoard events),
``train.log`` (every line the trainer prints) and ``environment.json`` (how to reproduce it)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from tqdm import tqdm

from seq2seq.fileio import atomic_write_text
from seq2seq.run.precision import TF32, precision_name, tf32_in_force
from seq2seq.run.runtime import KERNEL_CACHES, Runtime, sdpa_kernels_on
from seq2seq.version import __version__


class MetricsLog:
    """``metrics.jsonl`` (always) and TensorBoard event files (when asked and installed)."""

    def __init__(
        self, run_dir: Path, enabled: bool, tensorboard: bool, resume_step: int | None
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.writer = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            # Drop what was logged after the state we resume from: it will be logged again.
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if _logged_step(line) <= resume_step
            ]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                say(
                    "warning: --tensorboard needs the 'tensorboard' package "
                    '(pip install -e ".[tensorboard]" in the repository)',
                    run_dir,
                )
            else:
                purge = None if resume_step is None else resume_step + 1
                self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _logged_step(line: str) -> float:
    """The step of a metrics line; infinite (dropped on resume) for one a crash cut short."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


BF16_FLAGS = {"amx_bf16", "amx_tile", "avx512_bf16"}


PACKAGE = Path(__file__).resolve().parents[1]  # the seq2seq folder this process imported


def git_commit(checkout: Path) -> str | None:
    """The commit checked out in ``checkout``; None outside a git checkout or without git."""
    return _git(checkout, "rev-parse", "HEAD") or None


def _git(folder: Path, *args: str) -> str | None:
    """``git -C folder ARGS``'s output; None where git is missing or refuses."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=5
        )
        return done.stdout.strip() if done.returncode == 0 else None
    return None


def code_of(package: Path = PACKAGE) -> dict[str, Any]:
    """The code that runs: the commit of the checkout holding ``package``, whether the
    package's files are not that commit's (``git_dirty``: uncommitted or untracked files, as
    in a copy of a tree whose ``.git`` is older than its files), and the sha256 of the
    package's files as imported, which names the code with or without git. Commit and flag
    are None outside a git checkout: a record of such a run, or of a dirty one, is never
    paired with another (experiments/records/compare.py)."""
    commit = git_commit(package)
    status = _git(package, "status", "--porcelain", "--", ".") if commit else None
    return {
        "git_commit": commit if status is not None else None,
        "git_dirty": None if status is None else bool(status),
        "code_sha256": code_sha256(package),
    }


def code_sha256(package: Path = PACKAGE) -> str:
    """The sha256 of every file under ``package`` (bytecode caches aside), each named by its
    path in the package: one digest per version of the code, committed or not."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(package).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def machine() -> dict[str, Any]:
    """Versions, the code (``code_of``), CPU model and torch threads: what a number was
    measured on (every run's ``environment.json``, and the benchmarks' JSON)."""
    import sentencepiece

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sentencepiece": sentencepiece.__version__,
        "sacrebleu": sacrebleu.__version__,
        "seq2seq": __version__,
    }
    cpu, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]  # the first processor
        info = {
            k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in first.splitlines())
        }
        cpu, flags = info.get("model name", cpu), set(info.get("flags", "").split())
    return {
        "versions": versions,
        **code_of(),
        "cpu": cpu,
        # what bf16 speed depends on: AMX tiles, AVX512-BF16, or neither (emulated)
        "cpu_bf16_flags": sorted(flags & BF16_FLAGS),
        "threads": torch.get_num_threads(),
        # kernels kept by oneDNN and ideep (None: their own 1,024)
        "kernel_caches": {name: os.environ.get(name) for name in KERNEL_CACHES},
    }


def accelerator(device: torch.device, tf32: bool | None = None) -> dict[str, Any]:
    """On a GPU: its name and compute capability, the CUDA, cuDNN and NCCL versions this
    torch was built with, the SDPA kernels on, and whether fp32 matrix multiplies are TF32
    (``tf32``; None: as the switch is now); nothing elsewhere."""
    if device.type != "cuda":
        return {}
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {
        "gpu": torch.cuda.get_device_name(device),
        "gpu_capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "sdpa_kernels": [name for name, on in sdpa_kernels_on().items() if on],
        "tf32_matmul": tf32_in_force(device) if tf32 is None else tf32,
    }


def write_environment(
    run_dir: Path, runtime: Runtime, precision: str, dtype: torch.dtype | None, step: int = 0
) -> None:
    """What someone needs to reproduce a number: versions, hardware, the command line, and
    what a run of ``train.precision`` (autocast to ``dtype``) computes in, as
    ``precision.PRECISIONS`` names it.

    ``environment.json`` holds ``{"segments": [...]}``, one entry per stretch of training
    (``from_step`` where it began): a run resumed on another machine records both."""
    computes_in = precision_name(precision, dtype, runtime.device)
    environment = {
        **machine(),
        "device": str(runtime.device),
        **accelerator(runtime.device, tf32=computes_in == TF32),
        "processes": runtime.world,
        "precision": computes_in,
        "command": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "from_step": step,
    }
    path = run_dir / "environment.json"
    segments = []
    if step and path.is_file():  # a resumed run: the segments before this one stay
        with contextlib.suppress(ValueError, OSError):
            earlier = json.loads(path.read_text(encoding="utf-8"))
            segments = earlier.get("segments", [earlier])  # a record written before segments
        segments = [seg for seg in segments if seg.get("from_step", 0) < step]
    record = {"segments": [*segments, environment]}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def say(message: str, run_dir: Path | None = None) -> None:
    """A line on stderr (above the progress bar) and, for a run, in its ``train.log``."""
    tqdm.write(message, file=sys.stderr)
    if run_dir is not None:
        with contextlib.suppress(OSError), open(run_dir / "train.log", "a", encoding="utf-8") as f:
            f.write(message + "\n")
