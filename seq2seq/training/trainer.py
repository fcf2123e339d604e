"""The trainer: a loop of named steps over the model, the loss, the schedule and the run directory.

Nothing here knows how the model works inside: it takes logits from ``model(src, tgt_in)``,
computes the loss apart, and owns the schedule, clipping, validation, checkpoints and logs.
``entry.train`` makes the run directory ready and builds the ``Trainer``; its counters are
state.py's, its budgets budget.py's, and its validations validation.py's ``Validation``.
The same code runs as one process or, under ``torchrun``, as several with
DistributedDataParallel: every rank builds the same batch order, each takes its share of
every batch, gradients are averaged, and only rank 0 writes files or prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm  # a widget in a notebook with ipywidgets, else text

from seq2seq.config import Config, dropout_at
from seq2seq.data.batching import Buckets, Prefetcher, TokenBatchSampler
from seq2seq.data.prepare import Prepared
from seq2seq.data.store import PairStore
from seq2seq.data.subword import EpochSampler
from seq2seq.fileio import atomic_write_text
from seq2seq.model.transformer import Seq2Seq, build_model
from seq2seq.run import checkpoint
from seq2seq.run.precision import autocast_dtype, describe_precision, matmul_precision
from seq2seq.run.runlog import MetricsLog, say, write_environment
from seq2seq.run.runtime import (
    Runtime,
    StopSignals,
    agree,
    distributed,
    gather,
    main_first,
    peak_memory,
    seed_ranks,
)
from seq2seq.training import budget, optim
from seq2seq.training.compiling import compile_errors, compiled, wants_compile
from seq2seq.training.ema import WeightEMA
from seq2seq.training.graphs import wants_graphs
from seq2seq.training.optim import build_optimizer, inverse_sqrt
from seq2seq.training.prepare import prepare_data
from seq2seq.training.scaling import LossScaling
from seq2seq.training.state import TrainState, describe_dropout, describe_end, describe_subwords
from seq2seq.training.steps import Steps
from seq2seq.training.validation import Validation


class Trainer(Steps):
    """One run: ``Trainer(...)`` builds it (data, model, optimizer, state), ``run()`` trains.
    Validating, averaging and ending a run are its ``validation``'s (validation.py)."""

    def __init__(
        self,
        config: Config,
        run_dir: Path,
        runtime: Runtime,
        resume: bool,
        tensorboard: bool,
        progress: bool,
    ) -> None:
        self.config, self.run_dir, self.runtime, self.progress = config, run_dir, runtime, progress
        self.resumed = resume
        self.graphed = wants_graphs(config, runtime)  # refused in one line before any work
        torch.manual_seed(config.train.seed)
        self.data = self._prepare_data()
        self.dtype = autocast_dtype(config.train.precision, runtime.device)
        self.scaling = LossScaling(self.dtype, runtime.device)  # fp16's; off, it does nothing
        self._save_recipe()
        self.model, self.optimizer, self.schedule = self._build_model()
        self.state = self._restore()
        self.ema = WeightEMA(self.model, config.train.ema, self.last_file() if resume else None)
        if runtime.main:  # one entry per segment of training: a resumed run keeps the earlier ones
            write_environment(run_dir, runtime, config.train.precision, self.dtype, self.state.step)
        self.ddp, self.forward, self.compile_errors = self._forward()
        # None: batches as they come; a captured step needs them (one graph a shape)
        self.buckets = Buckets.of_run(config, runtime.device, self.graphed)
        self.graphs = self._capture() if self.graphed else None
        self.use_pairs(self.data.train)
        # the epochs' sampled segmentations, when data.subword_alpha is set
        self.subwords = EpochSampler.of_run(config, self.data.train, run_dir)
        # metrics.jsonl (and TensorBoard's files); resuming, cut back to the state
        self.log = MetricsLog(
            run_dir, runtime.main, tensorboard, self.state.step if resume else None
        )
        self.signals = StopSignals(self.say)  # a second signal says what was last saved
        if resume:
            self.signals.saved = self.saved_state()
        self.clock = budget.Clock(self.state.elapsed)
        self.saved_at = self.state.elapsed  # the clock's reading at the last save
        self.validation = self._validation()
        self.dropout = config.model.dropout  # as the schedule last set it (set_dropout)
        self.tick, self.tick_tokens = time.monotonic(), 0  # tokens/s since the last log line
        self._introduce()

    def _prepare_data(self) -> Prepared:
        """The run's data (prepare.py); the model config takes its vocabulary sizes."""
        data = prepare_data(self.config, self.run_dir, self.runtime, self.resumed)
        self.config.model.src_vocab_size = data.tokenizer.src_vocab_size
        self.config.model.tgt_vocab_size = data.tokenizer.tgt_vocab_size
        return data

    def _save_recipe(self) -> None:
        """Rank 0 writes the config, vocabulary sizes included, and the data's summary."""
        if self.runtime.main:
            checkpoint.save_config(self.run_dir, self.config)
            summary = json.dumps(self.data.summary, indent=2)
            atomic_write_text(self.run_dir / "data_summary.json", summary)

    def _build_model(self) -> tuple[Seq2Seq, optim.Optimizers, Callable[[int], float]]:
        """The model on its device, its optimizer and its learning-rate schedule."""
        t = self.config.train
        model = build_model(self.config.model).to(self.runtime.device)
        seed_ranks(t.seed, self.runtime)  # the same initial weights, each rank its own dropout
        return model, build_optimizer(model, self.config), inverse_sqrt(t.warmup_steps)

    def _restore(self) -> TrainState:
        """Fresh counters; or, resuming, those of ``last.safetensors``, whose model,
        optimizer and loss scaler states are loaded."""
        if not self.resumed:
            return TrainState()
        counters = checkpoint.load_training_state(
            self.last_file(), self.model, self.optimizer, self.runtime.rank
        )
        self.scaling.restore(counters)
        return TrainState.from_saved(counters)

    def _forward(self) -> tuple[nn.Module, Callable, tuple[type[BaseException], ...]]:
        """The (DDP-wrapped) model; what the training step calls, that model compiled if
        ``train.compile`` says so; and the compile errors, which surface at the first call
        and which train_epoch catches (none when eager)."""
        ddp = distributed(self.model, self.runtime)
        if wants_compile(self.config.train.compile, self.runtime.device):
            return ddp, compiled(ddp), compile_errors()
        return ddp, ddp, ()

    def _validation(self) -> Validation:
        """The run's validations: they score this model, move these counters, keep weights."""
        return Validation(
            self.config,
            self.run_dir,
            self.runtime,
            self.data,
            self.model,
            self.dtype,
            self.state,
            self.ema,
            self.log,
            self.say,
            self.clock.elapsed,
            scores_stale=self.resumed and self.runtime.main,
        )

    def _introduce(self) -> None:
        """The run's first lines: what trains on what, its budgets and its schedules."""
        self.say(self.describe())
        self.say(self.config.train.budgets())
        self.say(describe_dropout(self.config))
        if describe_subwords(self.config):
            self.say(describe_subwords(self.config))

    def describe(self) -> str:
        summary, n_params = self.data.summary, sum(p.numel() for p in self.model.parameters())
        return (
            f"{summary['source']}: "
            + ", ".join(f"{k} {v}" for k, v in summary["pairs"].items())
            + f"; dropped {summary['dropped'] or 'none'}; model {n_params:,} parameters; "
            + describe_precision(self.config.train.precision, self.dtype, self.runtime.device)
            + (f" x{self.runtime.world} processes" if self.runtime.world > 1 else "")
            + f"; a step takes {self.batches_per_step()} batch(es) of up to "
            + f"{self.config.data.max_tokens} tokens"
            + (f", padded to {len(self.buckets.lengths)} shapes" if self.buckets else "")
            + ("; torch.compile" if self.compile_errors and not self.graphs else "")
            + ("; the step captured as CUDA graphs" if self.graphs else "")
            + (f"; resuming at step {self.state.step}" if self.resumed else "")
        )

    def use_pairs(self, pairs: PairStore) -> None:
        """Train on ``pairs`` (the store, or an epoch's sampled segmentation of it)."""
        self.train_pairs = pairs  # lengths + 1: EOS (and BOS) included
        self.sampler = TokenBatchSampler(
            pairs.src_lengths + 1,
            pairs.tgt_lengths + 1,
            self.config.data.max_tokens,
            self.config.train.seed,
            buckets=self.buckets,
        )

    def batches_per_step(self) -> int:
        """Every process takes ``accum_steps`` batches of ``data.max_tokens`` a step."""
        return self.runtime.world * self.config.train.accum_steps

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> TrainState:
        """Train epoch after epoch until a budget is spent or a signal stops the run, saving
        the state after each (and once before the first step); then, unless a signal stopped
        it, ``validation.finish`` (the end state scored, averages tried, attention drawn). TF32
        as asked, here alone. Returns the counters, rank 0's."""
        s, t = self.state, self.config.train
        self.model.train()
        s.stop_reason = self.check_stop()  # a resumed run may already be over
        if self.resumed and s.finished and s.stop_reason:  # the clock ran out since train() looked
            self.say(budget.already_finished(self.run_dir, s.stop_reason))
            self.log.close()
            return agree(self.runtime, s)
        s.finished = False
        self.log.log("start", s.step, peak_memory(self.runtime.device))  # before any step
        numerics = matmul_precision(t.precision, self.runtime.device)
        with numerics, self.signals, self.subwords or contextlib.nullcontext():
            if not self.resumed:  # before any validation writes weights: from here on it resumes
                self.save()
            if not self.signals.installed:
                self.say(
                    "note: training in a thread, not the main one: a signal (Ctrl-C, SIGTERM, "
                    "a notebook's stop button) cannot stop it at a step's end and save it "
                    "(Python takes signals in the main thread alone)"
                )
            while s.stop_reason is None:  # the last epoch's end says max_epochs, at the latest
                self.train_epoch()
                self.save(due_only=True)
            if not s.stop_reason.startswith("signal"):  # agreed: every rank validates, or none
                self.validation.finish()
            self.save()
        self.log.close()
        minutes = self.clock.elapsed() / 60
        self.say(f"stopped: {s.stop_reason}; {describe_end(s, minutes)}; run in {self.run_dir}")
        return agree(self.runtime, s)  # the elapsed time is rank 0's

    def train_epoch(self) -> None:
        """The rest of this epoch, step by step (each ``train_step`` on a group of batches,
        then ``after_step``), until it ends or the run must stop (``check_stop``); at its end,
        the epoch counted and, when validation is by epoch, ``validation.validate``."""
        s, t = self.state, self.config.train
        if self.subwords is not None:
            pairs = self.epoch_pairs()
            if pairs is None:  # a signal while rank 0 waited for the sampling: stop, saved
                s.stop_reason = self.check_stop()
                return
            self.use_pairs(pairs)
        batches = self.sampler.batches(s.epoch)
        bar = tqdm(
            total=len(batches),
            initial=s.batch,
            desc=f"epoch {s.epoch}",
            disable=not (self.progress and self.runtime.main),
            leave=False,
            dynamic_ncols=True,
        )
        self.tick, self.tick_tokens = time.monotonic(), 0
        per_step = self.batches_per_step()
        groups = [batches[i : i + per_step] for i in range(s.batch, len(batches), per_step)]
        with Prefetcher(self.my_batches, groups, t.prefetch) as ready:
            for group, mine in zip(groups, ready, strict=False):
                self.dropout = dropout_at(self.config, s.epoch + s.batch / len(batches))
                self.model.set_dropout(self.dropout)
                try:
                    loss, n_tokens = self.take_step(group, mine)
                except self.compile_errors as e:  # () unless compiled: then catches nothing
                    loss, n_tokens = self.uncompile(e, group, mine)
                s.batch += len(group)
                bar.update(len(group))
                if self.graphs:  # counted as a step; a skipped one is read at the next log
                    s.step += 1
                    self.after_step(None, n_tokens, bar)
                elif loss is None:  # an fp16 overflow: skipped by the loss scaler
                    s.scaler_skips = self.scaling.count_skip(s.scaler_skips)
                elif math.isfinite(loss):
                    s.step += 1
                    self.after_step(loss, n_tokens, bar)
                else:
                    self.skip_bad_step()
                # several processes agree on the clock and signals every log_every steps only
                s.stop_reason = self.check_stop(
                    self.runtime.world == 1 or s.step % t.log_every == 0
                )
                if s.stop_reason:
                    break
        bar.close()
        if self.graphs is not None:  # the epoch's last steps skipped on the device, counted
            self.read_device()
        if s.batch >= len(batches):
            # Validation is collective under torchrun: decided on the agreed reason, never on
            # this rank's own signal flag, which another rank may not have yet. Read before the
            # epoch counts, so that the epoch budget ranks below what its validation spends.
            s.stop_reason = s.stop_reason or self.check_stop()
            s.epoch, s.batch = s.epoch + 1, 0
            validating = not t.validate_every and not (s.stop_reason or "").startswith("signal")
            if validating:
                self.validation.validate()
            s.stop_reason = s.stop_reason or self.check_stop(read_clock=validating)

    def epoch_pairs(self) -> PairStore | None:
        """This epoch's sampled training pairs. Rank 0 alone samples, while the other ranks
        wait; then every rank reads its store from RUN/subword, which every machine sees, as
        RUN/data. None when a signal to rank 0 stopped the sampling it waited for."""
        epoch = self.state.epoch

        def stopping() -> bool:
            return self.signals.received is not None

        if not main_first(self.runtime, lambda: self.subwords.sample(epoch, stopping)):
            return None
        return self.subwords.read(epoch)

    def after_step(self, loss: float | None, n_tokens: int, bar: tqdm) -> None:
        """Log every ``log_every`` steps; validate and save every ``validate_every``. A
        captured step's ``loss`` is None: read here, at log steps, with its skipped steps."""
        s, t = self.state, self.config.train
        self.tick_tokens += n_tokens
        if s.step % t.log_every == 0:
            if loss is None:
                loss = self.read_device()
            rate = self.tick_tokens / max(time.monotonic() - self.tick, 1e-9)
            lr = self.optimizer.lr
            postfix = {"loss": f"{loss:.3f}", "lr": f"{lr:.2e}", "tok_s": f"{rate:,.0f}"}
            left = budget.time_left(t, self.clock.elapsed())
            if left is not None:
                postfix["left"] = f"{int(left // 60)}:{int(left % 60):02d}"
            bar.set_postfix(postfix)
            values = {
                "loss": loss,
                "lr": lr,
                "dropout": self.dropout,
                "tokens_per_s": rate,
                "epoch": s.epoch,
            }
            values |= self.scaling.values(s.scaler_skips) | peak_memory(self.runtime.device)
            self.log.log("train", s.step, values)
            self.tick, self.tick_tokens = time.monotonic(), 0
        every = t.validate_every
        if t.cooldown_validate_every and self.cooling_down():
            every = t.cooldown_validate_every
        if every and s.step % every == 0:
            self.validation.validate()
            self.save(due_only=True)
            self.tick, self.tick_tokens = time.monotonic(), 0  # tokens/s measures training alone

    def save(self, due_only: bool = False) -> None:
        """The whole training state into ``last.safetensors``, with every rank's RNG: dropout
        masks differ across ranks, and a resumed rank must go on drawing where it stopped.
        ``due_only``: not sooner than ``train.save_every`` seconds after the last write (on
        rank 0's clock, so that every rank gathers, or none)."""
        every = self.config.train.save_every
        if due_only and every and self.clock.agreed - self.saved_at < every:
            return
        self.saved_at = self.clock.agreed
        rng = gather(self.runtime, checkpoint.rng_state())
        if self.runtime.main:
            self.validation.replacing_weights()
            self.state.elapsed = self.clock.elapsed()
            counters = dataclasses.asdict(self.state)
            counters |= self.scaling.saved()
            checkpoint.save_training_state(
                self.last_file(), self.model, self.optimizer, counters, rng, self.ema.saved()
            )
        self.signals.saved = self.saved_state()

    def last_file(self) -> Path:
        return self.run_dir / checkpoint.LAST_FILE

    def saved_state(self) -> str:
        """What a run stopped now would resume from, in words."""
        return f"last saved: step {self.state.step}, in {self.last_file()}"

    def check_stop(self, read_clock: bool = True) -> str | None:
        """Why the run should stop now (the same answer on every rank), or None: a signal, or
        a budget spent (``budget.spent``). The counters are the same on every rank; the clock
        is rank 0's, and a signal any rank's, read only when ``read_clock`` (one exchange for
        several processes), which also moves the share of the budget the cool-down reads."""
        if read_clock:
            # every rank stops, and cools down, by rank 0's clock; a signal to any rank (a
            # scheduler or the OOM killer may signal one) stops them all, before any budget
            seen = gather(self.runtime, (self.clock.elapsed(), self.signals.received))
            self.clock.agreed = seen[0][0]
            signals = [received for _, received in seen if received]
            if signals:
                return f"signal {signals[0]}"
        elapsed = self.clock.agreed if read_clock else None
        return budget.spent(self.state, self.config.train, elapsed)

    def say(self, message: str) -> None:
        if self.runtime.main:
            say(message, self.run_dir)
