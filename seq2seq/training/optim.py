"""The training objective and its optimizers: token cross-entropy; Adam, or Muon for the layers'
weight matrices with Adam for the rest; the inverse-sqrt schedule and the cool-down."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.config import Config
from seq2seq.errors import Seq2SeqError
from seq2seq.run.precision import native_bf16
from seq2seq.vocab import PAD_ID

MUON_TORCH = "2.9"  # the first torch with torch.optim.Muon


def sequence_loss(
    logits: torch.Tensor, tgt_out: torch.Tensor, label_smoothing: float
) -> torch.Tensor:
    """Summed token cross-entropy, padding ignored. Shapes: (B, T, V), (B, T) -> ()."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        tgt_out.reshape(-1),
        ignore_index=PAD_ID,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


def adam(params: Iterable[Tensor], config: Config) -> torch.optim.Adam:
    """Adam; its fused kernel (one pass over each tensor, not seven) where torch has one for
    the device, else the multi-tensor one. Same update, up to the last bits."""
    t, params = config.train, list(params)
    settings = {"lr": t.lr, "betas": t.betas, "weight_decay": t.weight_decay}
    try:
        return torch.optim.Adam(params, fused=True, **settings)
    except (RuntimeError, TypeError):  # no fused Adam for this device or torch version
        return torch.optim.Adam(params, **settings)


def newton_schulz(
    g: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype
) -> Tensor:
    """The orthogonalised ``g`` (about ``U Vᵀ`` of its SVD): torch's Muon's quintic iteration
    (``torch.optim._muon``), computed in ``dtype``. Torch computes it in bf16 always, which a
    CPU without native bf16 emulates at a small share of its fp32 speed."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=eps)  # the spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust: str | None, shape: torch.Size) -> float:
    """Muon's learning rate for a matrix of ``shape``, as torch's Muon adjusts it."""
    rows, cols = shape
    if adjust == "match_rms_adamw":  # the update's RMS 0.2 lr, Adam's typical (Liu et al. 2025)
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(max(1, rows / cols))  # "original" (Jordan et al. 2024)


def block_muon() -> type:
    """``BlockMuon``: torch's Muon, a packed matrix orthogonalised block by block. A class
    made on demand, so that a torch without Muon fails only when Muon is asked for."""
    if not hasattr(torch.optim, "Muon"):
        raise Seq2SeqError(
            f"train.optimizer muon needs torch >= {MUON_TORCH} (torch.optim.Muon); "
            f"this is torch {torch.__version__}"
        )

    class BlockMuon(torch.optim.Muon):
        """torch's Muon (its settings, checks and state), whose step splits each matrix of a
        param group into the ``blocks`` of rows it stacks (Q | K | V of a packed
        ``in_proj``; none: the matrix whole): each block is orthogonalised, and its learning
        rate adjusted to its shape, as the matrix it stands for. Momentum and weight decay
        are element-wise, so the split changes nothing else. ``ns_dtype``: what the
        Newton–Schulz iteration computes in (torch's: bf16)."""

        ns_dtype = torch.bfloat16

        @torch.no_grad()
        def step(self, closure: None = None) -> None:
            for group in self.param_groups:
                lr, momentum = group["lr"], group["momentum"]
                for p in (p for p in group["params"] if p.grad is not None):
                    buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                    buf.lerp_(p.grad, 1 - momentum)
                    update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                    p.mul_(1 - lr * group["weight_decay"])
                    blocks = group["blocks"] or [p.shape[0]]
                    for rows, block in zip(p.split(blocks), update.split(blocks), strict=True):
                        ortho = newton_schulz(
                            block,
                            group["ns_coefficients"],
                            group["ns_steps"],
                            group["eps"],
                            self.ns_dtype,
                        )
                        rows.add_(ortho, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], rows.shape))

    return BlockMuon


def muon(
    blocks: dict[nn.Parameter, list[int]], config: Config, device: torch.device
) -> torch.optim.Optimizer:
    """Muon over the matrices ``blocks`` maps to their row blocks (one block: not packed);
    one param group for each packing. Its Newton–Schulz iteration in bf16 where ``device``
    computes bf16 natively, else in fp32: emulated bf16 is many times slower."""
    t = config.train
    groups: dict[tuple[int, ...], list[nn.Parameter]] = {}
    for p, rows in blocks.items():
        groups.setdefault(tuple(rows) if len(rows) > 1 else (), []).append(p)
    optimizer = block_muon()(
        [{"params": ps, "blocks": list(rows)} for rows, ps in groups.items()],
        lr=t.muon_lr or t.lr,
        weight_decay=t.weight_decay,
        momentum=t.muon_momentum,
        adjust_lr_fn=t.muon_adjust_lr,
        ns_steps=t.muon_ns_steps,
    )
    optimizer.ns_dtype = torch.bfloat16 if native_bf16(device) else torch.float32
    return optimizer


