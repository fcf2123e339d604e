"""The training objective and its optimizer: token cross-entropy, Adam, the inverse-sqrt schedule."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from seq2seq.config import Config
from seq2seq.vocab import PAD_ID


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


def build_optimizer(model: nn.Module, config: Config) -> torch.optim.Adam:
    """Adam; its fused kernel (one pass over each tensor, not seven) where torch has one for
    the device, else the multi-tensor one. Same update, up to the last bits."""
    t = config.train
    settings = {"lr": t.lr, "betas": t.betas, "weight_decay": t.weight_decay}
    try:
        return torch.optim.Adam(model.parameters(), fused=True, **settings)
    except (RuntimeError, TypeError):  # no fused Adam for this device or torch version
        return torch.optim.Adam(model.parameters(), **settings)


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
