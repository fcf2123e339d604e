"""Stand-ins for ``torch.cuda`` and ``torch.distributed`` on a machine without a GPU.

Each fake keeps the contract of the function it replaces: it checks its arguments with
torch's own argument checks (``torch.cuda._utils._get_device_index``) or the checks torch's
code makes, and refuses what the real one refuses, with the same error. A permissive fake of
``torch.cuda.set_device`` once hid a crash of every GPU run (an index-less ``cuda`` device,
which torch refuses). Where torch builds a function on another (``get_device_capability``,
``get_device_name`` and ``is_bf16_supported`` read ``get_device_properties``), the fake
replaces the one below and torch's own function runs on it.

What the fakes prove is device selection and the calls made around it, not GPU behaviour:
``max_memory_allocated``, the CUDA RNG, pinned memory, streams, graphs, NCCL's collectives and
``torch.accelerator`` are not faked (on a CPU build they return 0 or False, or raise). A
trainer test under the fake is no evidence about a GPU.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.cuda._utils import _get_device_index

from seq2seq.run.precision import _tf32_switch
from seq2seq.run.runtime import sdpa_kernels_on


@dataclass(frozen=True)
class FakeProperties:
    """What ``torch.cuda.get_device_properties`` tells of a device, the fields read here."""

    name: str
    major: int
    minor: int
    total_memory: int


@dataclass
class FakeCuda:
    """``count`` CUDA devices of ``capability`` (or each of its own, ``capabilities``) with
    ``memory`` bytes each (``used`` of them taken); ``calls`` records set_device,
    init_process_group and new_group as ``(name, argument...)``."""

    count: int = 4
    capability: tuple[int, int] = (9, 0)
    capabilities: dict[int, tuple[int, int]] = field(default_factory=dict)
    memory: int = 80 * 2**30
    used: int = 2**30
    current: int = 0
    calls: list[tuple] = field(default_factory=list)
    sdpa: dict[str, bool] = field(default_factory=dict)
    tf32: tuple[str, object] = ("", None)
    group: dict[str, object] | None = None  # the default process group, once initialised

    def install(self, monkeypatch) -> FakeCuda:
        """The fakes in place of torch's; ``restore()`` puts back what they cannot leave to
        monkeypatch: the process's SDPA kernel flags and TF32 switch."""
        for name in (
            "is_available",
            "device_count",
            "current_device",
            "set_device",
            "get_device_properties",
            "mem_get_info",
        ):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        # torch's is_bf16_supported tries a bf16 tensor below capability 8.0, as every CUDA
        # device can hold one (emulated): a CPU build cannot
        monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
        for name in ("init_process_group", "is_initialized", "get_rank", "get_world_size"):
            monkeypatch.setattr(dist, name, getattr(self, name))
        monkeypatch.setattr(dist, "new_group", self.new_group)
        self.sdpa = sdpa_kernels_on()  # attention_kernels turns them on and off
        self.tf32 = _tf32_switch()  # a run on CUDA sets it inside its training
        return self

    def restore(self) -> None:
        for flag, on in self.sdpa.items():
            getattr(torch.backends.cuda, f"enable_{flag}_sdp")(on)
        name, value = self.tf32
        setattr(torch.backends.cuda.matmul, name, value)

    # -- torch.cuda -------------------------------------------------------------------------

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def set_device(self, device) -> None:
        """A negative index is a no-op, as in torch; an index-less device raises ValueError
        (torch's check), one past the devices CUDA's error."""
        index = _get_device_index(device)
        if index < 0:
            return
        if index >= self.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.current = index
        self.calls.append(("set_device", torch.device("cuda", index)))

    def get_device_properties(self, device=None) -> FakeProperties:
        index = _get_device_index(device, optional=True)
        if index < 0 or index >= self.count:
            raise AssertionError("Invalid device id")  # torch's own check and message
        capability = self.capabilities.get(index, self.capability)
        return FakeProperties(f"Fake GPU {index}", *capability, self.memory)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        """(free, total) bytes of the device, the current one by default."""
        index = _get_device_index(self.current if device is None else device, optional=True)
        if not 0 <= index < self.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return self.memory - self.used, self.memory

    # -- torch.distributed ------------------------------------------------------------------

    def init_process_group(
        self,
        backend: str | None = None,
        init_method: str | None = None,
        timeout: datetime.timedelta | None = None,
        world_size: int = -1,
        rank: int = -1,
        store=None,
        group_name: str = "",
        pg_options=None,
        device_id: torch.device | int | None = None,
        _ranks: list[int] | None = None,
    ) -> None:
        """torch's checks of a second call and of ``device_id`` (the accelerator is CUDA),
        and env://'s of its variables; then the default group, initialised, and a record."""
        if self.group is not None:
            raise ValueError("trying to initialize the default process group twice!")
        if isinstance(device_id, int):
            device_id = torch.device("cuda", device_id)
        if device_id is not None and device_id.type != "cpu":
            if device_id.type != "cuda":
                raise ValueError(
                    f"device_id {device_id} does not match the current compilation's "
                    "accelerator support: cuda."
                )
            if device_id.index is None:
                raise ValueError("Please use a device_id with index.")
            if device_id.index >= self.count:
                raise ValueError(f"device_id {device_id} is out of range.")
        if store is None and init_method in (None, "env://"):
            rank = rank if rank >= 0 else int(self._env("RANK"))
            world_size = world_size if world_size > 0 else int(self._env("WORLD_SIZE"))
            self._env("MASTER_ADDR"), self._env("MASTER_PORT")
        self.group = {"rank": rank, "world": world_size, "device_id": device_id}
        self.calls.append(("init_process_group", backend, device_id))

    @staticmethod
    def _env(name: str) -> str:
        if not os.environ.get(name):
            raise ValueError(
                "Error initializing torch.distributed using env:// rendezvous: "
                f"environment variable {name} expected, but not set"
            )
        return os.environ[name]

    def _default_group(self) -> dict[str, object]:
        if self.group is None:
            raise ValueError(
                "Default process group has not been initialized, please make sure to call "
                "init_process_group."
            )
        return self.group

    def is_initialized(self) -> bool:
        return self.group is not None

    def get_rank(self, group=None) -> int:
        return int(self._default_group()["rank"])

    def get_world_size(self, group=None) -> int:
        return int(self._default_group()["world"])

    def new_group(
        self,
        ranks=None,
        timeout=None,
        backend=None,
        pg_options=None,
        use_local_synchronization: bool = False,
        group_desc=None,
        device_id: torch.device | None = None,
        sort_ranks: bool = True,
    ) -> dict[str, object]:
        """A group of the default one's ranks, bound to its device unless given another
        (torch's ``_new_group_with_tag`` takes the default group's ``bound_device_id``)."""
        bound = device_id if device_id is not None else self._default_group()["device_id"]
        self.calls.append(("new_group", backend, bound))
        return {"backend": backend, "device_id": bound}