class Optimizers:
    """Adam, and Muon when there is one: one step, one schedule and one state dict, whose
    entries are Adam's then Muon's, numbered on; Adam's alone is Adam's own state dict."""

    def __init__(self, parts: list[torch.optim.Optimizer], peak_lrs: list[float]) -> None:
        self.parts, self.peak_lrs = parts, peak_lrs  # each part's learning rate at its peak
        self.factor = 1.0  # the schedule's, as set_lr last set it

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for part in self.parts for group in part.param_groups]

    def set_lr(self, factor: float) -> None:
        """Every group at its part's peak learning rate times the schedule's ``factor``; a
        learning rate on the device (a captured step's, graphs.py) is filled in place."""
        self.factor = factor
        for part, peak in zip(self.parts, self.peak_lrs, strict=True):
            for group in part.param_groups:
                if isinstance(group["lr"], Tensor):
                    group["lr"].fill_(peak * factor)
                else:
                    group["lr"] = peak * factor

    @property
    def lr(self) -> float:
        """The first part's learning rate now (Adam's), read without the device."""
        return self.peak_lrs[0] * self.factor

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def unscale(self, scaler: torch.amp.GradScaler) -> None:
        """Every part's gradients divided by the loss scale, and checked for overflow
        (nothing when ``scaler`` is off)."""
        for part in self.parts:
            scaler.unscale_(part)

    def step(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """Every part's step; through ``scaler`` when there is one (off, it only steps)."""
        for part in self.parts:
            if scaler is None:
                part.step()
            else:
                scaler.step(part)

    def state_dict(self) -> dict[str, Any]:
        state, groups, offset = {}, [], 0
        for part in self.parts:
            own = part.state_dict()
            state |= {offset + i: entry for i, entry in own["state"].items()}
            groups += [
                {**g, "params": [offset + i for i in g["params"]]} | _host_values(g)
                for g in own["param_groups"]
            ]
            offset += sum(len(g["params"]) for g in own["param_groups"])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        groups, offset = list(saved["param_groups"]), 0
        if len(groups) != len(self.param_groups):
            raise ValueError(f"{len(groups)} parameter groups saved, {len(self.param_groups)} here")
        for part in self.parts:
            own, groups = groups[: len(part.param_groups)], groups[len(part.param_groups) :]
            count = sum(len(g["params"]) for g in own)
            state = {
                int(i) - offset: entry
                for i, entry in saved["state"].items()
                if offset <= int(i) < offset + count
            }
            own = [{**g, "params": [i - offset for i in g["params"]]} for g in own]
            part.load_state_dict({"state": state, "param_groups": own})
            offset += count


def _host_values(group: dict[str, Any]) -> dict[str, Any]:
    """A captured step's device learning rate as the number it holds, and ``capturable`` as
    Adam is built: the saved state reads as an eager run's, and a captured run makes its
    device rate again when it captures."""
    if not isinstance(group.get("lr"), Tensor):
        return {}
    return {"lr": float(group["lr"]), "capturable": False}


def build_optimizer(model: nn.Module, config: Config) -> Optimizers:
    """``train.optimizer``: Adam for every parameter, or Muon for the layers' weight matrices
    (``model.hidden_matrices()``, packed blocks and all) and Adam for the embeddings, the
    output layer, the norms and the biases."""
    t = config.train
    if t.optimizer == "adam":
        return Optimizers([adam(model.parameters(), config)], [t.lr])
    blocks, device = model.hidden_matrices(), next(model.parameters()).device
    rest = [p for p in model.parameters() if p not in blocks]
    parts = [adam(rest, config), muon(blocks, config, device)]
    return Optimizers(parts, [t.lr, t.muon_lr or t.lr])


def inverse_sqrt(warmup: int):
    """Linear warmup to the peak, then decay ∝ 1/√step (Vaswani et al. 2017)."""

    def factor(step: int) -> float:
        step = max(step, 1)
        return step / warmup if warmup and step < warmup else math.sqrt(max(warmup, 1) / step)

    return factor


def cooldown(used: float, fraction: float) -> float:
    """The learning-rate factor that takes the last ``fraction`` of a time budget linearly down
    to zero; ``used`` is the share of the budget spent (0 to 1).

    A run stopped by its budget at a high learning rate ends on a noisy state; ending the
    schedule on the budget is the "budgeted training" recipe (Li et al. 2020), the cool-down
    of warmup-stable-decay schedules (Hägele et al. 2024)."""
    if fraction <= 0 or used <= 1 - fraction:
        return 1.0
    return max(0.0, (1 - used) / fraction)
