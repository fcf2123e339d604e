"""The training step captured as CUDA graphs (``train.cuda_graphs``): one graph per bucket shape
(``data.pad_to_buckets``), replayed for every batch of that shape, so that a step costs the
host a few copies and one replay instead of some 4,700 dispatched operations.

A graph replays the kernels it recorded on the memory it recorded them on. So everything a
step reads or keeps lives in tensors made before the capture and written in place: the batch
(``StaticStep``'s buffers), the gradients (zeroed, never set to None), Adam's moments and
step counts (fused and capturable, its learning rate a device tensor the schedule fills), and
what the host reads back at log steps: the last step's loss and the count of skipped steps. A
step whose loss or gradient norm is not finite is skipped on the device (fused Adam's
``found_inf``), with no wait for it; the host counts it at the next log line.

Before the clock starts, each shape is warmed up and captured on a synthetic batch, then the
weights, Adam's state and the RNG are put back as they were, in place: real training is
replays alone, and a resumed run (captured again, then given its saved state) goes on as the
uninterrupted run would. ``auto`` stays off until a record on a GPU shows the captured step
faster with its training equal (``GRAPHS_WIN``); ``CudaGraphs`` is what it calls of
``torch.cuda``, which a CPU test replaces (tests/fakes.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq.config import Config
from seq2seq.config_checks import setting_of
from seq2seq.data.batching import Batch, Buckets
from seq2seq.errors import Seq2SeqError
from seq2seq.run.precision import autocast, autocast_dtype
from seq2seq.run.runtime import Runtime
from seq2seq.training.optim import Optimizers, sequence_loss
from seq2seq.vocab import SPECIAL_IDS

# Device types where a record showed the captured step faster, its training equal: none yet.
GRAPHS_WIN: frozenset[str] = frozenset()
WARMUP_STEPS = 3  # eager steps on a side stream before a capture (torch's CUDA graph notes)


def refusals(config: Config, runtime: Runtime) -> list[str]:
    """Why this run cannot capture its step (none: it can)."""
    t, why = config.train, []
    if runtime.device.type != "cuda":
        why.append(f"a CUDA device (this run is on {runtime.device})")
    if runtime.world > 1:
        why.append("one process (torchrun's gradients are reduced outside a graph)")
    if t.accum_steps != 1:
        why.append("train.accum_steps 1")
    if t.optimizer != "adam":
        why.append("train.optimizer adam (fused Adam is what a graph steps)")
    if autocast_dtype(t.precision, runtime.device) == torch.float16:  # auto too, below 8.0
        why.append("a precision other than fp16 (the loss scaler reads the device)")
    if t.ema:
        why.append("train.ema 0")
    if setting_of(t.compile) == "true":
        why.append("train.compile false")
    if setting_of(config.data.pad_to_buckets) == "false":
        why.append("data.pad_to_buckets true or auto (a graph has one shape)")
    return why


def wants_graphs(config: Config, runtime: Runtime) -> bool:
    """``train.cuda_graphs``: ``true`` captures, or refuses in one line naming what it needs;
    ``auto`` captures where ``GRAPHS_WIN`` holds the device type and nothing refuses it."""
    setting, why = setting_of(config.train.cuda_graphs), refusals(config, runtime)
    if setting == "true" and why:
        raise Seq2SeqError("train.cuda_graphs true needs " + "; ".join(why))
    return not why and (setting == "true" or runtime.device.type in GRAPHS_WIN)


class CudaGraphs:
    """What a captured step calls of ``torch.cuda``: a memory pool the graphs share, a side
    stream for the warm-up steps, and the capture of a callable into a graph."""

    def pool(self):
        return torch.cuda.graph_pool_handle()

    def warm_up(self, body: Callable[[], None], steps: int) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(steps):
                body()
        torch.cuda.current_stream().wait_stream(side)

    def capture(self, body: Callable[[], None], pool) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            body()
        return graph

    def rng_state(self, device: torch.device) -> tuple[Tensor, Tensor]:
        return torch.get_rng_state(), torch.cuda.get_rng_state(device)

    def set_rng_state(self, state: tuple[Tensor, Tensor], device: torch.device) -> None:
        torch.set_rng_state(state[0])
        torch.cuda.set_rng_state(state[1], device)


class StaticStep:
    """One training step over the batch in its buffers (``shape``: rows, length), writing only
    in place: what a graph can record. Runs eagerly too, on any device: the CPU's tests
    compare it with the trainer's step. ``shared`` holds the tensors every shape's step
    writes: ``found_inf``, ``loss`` (the last step's mean loss a target token) and
    ``skipped`` (steps skipped since the host last read it). ``forward(src, tgt_in)``: the
    logits (ours, unchecked, by default; bench_train captures nn.Transformer's too)."""

    def __init__(
        self,
        model: nn.Module,
        adam: torch.optim.Adam,
        config: Config,
        dtype: torch.dtype | None,
        shape: tuple[int, int],
        shared: dict[str, Tensor],
        forward: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> None:
        device = next(model.parameters()).device
        self.model, self.adam, self.dtype, self.shared = model, adam, dtype, shared
        self.forward = forward or (lambda src, tgt_in: model(src, tgt_in, check=False))
        self.label_smoothing, self.clip_norm = config.train.label_smoothing, config.train.clip_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        ids = {"dtype": torch.long, "device": device}
        self.src, self.tgt_in, self.tgt_out = (torch.zeros(shape, **ids) for _ in range(3))
        self.n_tokens = torch.ones((), device=device)  # the step's target tokens, EOS included

    def load(self, batch: Batch, n_tokens: int) -> None:
        """The batch (already padded to this shape) into the buffers; no wait for the device."""
        self.src.copy_(batch.src, non_blocking=True)
        self.tgt_in.copy_(batch.tgt_in, non_blocking=True)
        self.tgt_out.copy_(batch.tgt_out, non_blocking=True)
        self.n_tokens.fill_(n_tokens)

    def load_synthetic(self, src_vocab: int, tgt_vocab: int) -> None:
        """Ordinary tokens at every position: a batch to warm up and capture on."""
        first = max(SPECIAL_IDS) + 1
        for buffer, vocab in ((self.src, src_vocab), (self.tgt_in, tgt_vocab)):
            buffer.random_(first, vocab)
        self.tgt_out.random_(first, tgt_vocab)
        self.n_tokens.fill_(self.tgt_out.numel())

    def __call__(self) -> None:
        """Forward, loss, backward, clip and Adam's step; skipped on the device when the loss
        or the gradient norm is not finite. The trainer's ``train_step`` for one process and
        one batch, less its one read of the device."""
        shared = self.shared
        for p in self.params:  # the gradients stay where the graph recorded them
            if p.grad is not None:
                p.grad.zero_()
        with autocast(self.src.device, self.dtype, cache=False):  # no cast cache in a graph
            logits = self.forward(self.src, self.tgt_in)
            loss = sequence_loss(logits, self.tgt_out, self.label_smoothing)
        (loss / self.n_tokens).backward()
        norm = nn.utils.clip_grad_norm_(self.params, self.clip_norm or math.inf)
        bad = (~torch.isfinite(loss.detach()) | ~torch.isfinite(norm)).float()
        shared["found_inf"].copy_(bad)
        self.adam.step()  # fused: found_inf skips it (moments and step count unchanged)
        shared["loss"].copy_(loss.detach().float() / self.n_tokens)
        shared["skipped"].add_(bad)


class CapturedSteps:
    """The run's step as one graph per bucket shape (see the module's docstring). ``step``
    replays the graph of a batch's shape; ``read`` is the host's one wait, at log steps."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Optimizers,
        config: Config,
        buckets: Buckets,
        dtype: torch.dtype | None,
        cuda: CudaGraphs | None = None,
        forward: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> None:
        (adam,) = optimizer.parts  # refusals(): Adam alone
        device = next(model.parameters()).device
        self.model, self.optimizer, self.config = model, optimizer, config
        self.cuda = cuda or CudaGraphs()
        self.shared = {k: torch.zeros((), device=device) for k in ("found_inf", "loss", "skipped")}
        adam.found_inf = self.shared["found_inf"]
        for group in adam.param_groups:  # a device learning rate: the schedule fills it
            group["lr"] = torch.tensor(float(group["lr"]), device=device)
            group["capturable"] = device.type == "cuda"
        shapes = [(buckets.max_tokens // length, length) for length in buckets.lengths]
        self.steps = {
            s: StaticStep(model, adam, config, dtype, s, self.shared, forward) for s in shapes
        }
        self.graphs: dict[tuple[int, int], object] = {}

    def capture(self) -> None:
        """Every shape warmed up and captured, then weights, Adam's state and the RNG put
        back in place, as they were before (a fresh run's, or a resumed run's saved state)."""
        device = next(self.model.parameters()).device
        saved = _snapshot(self.model, self.optimizer.parts[0])
        rng = self.cuda.rng_state(device)
        m = self.config.model
        pool = self.cuda.pool()
        for shape, step in self.steps.items():
            step.load_synthetic(m.src_vocab_size, m.tgt_vocab_size)
            self.cuda.warm_up(step, WARMUP_STEPS)
            self.graphs[shape] = self.cuda.capture(step, pool)
        _restore(self.model, self.optimizer.parts[0], saved)
        self.cuda.set_rng_state(rng, device)
        for value in self.shared.values():
            value.zero_()

    def step(self, batch: Batch, n_tokens: int) -> None:
        """Replay the graph of ``batch``'s shape on it. No wait for the device."""
        shape = tuple(batch.src.shape)
        if shape not in self.graphs:
            raise Seq2SeqError(
                f"a batch of shape {shape} has no captured step (shapes "
                f"{sorted(self.graphs)}): train.cuda_graphs needs data.pad_to_buckets"
            )
        self.steps[shape].load(batch, n_tokens)
        self.graphs[shape].replay()

    def read(self) -> tuple[float, int]:
        """The last step's mean loss and the steps skipped since the last read, in one
        transfer; the count starts again from zero."""
        loss, skipped = torch.stack([self.shared["loss"], self.shared["skipped"]]).tolist()
        self.shared["skipped"].zero_()
        return loss, int(skipped)


def _snapshot(model: nn.Module, adam: torch.optim.Adam) -> dict:
    """Copies of the weights and of Adam's state (none for a parameter not stepped yet), in
    host memory: the device holds the capture's own."""

    def copy(x: Tensor) -> Tensor:
        return x.detach().to("cpu", copy=True)

    return {
        "params": [copy(p) for p in model.parameters()],
        "state": {p: {k: copy(v) for k, v in s.items()} for p, s in adam.state.items()},
    }


@torch.no_grad()
def _restore(model: nn.Module, adam: torch.optim.Adam, saved: dict) -> None:
    """The snapshot's values into the same tensors, which the graphs hold; a parameter Adam
    had not stepped before gets its state as Adam first makes it: zeros, step 0."""
    for p, value in zip(model.parameters(), saved["params"], strict=True):
        p.copy_(value)
        if p.grad is not None:
            p.grad.zero_()
    for p, state in adam.state.items():
        before = saved["state"].get(p, {})
        for key, value in state.items():
            value.copy_(before[key]) if key in before else value.zero_()