class LegacyMatmul:
    """``torch.backends.cuda.matmul`` before torch 2.9: TF32 is ``allow_tf32`` alone, and any
    other attribute, ``fp32_precision`` among them, is refused with torch's error."""

    def __init__(self, allow_tf32: bool = False) -> None:
        object.__setattr__(self, "_allow_tf32", allow_tf32)

    def __getattr__(self, name: str) -> bool:
        if name == "allow_tf32":
            return self._allow_tf32
        raise AttributeError("Unknown attribute " + name)

    def __setattr__(self, name: str, value: object) -> None:
        if name != "allow_tf32":
            raise AttributeError("Unknown attribute " + name)
        object.__setattr__(self, "_allow_tf32", bool(value))


class FakeGraphs:
    """``graphs.CudaGraphs`` on a CPU. A capture runs the step once, where a read of the
    device raises (``no_host_reads``: a CUDA capture refuses a sync); a replay runs it again.
    A real replay writes the memory the capture recorded, whatever Python names since: the
    fake refuses a step that leaves a weight, a gradient or Adam's state in new memory (a
    tensor rebound, a gradient set to None), which a real graph would no longer update.
    What it proves is the step's bookkeeping on a CPU, not a CUDA capture."""

    def __init__(self) -> None:
        self.captured = 0

    def pool(self) -> object:
        return object()

    def warm_up(self, body, steps: int) -> None:
        for _ in range(steps):
            body()

    def capture(self, body, pool) -> FakeGraph:
        from helpers import no_host_reads

        with no_host_reads():
            body()
        self.captured += 1
        return FakeGraph(body)

    def rng_state(self, device: torch.device) -> tuple[torch.Tensor]:
        return (torch.get_rng_state(),)

    def set_rng_state(self, state: tuple[torch.Tensor], device: torch.device) -> None:
        torch.set_rng_state(state[0])


class FakeGraph:
    """A captured step: ``replay`` runs it on the memory the capture left it."""

    def __init__(self, body) -> None:
        self.body = body
        self.memory = self.addresses()

    def addresses(self) -> list[int]:
        step = self.body
        tensors = [t for p in step.params for t in (p, p.grad)]
        tensors += [t for s in step.adam.state.values() for t in s.values()]
        tensors += [g["lr"] for g in step.adam.param_groups]
        if any(t is None for t in tensors):
            raise AssertionError("a gradient set to None: a replay would not refill it")
        return [t.data_ptr() for t in tensors]

    def replay(self) -> None:
        if self.addresses() != self.memory:
            raise AssertionError("the step's tensors moved since the capture")
        self.body()
