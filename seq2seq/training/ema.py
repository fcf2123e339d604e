"""An exponential moving average of the weights (``train.ema``), taken after every step and
saved with the training state, so that ``--resume`` goes on averaging where it stopped."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from seq2seq.errors import Seq2SeqError
from seq2seq.run import checkpoint

PREFIX = "ema."  # its tensors' names in the training state


class WeightEMA:
    """``average ← average + (1 − d)(weights − average)`` after each step, with the decay
    ``d = min(decay, (1 + step) / (10 + step))``: the warm-up of TensorFlow's
    ExponentialMovingAverage, so that early steps weigh little and the initial weights fade.
    A decay of 0 averages nothing: ``update`` does nothing and ``saved`` is empty.

    ``resume_from`` (a training state saved with an average) restores the average."""

    def __init__(self, model: nn.Module, decay: float, resume_from: Path | None = None) -> None:
        self.decay = decay
        self.live = checkpoint.unique_state(model) if decay else {}  # views of the weights
        self.weights = {name: tensor.detach().clone() for name, tensor in self.live.items()}
        if decay and resume_from is not None:
            saved, _ = checkpoint.read_tensors(resume_from)
            missing = [name for name in self.weights if PREFIX + name not in saved]
            if missing:
                raise Seq2SeqError(f"{resume_from}: no moving average of {missing[0]} saved")
            for name, tensor in self.weights.items():
                tensor.copy_(saved[PREFIX + name])

    def update(self, step: int) -> None:
        """Average in the weights after optimizer step ``step`` (counted from 1)."""
        if not self.decay:
            return
        decay = min(self.decay, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(list(self.weights.values()), list(self.live.values()), 1 - decay)

    def saved(self) -> dict[str, Tensor]:
        """The average's tensors, named as the training state holds them."""
        return {PREFIX + name: tensor for name, tensor in self.weights.items()}
