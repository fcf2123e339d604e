"""Dropout whose probability a schedule moves during training, and its CPU masks.

``Dropout`` is what every layer of the model drops with: ``F.dropout`` where that is best,
and on a CPU a mask of 16 random bits an element that backward keeps as booleans.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:
    from torch.compiler import is_compiling
except ImportError:  # torch before 2.3: dynamo's own
    from torch._dynamo import is_compiling


class Dropout(nn.Module):
    """Dropout whose probability the trainer's schedule moves (``drop.p = 0.2``), built for two
    costs. Eager CPU training draws 16 random bits per element (four to each int64 that
    ``random_`` fills), where ``F.dropout``'s ``bernoulli_`` draws a double, and keeps only the
    boolean mask for backward (1 byte an element; ``F.dropout`` on CPU keeps an ``x.dtype``
    noise tensor). Same law: each element kept with probability 1 - p (to 1/65536) and scaled
    by 1/(1 - p) computed in float32, also under bf16 autocast; masks from torch's default
    generator, so a seed and ``--resume`` reproduce them. On other devices it is
    ``F.dropout``. Under ``torch.compile`` the probability and the scale are read from tensors
    inside the graph, so a schedule that moves them every step compiles once, not once per
    value."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.register_buffer("rate", torch.tensor(float(p)), persistent=False)
        self.register_buffer("scale", torch.tensor(1.0), persistent=False)
        self.p = p

    @property
    def p(self) -> float:
        return self._p

    @p.setter
    def p(self, value: float) -> None:
        if getattr(self, "_p", None) == float(value):  # the schedule sets it every step
            return
        self._p = float(value)  # what eager code reads: no device sync for it
        self.active = value > 0.0  # what a compiled graph guards on: one bool, not the value
        self.rate.fill_(value)
        self.scale.fill_(1.0 / (1.0 - value))  # float32 of the eager path's Python float

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return x
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return self._from_tensors(x)  # a graph replays it at whatever rate is set then
        if not self.active:
            return x
        if is_compiling():
            return self._from_tensors(x)
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        return _MaskAndScale.apply(x, keep_mask(x.shape, self.p), self.p)

    def _from_tensors(self, x: Tensor) -> Tensor:
        """Dropout at the rate and scale in the module's tensors, which a compiled or captured
        graph reads when it runs. Scaled in float32, then cast, as on the eager path: on a GPU
        a 0-dim tensor in bf16 arithmetic is rounded to bf16 first (1 - 0.1 became
        0.8984375)."""
        keep = torch.rand_like(x, dtype=torch.float32) >= self.rate
        return (x.float() * keep * self.scale).to(x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p:g}"


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """True with probability 1 - p (to 1/65536), from 16 random bits per element. CPU."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    threshold = round(p * 65536) - 32768  # an int16 at or above it: probability 1 - p
    return (words.view(torch.int16)[:n] >= threshold).view(shape)


class _MaskAndScale(torch.autograd.Function):
    """``x * keep * (1 / (1 - p))``; the gradient is masked and scaled the same way. Only the
    boolean ``keep`` is saved; the scale is a Python float, which CPU kernels multiply in
    float32 even for a bf16 ``x`` (a bf16 scale tensor would be 1.109375 at p = 0.1)."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, p: float) -> Tensor:
        ctx.scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(keep)
        return (x * keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None
