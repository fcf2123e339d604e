"""Where training and decoding run: the device, torch's threads, and the ranks of ``torchrun``."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from seq2seq.errors import Seq2SeqError

Value = TypeVar("Value")


@dataclass
class Runtime:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def peak_memory(device: torch.device) -> dict[str, float]:
    """This process's peak resident memory so far (``peak_rss_mb``, where the OS reports
    it) and, on CUDA, the peak of tensors allocated on the device (``cuda_peak_mb``)."""
    peaks = {}
    try:
        import resource  # Unix only

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peaks["peak_rss_mb"] = rss / 2**20 if sys.platform == "darwin" else rss / 2**10
    except ImportError:
        pass
    if device.type == "cuda":
        peaks["cuda_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peaks


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def setup_runtime(device: str = "auto", threads: int | None = None) -> Runtime:
    """The device ``device`` names, and this process's place in a ``torchrun`` job.

    ``device`` is ``auto`` (CUDA, then Apple's MPS, then the CPU), ``cpu``, ``cuda``,
    ``cuda:N`` or ``mps``; one that is not there is a one-line error. Under ``torchrun``
    every rank takes the CUDA device of its local rank (nccl) or shares the CPU (gloo). On
    the CPU, ``threads`` sets torch's intra-op threads (default: the cores over the local
    ranks).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _resolve(device, local_rank if world > 1 else None)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    elif threads or world > 1:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // local_world))
    return Runtime(rank, world, dev)


def _resolve(device: str, local_rank: int | None) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            device = "cuda"
        elif _mps_available() and local_rank is None:
            device = "mps"
        else:
            device = "cpu"
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise Seq2SeqError(
            f"unknown device '{device}' (use auto, cpu, cuda, cuda:N or mps)"
        ) from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise Seq2SeqError(f"device '{device}' asked for, but no CUDA device is available")
        if local_rank is not None:  # under torchrun: the GPU of this process's local rank
            if resolved.index is not None:
                raise Seq2SeqError(
                    f"device '{device}': under torchrun each process takes the GPU of its local "
                    "rank; use --device cuda (CUDA_VISIBLE_DEVICES chooses which GPUs)"
                )
            resolved = torch.device("cuda", local_rank)
        if (resolved.index or 0) >= torch.cuda.device_count():
            raise Seq2SeqError(
                f"device '{device}' asked for, but there are {torch.cuda.device_count()} CUDA devices"
            )
    elif resolved.type == "mps" and not _mps_available():
        raise Seq2SeqError(f"device '{device}' asked for, but MPS is not available here")
    elif resolved.type not in ("cpu", "cuda", "mps"):
        raise Seq2SeqError(f"unsupported device '{device}' (use auto, cpu, cuda, cuda:N or mps)")
    return resolved


def seed_ranks(seed: int, runtime: Runtime) -> None:
    """Called once the model is built (the same initial weights everywhere): every rank
    draws its own dropout masks from here on. Rank 0 goes on with the stream a single
    process has, so one process and rank 0 of several draw alike."""
    if runtime.rank:
        torch.manual_seed(seed * 1_000_003 + runtime.rank)


def barrier(runtime: Runtime) -> None:
    if runtime.world > 1:
        dist.barrier()


def total(runtime: Runtime, *values: float) -> list[float]:
    """Each of ``values`` summed over the ranks (float64, on every rank)."""
    if runtime.world == 1:
        return list(values)
    device = runtime.device if runtime.device.type == "cuda" else "cpu"
    summed = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    return summed.tolist()


def leave_process_group() -> None:
    """Leave torchrun's process group before the process exits (every rank, together): a
    gloo group left to the interpreter's exit can abort a rank that finished cleanly
    ("terminate called without an active exception")."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def agree(runtime: Runtime, value: Value) -> Value:
    """Rank 0's value for every rank, so that no rank waits for a step the others skip."""
    if runtime.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(runtime: Runtime, value: Value) -> list[Value]:
    """Every rank's ``value``, in rank order, on every rank."""
    if runtime.world == 1:
        return [value]
    values: list = [None] * runtime.world
    dist.all_gather_object(values, value)
    return values


class StopSignals:
    """SIGINT / SIGTERM set a flag; the loop saves its state at the end of the step and exits."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
