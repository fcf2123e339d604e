"""Numeric precision: ``train.precision`` is ``auto`` (the default), ``bf16``, ``tf32`` or
``fp32``.

``bf16`` is autocast where the hardware computes it natively, else fp32: emulated bf16 (a
CPU without AVX512-BF16 or AMX, a CUDA device below compute capability 8.0 such as a T4 or
V100) is slower than fp32, so a run that asks for bf16 there computes in fp32 and says so.
``tf32`` keeps fp32 tensors and lets CUDA's matrix multiplies round their inputs to
TensorFloat-32 (fp32 elsewhere). ``auto`` is ``bf16`` on a CPU and ``CUDA_AUTO`` on CUDA.
On an H200 the default model's step is bound by launching kernels, not by arithmetic, and
bf16 autocast adds a cast before each matrix multiply: bench_train's eager step ran 119,795
target tokens/s in tf32 against 68,215 under bf16 on one machine
(experiments/results/gpu-check-h200; the trainer's own rate in both precisions on one
machine is not measured yet).
"""

from __future__ import annotations

import contextlib

import torch

CUDA_AUTO = "tf32"  # what auto means on CUDA, from the measurement named above


def resolved_precision(precision: str, device: torch.device) -> str:
    """``precision`` with ``auto`` replaced by what it means on ``device``."""
    if precision != "auto":
        return precision
    return CUDA_AUTO if device.type == "cuda" else "bf16"


def set_matmul_precision(precision: str, device: torch.device) -> None:
    """On CUDA, TF32 matrix multiplies on or off for this process as ``precision`` says."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = resolved_precision(precision, device) == "tf32"


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` itself (not the current CUDA device) computes bf16 natively.

    For CUDA this is ``torch.cuda.is_bf16_supported(including_emulation=False)``'s test
    (compute capability 8.0 or above), asked of ``device``: that function reads only the
    current device, and older torch releases lack the argument.
    """
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        return major >= 8
    return device.type == "cpu" and (
        getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    )


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """``torch.bfloat16`` when ``precision`` is (or on ``device`` resolves to) bf16 and
    ``device`` has it natively, else None (fp32 tensors)."""
    bf16 = resolved_precision(precision, device) == "bf16"
    return torch.bfloat16 if bf16 and native_bf16(device) else None


def describe_precision(precision: str, dtype: torch.dtype | None, device: torch.device) -> str:
    """What a run computes in, for its first line: ``bf16 autocast on cuda:0``, ``fp32 on cpu``,
    with a note when bf16 was asked for and is not native on ``device``."""
    precision = resolved_precision(precision, device)
    if dtype is not None:
        return f"bf16 autocast on {device}"
    if precision == "tf32" and device.type == "cuda":
        return f"fp32 with TF32 matrix multiplies on {device}"
    if precision == "bf16":
        return f"fp32 (note: bf16 is not native here, and emulated it is slower) on {device}"
    return f"fp32 on {device}"


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
