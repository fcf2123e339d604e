"""Where training and decoding run: the device, torch's threads, and the ranks of ``torchrun``."""

from __future__ import annotations

import inspect
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from seq2seq.errors import Seq2SeqError

Value = TypeVar("Value")

# How long the other ranks wait for rank 0 to prepare the data (``main_first``): tokenizing
# a corpus of millions of pairs can outlast NCCL's 10-minute default, which then aborts
# the job; a rank 0 that fails ends the job sooner anyway (torchrun stops the others).
PREPARE_TIMEOUT = timedelta(hours=12)


CGROUP = Path("/sys/fs/cgroup")  # where the cgroup filesystem is mounted
MEMBERSHIP = Path("/proc/self/cgroup")  # this process's cgroup in each hierarchy


def cgroup_cpu_quota(root: Path | None = None, membership: Path | None = None) -> float | None:
    """The CPUs the cgroup quotas allow this process (quota / period: 1.5 for 150 ms in every
    100 ms), the tightest among its own cgroup and those above it: on a host, a systemd slice
    or a Slurm job's cgroup limits the process, not the root's. The cgroups are the ones
    ``membership`` names under ``root`` (cgroup v2's ``cpu.max``, v1's ``cpu`` controller's
    ``cpu.cfs_quota_us``); None without a quota."""
    root, membership = root or CGROUP, membership or MEMBERSHIP
    quotas = [_quota(folder) for folder in _own_cgroups(root, membership)]
    return min((quota for quota in quotas if quota is not None), default=None)


def _own_cgroups(root: Path, membership: Path) -> list[Path]:
    """The folders of this process's cgroups (v2 ``0::/path``, v1 ``N:cpu,...:/path``) and of
    every cgroup above them, then the mount's root. A container without a cgroup namespace
    sees a path outside its view: the folders not there are skipped, and the mount's root is
    the container's own cgroup."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:  # no /proc (macOS)
        lines = []
    folders = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers and "cpu" not in controllers.split(","):
            continue
        mount = root if not controllers else root / "cpu"  # v1: cpu -> cpu,cpuacct
        parts = Path(path).parts[1:]  # below "/"
        folders += [mount.joinpath(*parts[:n]) for n in range(len(parts), 0, -1)]
    return [*folders, root, root / "cpu"]


def _quota(cgroup: Path) -> float | None:
    """One cgroup's CPU quota, from v2's ``cpu.max`` or v1's ``cpu.cfs_quota_us``; None
    without one."""
    try:
        if (cgroup / "cpu.max").is_file():
            quota, period = (cgroup / "cpu.max").read_text().split()
        else:
            quota = (cgroup / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):  # no files, or ones this does not read
        return None


def usable_cpus(root: Path | None = None, membership: Path | None = None) -> int:
    """The CPUs this process may run on (its affinity), capped by its cgroups' quota rounded
    down: a 2-CPU quota on a 64-core host is 2, not 64."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    cpus = len(affinity(0)) if affinity else os.cpu_count() or 1
    quota = cgroup_cpu_quota(root, membership)
    return min(cpus, max(1, math.floor(quota))) if quota else cpus


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


# oneDNN, which computes torch's bf16 matrix multiplies on a CPU, keeps a kernel (a
# "primitive") for every shape it has met, 1,024 by default, and ideep, torch's layer over it,
# keeps as many of its own objects. Batches of varying length bring new shapes nearly every
# step, and the two caches grew a training run's memory for thousands of steps (issue 59
# point 11: the bench-memory records, where 64 kept the peak flat from step 300 to 800 at
# no loss of speed in one pair of runs). Both libraries read their capacity when they first make a
# kernel, so it is set before any training or decoding; a capacity the user put in the
# environment is kept.
KERNEL_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
KERNEL_CACHE_DEFAULT = "64"


def bound_kernel_caches() -> dict[str, str]:
    """oneDNN's and ideep's kernel cache capacities for this process (and its children):
    the user's, else ``KERNEL_CACHE_DEFAULT``. In effect only if no kernel was made before."""
    return {name: os.environ.setdefault(name, KERNEL_CACHE_DEFAULT) for name in KERNEL_CACHES}


