"""Numeric precision: bf16 autocast where the hardware computes it natively, else fp32."""

from __future__ import annotations

import contextlib

import torch


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 where the hardware computes it natively (AMX / AVX512-BF16 CPUs, CUDA), else fp32."""
    if precision != "bf16":
        return None
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    native = (
        getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    )
    return torch.bfloat16 if native else None


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
