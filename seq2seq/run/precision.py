"""Numeric precision: ``train.precision`` is ``auto`` (the default), ``bf16``, ``tf32``,
``fp16`` or ``fp32``.

``bf16`` is autocast where the hardware computes it natively, else fp32: emulated bf16 (a
CPU without AVX512-BF16 or AMX, a CUDA device below compute capability 8.0 such as a T4 or
V100) is slower than fp32, so a run that asks for bf16 there computes in fp32 and says so.
``tf32`` keeps fp32 tensors and lets CUDA's matrix multiplies round their inputs to
TensorFloat-32 (fp32 elsewhere), inside training and a ``Translator``'s calls only
(``matmul_precision``): torch's switch is the process's, and a notebook's own models keep
theirs. ``fp16`` is autocast to float16, the loss scaled (training/scaling.py): what fairseq's
``--fp16``, OpenNMT-py and Joey NMT give GPUs without bf16. On a CPU it runs, with a note: a
CPU without fp16 arithmetic (most of them) computes it many times slower than fp32, and the
precision is there to test a GPU's config. ``auto`` is ``bf16`` on a CPU; on CUDA, ``fp16``
below compute capability 8.0 (no bf16 and no TF32 in hardware) and ``CUDA_AUTO`` from 8.0 on.
No record yet shows fp16 on a GPU: the choice below 8.0 follows those toolkits, unmeasured here.

``CUDA_AUTO`` awaits a paired run: no record yet times the trainer in tf32 and in bf16 on one
machine, interleaved (the GPU issue, 61, measures it). On an H200
(experiments/results/gpu-check-h200) the medians so far come from separate bench runs, and
one bench run's rounds spread widely: in ``bench_train_compiled_whole_bf16.json`` our eager
bf16 step ran 81,514 target tokens/s median, 55,681-118,673 over its 3 rounds. Within one
run (``bench_train_eager_bf16.json``) nn.Transformer stepped 87,981 (73,615-95,391) in strict
fp32 against 75,206 (73,565-90,385) under bf16 autocast: overlapping rounds, no lead either
way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

CUDA_AUTO = "tf32"  # what auto means on CUDA with bf16 and TF32: provisional, until a paired run
# What environment.json (and numerics.yaml) call the precision a run computed in.
BF16, FP32, TF32, FP16 = "bf16 autocast", "fp32", "fp32, TF32 matrix multiplies", "fp16 autocast"
PRECISIONS = (BF16, FP32, TF32, FP16)


def resolved_precision(precision: str, device: torch.device) -> str:
    """``precision`` with ``auto`` replaced by what it means on ``device``."""
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "bf16"
    return CUDA_AUTO if native_bf16(device) else "fp16"  # TF32 came with bf16, in 8.0


def wants_tf32(precision: str, device: torch.device) -> bool:
    """Whether a run of ``precision`` multiplies fp32 matrices in TF32 on ``device``."""
    return device.type == "cuda" and resolved_precision(precision, device) == "tf32"


def precision_name(precision: str, dtype: torch.dtype | None, device: torch.device) -> str:
    """What a run of ``precision`` (autocast to ``dtype``) computes in: one of PRECISIONS."""
    if dtype is not None:
        return FP16 if dtype == torch.float16 else BF16
    return TF32 if wants_tf32(precision, device) else FP32


def _tf32_switch() -> tuple[str, object]:
    """The name and value of torch's switch for TF32 matrix multiplies: the current API
    (``fp32_precision``, torch 2.9 on) where torch has it, whose legacy getter
    (``allow_tf32``) raises once it is set; the legacy one before it."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return "fp32_precision", matmul.fp32_precision
    return "allow_tf32", matmul.allow_tf32


def tf32_in_force(device: torch.device) -> bool:
    """Whether fp32 matrix multiplies on ``device`` round their inputs to TF32 now."""
    _, value = _tf32_switch()
    return device.type == "cuda" and value in ("tf32", True)


@contextlib.contextmanager
def matmul_precision(precision: str, device: torch.device) -> Iterator[None]:
    """On CUDA, TF32 matrix multiplies on or off as ``precision`` says, inside this block;
    the switch as it was after it, however the block ends. Elsewhere nothing changes."""
    device = torch.device(device)  # a Translator may hold its device as text ("cpu")
    if device.type != "cuda":
        yield
        return
    name, saved = _tf32_switch()
    on = wants_tf32(precision, device)
    matmul = torch.backends.cuda.matmul
    setattr(matmul, name, ("tf32" if on else "ieee") if name == "fp32_precision" else on)
    try:
        yield
    finally:
        setattr(matmul, name, saved)


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
    """``torch.float16`` when ``precision`` is (or on ``device`` resolves to) fp16;
    ``torch.bfloat16`` when it is bf16 and ``device`` has it natively; else None (fp32
    tensors)."""
    resolved = resolved_precision(precision, device)
    if resolved == "fp16":
        return torch.float16
    return torch.bfloat16 if resolved == "bf16" and native_bf16(device) else None


FP16_CPU_NOTE = (
    " (note: fp16 is for GPUs without bf16; a CPU without fp16 arithmetic, most of them, "
    "computes it many times slower than fp32)"
)


def describe_precision(precision: str, dtype: torch.dtype | None, device: torch.device) -> str:
    """What a run computes in, for its first line: ``bf16 autocast on cuda:0``, ``fp32 on cpu``,
    with a note when bf16 was asked for (not ``auto``) and is not native on ``device``, and
    when fp16 runs on a CPU."""
    if dtype == torch.float16:
        note = FP16_CPU_NOTE if device.type == "cpu" else ""
        return f"fp16 autocast with loss scaling{note} on {device}"
    if dtype is not None:
        return f"bf16 autocast on {device}"
    if wants_tf32(precision, device):
        return f"fp32 with TF32 matrix multiplies on {device}"
    if precision == "bf16":
        return f"fp32 (note: bf16 is not native here, and emulated it is slower) on {device}"
    return f"fp32 on {device}"


def autocast(device: torch.device, dtype: torch.dtype | None, cache: bool = True):
    """Autocast to ``dtype`` on ``device`` (None: none). ``cache``: keep the weights' casts
    for the region's length; a captured CUDA graph must not (torch's CUDA graph notes)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)
