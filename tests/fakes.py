"""Stand-ins for ``torch.cuda`` and ``torch.distributed`` on a machine without a GPU.

Each fake keeps the contract of the function it replaces: it checks its arguments with
torch's own argument checks (``torch.cuda._utils._get_device_index``) or the checks torch's
code makes, and refuses what the real one refuses, with the same error. A permissive fake of
``torch.cuda.set_device`` once hid a crash of every GPU run (an index-less ``cuda`` device,
which torch refuses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.cuda._utils import _get_device_index

from seq2seq.run.runtime import sdpa_kernels_on


@dataclass
class FakeCuda:
    """``count`` CUDA devices of ``capability``; ``calls`` records set_device and
    init_process_group as ``(name, argument...)``."""

    count: int = 4
    capability: tuple[int, int] = (9, 0)
    current: int = 0
    calls: list[tuple] = field(default_factory=list)
    sdpa: dict[str, bool] = field(default_factory=dict)

    def install(self, monkeypatch) -> FakeCuda:
        for name in ("is_available", "device_count", "current_device", "set_device"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "get_device_capability", self.get_device_capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", self.get_device_name)
        monkeypatch.setattr(dist, "init_process_group", self.init_process_group)
        # attention_kernels turns SDPA's kernels on and off for the process: restore_sdpa
        # puts them back
        self.sdpa = sdpa_kernels_on()
        return self

    def restore_sdpa(self) -> None:
        for flag, on in self.sdpa.items():
            getattr(torch.backends.cuda, f"enable_{flag}_sdp")(on)

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def _index(self, device, optional: bool = False) -> int:
        index = _get_device_index(device, optional=optional)  # torch's own checks
        if not 0 <= index < self.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return index

    def set_device(self, device) -> None:
        self.current = self._index(device)  # an index-less device raises ValueError here
        self.calls.append(("set_device", torch.device("cuda", self.current)))

    def get_device_capability(self, device=None) -> tuple[int, int]:
        self._index(device, optional=True)
        return self.capability

    def get_device_name(self, device=None) -> str:
        return f"Fake GPU {self._index(device, optional=True)}"

    def init_process_group(self, backend=None, timeout=None, device_id=None, **kwargs) -> None:
        """The checks torch's ``init_process_group`` makes of ``device_id``, then a record."""
        if isinstance(device_id, int):
            device_id = torch.device("cuda", device_id)
        if device_id is not None and device_id.type != "cpu":
            if device_id.index is None:
                raise ValueError("Please use a device_id with index.")
            if device_id.index >= self.count:
                raise ValueError(f"device_id {device_id} is out of range.")
        self.calls.append(("init_process_group", backend, device_id))


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