def setup_runtime(
    device: str = "auto", threads: int | None = None, attention: str = "auto"
) -> Runtime:
    """The device ``device`` names, and this process's place in a ``torchrun`` job.

    ``device`` is ``auto`` (CUDA, then Apple's MPS, then the CPU), ``cpu``, ``cuda``,
    ``cuda:N`` or ``mps``; one that is not there is a one-line error. ``cuda`` is the
    current CUDA device, by its index (``cuda:0``). Under ``torchrun`` every rank takes the
    CUDA device of its local rank (nccl), bound before the process group, or shares the CPU
    (gloo). On any device ``threads`` sets torch's intra-op threads (default under torchrun:
    the usable CPUs over the local ranks; alone: torch's choice, at most the usable CPUs,
    ``usable_cpus``). On CUDA ``attention`` chooses the SDPA kernels (``attention_kernels``).
    On every device the CPU's kernel caches are bounded (``bound_kernel_caches``).
    """
    bound_kernel_caches()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = _resolve(device, local_rank if world > 1 else None)
    if dev.type == "cuda":  # bound before the process group: NCCL then uses it, not a guess
        torch.cuda.set_device(dev)
        attention_kernels(attention)
    # On every device: SentencePiece, the batches and the CPU side of a GPU run use these
    # threads, and torchrun has set OMP_NUM_THREADS=1. Torch's own default counts the host's
    # cores: in a container with a CPU quota it is capped to the quota.
    usable = usable_cpus()
    if threads or world > 1:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(threads or max(1, usable // local_world))
    elif torch.get_num_threads() > usable:
        torch.set_num_threads(usable)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", **_device_id(dev))
    rank = dist.get_rank() if world > 1 else 0
    return Runtime(rank, world, dev)


# SDPA's CUDA kernels by torch's names. cuDNN's builds an execution plan for every new
# batch shape: with the lengths of real batches (and a cached decoding step's Tk growing by
# one a step) it planned at every call, 88% of a training step on an H200 (torch 2.11).
SDPA_KERNELS = ("flash", "mem_efficient", "math", "cudnn")
ATTENTION_SETTINGS = {
    "auto": ("flash", "mem_efficient", "math"),  # no per-shape planning
    "all": SDPA_KERNELS,  # torch's own choice among every kernel, cuDNN's included
}


def attention_kernels(setting: str = "auto") -> dict[str, bool]:
    """Turn SDPA's CUDA kernels on or off for this process as ``setting`` (a key of
    ``ATTENTION_SETTINGS``) says; returns which are on, as environment.json records them.
    Training and decoding both run under it: it holds for the process, not for a call."""
    wanted = ATTENTION_SETTINGS[setting]
    for kernel in SDPA_KERNELS:
        enable = getattr(torch.backends.cuda, f"enable_{kernel}_sdp", None)
        if enable is not None:  # cuDNN's came in torch 2.3
            enable(kernel in wanted)
    return sdpa_kernels_on()


def sdpa_kernels_on() -> dict[str, bool]:
    """Which of SDPA's CUDA kernels torch may choose now."""
    on = {}
    for kernel in SDPA_KERNELS:
        enabled = getattr(torch.backends.cuda, f"{kernel}_sdp_enabled", None)
        if enabled is not None:
            on[kernel] = enabled()
    return on


def _device_id(device: torch.device) -> dict[str, torch.device]:
    """``init_process_group``'s ``device_id`` for a GPU, where this torch has it (2.3 and later):
    the NCCL communicator is then made for this device at once."""
    takes_it = "device_id" in inspect.signature(dist.init_process_group).parameters
    return {"device_id": device} if device.type == "cuda" and takes_it else {}


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
        if resolved.index is None:  # the current device, by its index, as set_device needs
            resolved = torch.device("cuda", torch.cuda.current_device())
        if resolved.index >= torch.cuda.device_count():
            raise Seq2SeqError(
                f"device '{device}' asked for, but there are {torch.cuda.device_count()} CUDA devices"
            )
    elif resolved.type == "mps" and not _mps_available():
        raise Seq2SeqError(f"device '{device}' asked for, but MPS is not available here")
    elif resolved.type not in ("cpu", "cuda", "mps"):
        raise Seq2SeqError(f"unsupported device '{device}' (use auto, cpu, cuda, cuda:N or mps)")
    return resolved


def distributed(model: nn.Module, runtime: Runtime) -> nn.Module:
    """``model`` as the training step calls it: wrapped in DistributedDataParallel under
    torchrun, else itself. Its buffers are not broadcast before every forward: the model's
    are the sinusoidal position tables, fixed and the same on every rank."""
    if runtime.world == 1:
        return model
    return nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)


def seed_ranks(seed: int, runtime: Runtime) -> None:
    """Called once the model is built (the same initial weights everywhere): every rank
    draws its own dropout masks from here on. Rank 0 goes on with the stream a single
    process has, so one process and rank 0 of several draw alike."""
    if runtime.rank:
        torch.manual_seed(seed * 1_000_003 + runtime.rank)


def barrier(runtime: Runtime) -> None:
    """Every rank waits for the others; on GPUs, on this rank's own device."""
    if runtime.world > 1:
        cuda = runtime.device.type == "cuda"
        dist.barrier(device_ids=[runtime.device.index] if cuda else None)


def main_first(
    runtime: Runtime, work: Callable[[], Value], timeout: timedelta = PREPARE_TIMEOUT
) -> Value:
    """``work()`` done by rank 0 alone, its result returned on every rank. The others wait on
    a gloo group of their own with ``timeout``, not in a collective of the process group
    (NCCL's watchdog aborts one pending past its 10-minute default)."""
    if runtime.world == 1:
        return work()
    group = dist.new_group(backend="gloo", timeout=timeout)
    box = [work() if runtime.main else None]
    dist.broadcast_object_list(box, src=0, group=group)
    dist.destroy_process_group(group)
    return box[0]


def total(runtime: Runtime, *values: float) -> list[float]:
    """Each of ``values`` summed over the ranks (float64, on every rank)."""
    if runtime.world == 1:
        return list(values)
    device = runtime.device if runtime.device.type == "cuda" else "cpu"
    summed = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    return summed.tolist()


def leave_process_group() -> bool:
    """Leave the process group before the process exits (every rank, together); whether this
    process is a rank of torchrun's world (``WORLD_SIZE`` > 1), which then calls
    ``exit_rank``."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.barrier()
    dist.destroy_process_group()
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank that has left its group, its output flushed, without the
    interpreter's teardown. DDP keeps its own reference to the gloo group, so the group can
    outlive ``destroy_process_group`` until that teardown, where its worker threads can abort
    a rank that finished cleanly ("terminate called without an active exception": rank 1,
    now and then, in the two-rank test). Everything the run writes is closed by now."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


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
    """SIGINT / SIGTERM set a flag; the loop saves its state at the end of the step and exits.
    A second one stops at once, wherever the run is (validating, averaging, waiting): it
    ``say``s what was last saved (``saved``, kept up to date by the trainer) and raises
    KeyboardInterrupt. Installed only in the main thread, the one Python runs signal handlers
    in (``installed``): elsewhere ``signal.signal`` refuses."""

    def __init__(self, say: Callable[[str], None] = lambda message: None) -> None:
        self.received: str | None = None
        self.saved = "no training state saved yet"
        self.say = say
        self.previous: dict[int, Any] = {}
        self.installed = False

    def __enter__(self) -> StopSignals:
        self.installed = threading.current_thread() is threading.main_thread()
        for sig in (signal.SIGINT, signal.SIGTERM) if self.installed else ():
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            return
        message = f"a second {name}: stopped at once; {self.saved}"
        self.say(message)
        raise KeyboardInterrupt(message)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()
