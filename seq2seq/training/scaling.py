"""fp16's loss scaling (``train.precision: fp16``): ``torch.amp.GradScaler`` multiplies the loss
before the backward pass, so that small gradients survive fp16's narrow range, and divides the
gradients again before clipping measures them. A step whose scaled gradients overflow is
skipped and the scale halved: a routine of loss scaling, counted apart from the bad steps
(``train.max_bad_steps``, a non-finite loss). Its state resumes with the run.

In any other precision the scaler is off and each of its calls changes nothing: one training
step serves every precision, and fp32's numbers stay bit for bit what they were.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from seq2seq.errors import Seq2SeqError
from seq2seq.training.optim import Optimizers

# GradScaler's own defaults, named: the scale starts at 2**16, halves on a step that
# overflows and doubles after growth_interval clean steps in a row.
LOSS_SCALE = {"init_scale": 2.0**16, "growth_interval": 2000}
MIN_LOSS_SCALE = 1e-4  # below it every scale overflows: fairseq's --min-loss-scale default
SAVED_KEY = "loss_scaler"  # its state among the training state's counters


class LossScaling:
    """The loss scaler of a run autocast to ``dtype`` (on for float16 alone), and the count of
    the steps it skipped (``skipped``, carried in the training state's counters)."""

    def __init__(self, dtype: torch.dtype | None, device: torch.device) -> None:
        on = dtype == torch.float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=on, **LOSS_SCALE)
        self.on = on

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale(self, optimizer: Optimizers) -> None:
        """The gradients as the loss gave them, before clipping measures their norm."""
        optimizer.unscale(self.scaler)

    def step(self, optimizer: Optimizers) -> None:
        """``optimizer``'s step on finite gradients, then the scale's update (it grows)."""
        optimizer.step(self.scaler)
        self.scaler.update()

    def overflowed(self, mean_loss: float) -> bool:
        """After a step of non-finite gradients (or loss): the scale's update (it halves), and
        whether the scaler skips the step, a finite loss whose scaled gradients overflowed in
        fp16, rather than the trainer counting it bad."""
        self.scaler.update()
        return self.on and math.isfinite(mean_loss)

    def count_skip(self, skipped: int) -> int:
        """The count of skipped steps with one more (``skipped`` before it); the run stops
        once the scale fell below ``MIN_LOSS_SCALE``: the gradients overflow at any scale.
        A wait for the device, on a skipped step alone."""
        scale, skipped = self.scaler.get_scale(), skipped + 1
        if scale < MIN_LOSS_SCALE:
            raise Seq2SeqError(
                f"training stopped: the fp16 gradients overflow at any loss scale (down to "
                f"{scale:.1e} after {skipped} skipped steps); last good checkpoint kept; try "
                "a lower train.lr, or train.precision bf16 or fp32"
            )
        return skipped

    def values(self, skipped: int) -> dict[str, float]:
        """The scale now and the steps it skipped so far, for a metrics line (none when off)."""
        return {"loss_scale": self.scaler.get_scale(), "scaler_skips": skipped} if self.on else {}

    def saved(self) -> dict[str, Any]:
        """Its state, for the training state's counters (none when off)."""
        return {SAVED_KEY: self.scaler.state_dict()} if self.on else {}

    def restore(self, counters: dict[str, Any]) -> None:
        if self.on and SAVED_KEY in counters:
            self.scaler.load_state_dict(counters[SAVED_KEY])
