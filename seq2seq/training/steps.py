"""The trainer's steps: one optimizer step over a group of batches, eager (``train_step``) or
replayed from its captured graph (graphs.py), with what a step needs around it (this process's
share of the batches, the learning rate of the coming step, the count of skipped steps).

``Steps`` is the part of ``Trainer`` (trainer.py) that steps: the trainer builds the model,
optimizer, loss scaler, schedule and sampler these methods read, and its loop calls them.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from seq2seq.config import Config
from seq2seq.data.batching import Batch, Buckets, TokenBatchSampler, collate
from seq2seq.data.store import PairStore
from seq2seq.errors import Seq2SeqError
from seq2seq.run.precision import autocast, matmul_precision
from seq2seq.run.runtime import Runtime
from seq2seq.training import budget, optim
from seq2seq.training.budget import Clock
from seq2seq.training.compiling import fallback
from seq2seq.training.ema import WeightEMA
from seq2seq.training.graphs import CapturedSteps
from seq2seq.training.optim import cooldown, sequence_loss
from seq2seq.training.scaling import LossScaling
from seq2seq.training.state import TrainState


class Steps:
    """The steps of a ``Trainer``, which sets every attribute named here before it steps."""

    config: Config
    runtime: Runtime
    state: TrainState
    model: nn.Module
    ddp: nn.Module
    forward: Callable
    compile_errors: tuple[type[BaseException], ...]
    optimizer: optim.Optimizers
    schedule: Callable[[int], float]
    scaling: LossScaling
    ema: WeightEMA
    clock: Clock
    sampler: TokenBatchSampler
    train_pairs: PairStore
    buckets: Buckets | None
    graphs: CapturedSteps | None
    dtype: torch.dtype | None
    say: Callable[[str], None]

    def _capture(self) -> CapturedSteps:
        """The step captured for every bucket shape (graphs.py), before the clock starts; the
        weights and Adam's state (fresh or resumed) are as they were. Under the run's TF32
        setting: a graph replays the matrix multiplies as the capture launched them."""
        began = time.monotonic()
        graphs = CapturedSteps(self.model, self.optimizer, self.config, self.buckets, self.dtype)
        with matmul_precision(self.config.train.precision, self.runtime.device):
            graphs.capture()
        self.say(
            f"captured the training step as CUDA graphs for {len(graphs.graphs)} batch shapes "
            f"in {time.monotonic() - began:.1f} s"
        )
        return graphs

    def my_batches(self, group: list[np.ndarray]) -> list[tuple[Batch, float]]:
        """This process's share of a step's ``group`` of batches, padded (to its bucket's shape
        with buckets; pinned for a GPU), each with its loss weight: a process left without a
        batch at the end of an epoch takes part with the first one at weight 0, so that every
        process steps together."""
        mine = group[self.runtime.rank :: self.runtime.world]
        weighted = [(idx, 1.0) for idx in mine] or [(group[0], 0.0)]
        pin = self.runtime.device.type == "cuda"
        pairs, buckets = self.train_pairs.pairs, self.buckets
        return [(collate(*pairs(idx), buckets).pinned(pin), w) for idx, w in weighted]

    def take_step(
        self, group: list[np.ndarray], mine: list[tuple[Batch, float]]
    ) -> tuple[float | None, int]:
        """``train_step``, or with the step captured, the replay of its graph (no loss: the
        host reads it at log steps)."""
        if self.graphs is None:
            return self.train_step(group, mine)
        n_total = self.step_tokens(group)
        self.set_lr()
        ((batch, _),) = mine
        self.graphs.step(batch, n_total)
        return None, n_total

    def step_tokens(self, group: list[np.ndarray]) -> int:
        """Target tokens of the whole step, EOS included: what the loss averages over."""
        return int(sum(self.sampler.tgt_lengths[idx].sum() for idx in group))

    def set_lr(self) -> None:
        """The schedule's learning rate for the coming step (the same on every rank)."""
        t = self.config.train
        used = budget.used(self.state, t, self.clock.agreed)
        self.optimizer.set_lr(self.schedule(self.state.step + 1) * cooldown(used, t.cooldown))

    def train_step(
        self, group: list[np.ndarray], mine: list[tuple[Batch, float]]
    ) -> tuple[float | None, int]:
        """One optimizer step over ``group`` (every process's batches, ``mine`` this one's);
        returns the mean loss per target token over the whole step and its target token
        count: NaN for a step skipped for a non-finite loss or gradient, None for an fp16
        step the loss scaler skipped (finite loss, overflowed scaled gradients)."""
        t, runtime = self.config.train, self.runtime
        n_total = self.step_tokens(group)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=runtime.device)
        for micro, (batch, weight) in enumerate(mine):
            batch = batch.to(runtime.device)
            last = micro == len(mine) - 1
            sync = last or not isinstance(self.ddp, nn.parallel.DistributedDataParallel)
            no_sync = contextlib.nullcontext() if sync else self.ddp.no_sync()
            with no_sync, autocast(runtime.device, self.dtype):
                logits = self.forward(batch.src, batch.tgt_in, check=False)  # no host read
                loss = sequence_loss(logits, batch.tgt_out, t.label_smoothing) * weight
            # DDP averages gradients over ranks, so each rank scales its sum by world / n_total
            # (and, in fp16, by the loss scale, which the gradients lose before clipping).
            self.scaling.scale(loss * runtime.world / n_total).backward()
            loss_sum += loss.detach()
        if runtime.world > 1:
            dist.all_reduce(loss_sum)
        self.scaling.unscale(self.optimizer)
        # A finite loss can still have a NaN/Inf gradient: check the norm too (one reduction;
        # with clipping off, an infinite max_norm measures without scaling). Both are read in
        # one transfer: the step's only wait for the device, which the skip decision needs.
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_norm or math.inf)
        loss_total, norm = torch.stack([loss_sum.float(), norm.float()]).tolist()
        mean_loss = loss_total / n_total
        if not (math.isfinite(mean_loss) and math.isfinite(norm)):
            self.optimizer.zero_grad(set_to_none=True)
            return (None if self.scaling.overflowed(mean_loss) else math.nan), n_total
        self.set_lr()
        self.scaling.step(self.optimizer)
        self.ema.update(self.state.step + 1)
        return mean_loss, n_total

    def uncompile(
        self, error: BaseException, group: list[np.ndarray], mine: list[tuple[Batch, float]]
    ) -> tuple[float | None, int]:
        """A compiled step failed to compile: the run ends, or says so and goes on eagerly
        from this same step, as ``compiling.fallback`` rules."""
        self.say(fallback(error, self.config.train.compile, self.state.step + 1))
        self.forward, self.compile_errors = self.ddp, ()
        return self.train_step(group, mine)

    def cooling_down(self) -> bool:
        """Whether the learning rate is in its cool-down (the last ``train.cooldown`` of the
        budget), by the counters and the clock as the ranks last agreed on it."""
        t = self.config.train
        return bool(t.cooldown) and budget.used(self.state, t, self.clock.agreed) > 1 - t.cooldown

    def read_device(self) -> float:
        """A captured step's last loss, with the steps it skipped since the last read counted
        (``skip_bad_step``): the host's one wait for the device, at log steps and epoch ends."""
        loss, skipped = self.graphs.read()
        for _ in range(skipped):
            self.skip_bad_step(on_device=True)
        return loss

    def skip_bad_step(self, on_device: bool = False) -> None:
        """A step skipped for a non-finite loss or gradient counted, and the run stopped
        past ``train.max_bad_steps``. ``on_device``: a captured step skipped it, found at the
        log step (it counts among the steps, which moved on)."""
        s, t = self.state, self.config.train
        s.bad_steps += 1
        where = f"a step before {s.step}" if on_device else f"step {s.step + 1}"
        self.say(
            f"warning: non-finite loss at {where}; step skipped "
            f"({s.bad_steps} of at most {t.max_bad_steps})"
        )
        if s.bad_steps > t.max_bad_steps:
            raise Seq2SeqError(
                f"training stopped: {s.bad_steps} steps with a NaN/Inf loss "
                f"(max {t.max_bad_steps}); last good checkpoint kept; try a lower train.lr"
            )
