"""The trainer: data, loop, schedule, clipping, validation, early stop, checkpoints and logs.

Nothing here knows how the model works inside: it takes logits from ``model(src, tgt_in)``,
computes the loss apart, and owns the schedule, clipping, checkpoints and logs. The same
code runs as one process or, under ``torchrun``, as several with DistributedDataParallel:
every rank builds the same batch order, each takes its share of every batch, gradients are
averaged, and only rank 0 writes files or prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import sacrebleu
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from seq2seq import checkpoint
from seq2seq.config import Config
from seq2seq.data import Batch, TokenBatchSampler, batches_of, collate, encode_pairs, load_corpus
from seq2seq.errors import Seq2SeqError
from seq2seq.fileio import atomic_write_text, remove_temporaries
from seq2seq.model import Seq2Seq, build_model
from seq2seq.precision import autocast, autocast_dtype
from seq2seq.search import greedy_search
from seq2seq.tokenizer import Tokenizer
from seq2seq.vocab import EOS_ID, PAD_ID

Value = TypeVar("Value")

# ---------------------------------------------------------------------------------------
# Devices, processes, precision.


@dataclass
class Runtime:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_runtime(device: str, threads: int | None) -> Runtime:
    """One process, or one rank of a ``torchrun`` job (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "cuda" and not torch.cuda.is_available():
        raise Seq2SeqError("train.device is 'cuda' but no CUDA device is available")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // local_world))
    return Runtime(rank, world, dev)


# ---------------------------------------------------------------------------------------
# The run directory: refuse to clobber, lock against a second trainer.


class RunLock:
    """An exclusive ``flock`` on ``run_dir/.lock``: released by the kernel if the holder dies."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / ".lock"
        self.handle = None

    def __enter__(self) -> RunLock:
        self.handle = open(self.path, "a+")  # noqa: SIM115
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.seek(0)
            holder = self.handle.read().strip() or "unknown"
            self.handle.close()
            raise Seq2SeqError(
                f"{self.path.parent} is in use by another training process (pid {holder})"
            ) from None
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(str(os.getpid()))
        self.handle.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Fail at start, with one line, if the directory cannot or must not be written."""
    if resume and not (run_dir / checkpoint.LAST_FILE).is_file():
        raise Seq2SeqError(f"cannot resume: {run_dir / checkpoint.LAST_FILE} does not exist")
    if (
        not resume
        and run_dir.exists()
        and any(p.name != ".lock" for p in run_dir.iterdir())
        and not overwrite
    ):
        raise Seq2SeqError(
            f"{run_dir} already holds a run; use --resume to continue it or --overwrite to replace it"
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_bytes(b"0" * 4096)
        probe.unlink()
    except OSError as e:
        raise Seq2SeqError(f"cannot write to {run_dir}: {e.strerror or e}") from None


# What a run writes; --overwrite removes these (and nothing else) so that no file of the
# old run (metrics, a best model, attention maps) survives into the new one.
RUN_FILES = (
    checkpoint.CONFIG_FILE,
    checkpoint.BEST_FILE,
    checkpoint.LAST_FILE,
    "metrics.jsonl",
    "data_summary.json",
    "spm.model",
    "spm_src.model",
    "spm_tgt.model",
)
RUN_DIRS = ("attention", "tensorboard")
# What a resumed run takes from its command line (budgets, stopping, logging, hardware);
# the recipe (model, data, seed, optimizer, schedule, loss) comes from its config.yaml.
RESUME_BUDGETS = (
    "max_epochs",
    "max_time",
    "max_steps",
    "patience",
    "max_bad_steps",
    "validate_every",
    "valid_bleu_sentences",
    "log_every",
    "attention_sentences",
    "threads",
    "device",
)


def clear_run_dir(run_dir: Path) -> None:
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(run_dir / name, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Data.


@dataclass
class Prepared:
    tokenizer: Tokenizer
    train_src: list[list[int]]
    train_tgt: list[list[int]]
    valid_src: list[list[int]]
    valid_tgt: list[list[int]]
    valid_refs: list[str]
    valid_sources: list[str]
    summary: dict[str, Any]


def prepare_data(config: Config, run_dir: Path, runtime: Runtime, resume: bool) -> Prepared:
    d = config.data
    corpus = load_corpus(d.data, d.src, d.tgt, d.test_split, d.carve_valid, d.carve_test)
    train_pairs, valid_pairs = corpus.splits["train"], corpus.splits["validation"]
    if not resume and runtime.main:
        Tokenizer.train(
            [s for s, _ in train_pairs],
            [t for _, t in train_pairs],
            run_dir,
            d.vocab_size,
            d.spm_model_type,
            d.joint_vocab,
        )
    if runtime.world > 1:
        dist.barrier()  # rank 0 has written the tokenizer
    tokenizer = Tokenizer.load(run_dir)
    train_src, train_tgt, n_long = encode_pairs(train_pairs, tokenizer, d.max_len)
    corpus.count_dropped("train", f"longer than {d.max_len} subwords", n_long)
    valid_src, valid_tgt, _ = encode_pairs(valid_pairs, tokenizer, None)
    limit = config.model.max_positions - 1  # room for EOS / BOS
    valid_src, valid_tgt = [s[:limit] for s in valid_src], [t[:limit] for t in valid_tgt]
    summary = {
        "source": corpus.source_description,
        "pairs": {
            "train": len(train_src),
            **{k: len(v) for k, v in corpus.splits.items() if k != "train"},
        },
        "dropped": corpus.dropped,
        "notes": corpus.notes + tokenizer.notes,
    }
    return Prepared(
        tokenizer,
        train_src,
        train_tgt,
        valid_src,
        valid_tgt,
        [t for _, t in valid_pairs],
        [s for s, _ in valid_pairs],
        summary,
    )


# ---------------------------------------------------------------------------------------
# Loss, schedule, validation.


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


def inverse_sqrt(warmup: int):
    """Linear warmup to the peak, then decay ∝ 1/√step (Vaswani et al. 2017)."""

    def factor(step: int) -> float:
        step = max(step, 1)
        return step / warmup if warmup and step < warmup else math.sqrt(max(warmup, 1) / step)

    return factor


@torch.inference_mode()
def validation_loss(model: nn.Module, data: Prepared, max_tokens: int, device, dtype) -> float:
    total, tokens = 0.0, 0
    for idx in batches_of(data.valid_src, data.valid_tgt, max_tokens):
        batch = collate([data.valid_src[i] for i in idx], [data.valid_tgt[i] for i in idx]).to(
            device
        )
        with autocast(device, dtype):
            logits = model(batch.src, batch.tgt_in)
        total += sequence_loss(logits, batch.tgt_out, 0.0).item()
        tokens += batch.n_tgt_tokens
    return total / max(tokens, 1)


@torch.inference_mode()
def translate_ids(
    model: Seq2Seq,
    src_ids: list[list[int]],
    max_tokens: int,
    device,
    dtype,
    need_weights: bool = False,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
) -> list:
    """Greedy hypotheses for ``src_ids`` in input order, decoded in token-bounded batches."""
    out: list = [None] * len(src_ids)
    for idx in batches_of(src_ids, None, max_tokens):
        batch = collate([src_ids[i] for i in idx], None).to(device)
        with autocast(device, dtype):
            hyps = greedy_search(model, batch.src, max_len_a, max_len_b, need_weights=need_weights)
        for i, hyp in zip(idx, hyps, strict=True):
            out[i] = hyp
    return out


def save_attention_maps(model: Seq2Seq, data: Prepared, n: int, out_dir: Path, device) -> None:
    """Cross-attention of a few fixed validation sentences: PNG grids plus the raw weights."""
    from seq2seq.plotting import plot_attention, write_attention_json  # matplotlib only when used

    tok = data.tokenizer
    hyps = translate_ids(model, data.valid_src[:n], 4096, device, None, need_weights=True)
    for i, hyp in enumerate(hyps):
        src_pieces = tok.pieces(data.valid_src[i] + [EOS_ID], "src")
        tgt_ids = hyp.tokens + ([EOS_ID] if hyp.stop_reason == "eos" else [])
        tgt_pieces = tok.pieces(tgt_ids, "tgt")
        weights = hyp.attention.float().cpu().numpy()  # (L, H, Tq, Tk)
        title = f"validation sentence {i}"
        plot_attention(
            weights, src_pieces, tgt_pieces, out_dir / f"sentence_{i}.png", heads="all", title=title
        )
        write_attention_json(
            weights,
            src_pieces,
            tgt_pieces,
            out_dir / f"sentence_{i}.json",
            translation=tok.decode(hyp.tokens, "tgt"),
            stop_reason=hyp.stop_reason,
            extra={"source": data.valid_sources[i]},
        )


# ---------------------------------------------------------------------------------------
# Logging.


class MetricsLog:
    """``metrics.jsonl`` (always) and TensorBoard event files (when asked and installed)."""

    def __init__(
        self, run_dir: Path, enabled: bool, tensorboard: bool, resume_step: int | None
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.writer = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            # Drop what was logged after the state we resume from: it will be logged again.
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if _logged_step(line) <= resume_step
            ]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print(
                    "warning: --tensorboard needs the 'tensorboard' package (pip install seq2seq[tensorboard])",
                    file=sys.stderr,
                )
            else:
                purge = None if resume_step is None else resume_step + 1
                self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _logged_step(line: str) -> float:
    """The step of a metrics line; infinite (dropped on resume) for one a crash cut short."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


class StopSignals:
    """SIGINT / SIGTERM set a flag; the loop saves its state at the end of the step and exits."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------------------
# The loop.


def train(
    config: Config,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    tensorboard: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Train ``config`` into ``run_dir``; returns the final counters (best BLEU, step, reason)."""
    run_dir = Path(run_dir)
    t = config.train
    runtime = setup_runtime(t.device, t.threads)
    if runtime.main:
        prepare_run_dir(run_dir, resume, overwrite)
    if runtime.world > 1:
        dist.barrier()
    lock = RunLock(run_dir) if runtime.main else contextlib.nullcontext()
    with lock:
        if runtime.main:
            remove_temporaries(run_dir, RUN_FILES)  # left by a process killed mid-write
        if overwrite and not resume and runtime.main:
            clear_run_dir(run_dir)
        if resume:
            saved = checkpoint.load_config_file(run_dir)
            for name in RESUME_BUDGETS:  # budgets may change on resume; the recipe may not
                setattr(saved.train, name, getattr(config.train, name))
            config = saved
        return _train(config, run_dir, runtime, resume, tensorboard, progress)


def _train(
    config: Config, run_dir: Path, runtime: Runtime, resume: bool, tensorboard: bool, progress: bool
) -> dict[str, Any]:
    t, device = config.train, runtime.device
    torch.manual_seed(t.seed)
    data = prepare_data(config, run_dir, runtime, resume)
    config.model.src_vocab_size = data.tokenizer.src_vocab_size
    config.model.tgt_vocab_size = data.tokenizer.tgt_vocab_size
    if runtime.main:
        checkpoint.save_config(run_dir, config)
        atomic_write_text(run_dir / "data_summary.json", json.dumps(data.summary, indent=2))
    model = build_model(config.model).to(device)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay
    )
    schedule = inverse_sqrt(t.warmup_steps)
    state = {
        "step": 0,
        "epoch": 0,
        "batch": 0,
        "best_bleu": -1.0,
        "best_step": 0,
        "bad_validations": 0,
        "bad_steps": 0,
        "valid_step": -1,  # the step last validated
        "elapsed": 0.0,
        "stop_reason": None,
    }
    if resume:
        state.update(
            checkpoint.load_training_state(
                run_dir / checkpoint.LAST_FILE, model, optimizer, runtime.rank
            )
        )
        state["stop_reason"] = None
    dtype = autocast_dtype(t.precision, device)
    ddp = nn.parallel.DistributedDataParallel(model) if runtime.world > 1 else model
    sampler = TokenBatchSampler(
        [len(s) + 1 for s in data.train_src],
        [len(x) + 1 for x in data.train_tgt],
        config.data.max_tokens,
        t.seed,
    )
    log = MetricsLog(run_dir, runtime.main, tensorboard, state["step"] if resume else None)
    if runtime.main:
        say(
            f"{data.summary['source']}: "
            + ", ".join(f"{k} {v}" for k, v in data.summary["pairs"].items())
            + f"; dropped {data.summary['dropped'] or 'none'}; model {sum(p.numel() for p in model.parameters()):,}"
            f" parameters; {'bf16 autocast' if dtype else 'fp32'} on {device}"
            + (f" x{runtime.world} processes" if runtime.world > 1 else "")
            + (f"; resuming at step {state['step']}" if resume else "")
        )
    started = time.time() - state["elapsed"]

    def save_last() -> None:
        # Every rank's RNG: dropout masks differ across ranks, and a resumed rank must go on
        # drawing from where it stopped for the run to continue as if never interrupted.
        rng = gather(runtime, checkpoint.rng_state())
        if runtime.main:
            state["elapsed"] = time.time() - started
            checkpoint.save_training_state(
                run_dir / checkpoint.LAST_FILE, model, optimizer, state, rng
            )

    def validate() -> None:
        model.eval()
        loss = validation_loss(model, data, config.data.max_tokens, device, dtype)
        n = min(t.valid_bleu_sentences, len(data.valid_src))
        d = config.decode
        hyps = translate_ids(
            model,
            data.valid_src[:n],
            d.max_tokens,
            device,
            dtype,
            max_len_a=d.max_len_a,
            max_len_b=d.max_len_b,
        )
        text = [data.tokenizer.decode(h.tokens, "tgt") for h in hyps]
        bleu = sacrebleu.corpus_bleu(text, [data.valid_refs[:n]]).score
        elapsed = time.time() - started
        state["valid_step"] = state["step"]
        if bleu > state["best_bleu"]:
            state.update(best_bleu=bleu, best_step=state["step"], bad_validations=0)
            checkpoint.save_model(
                model, run_dir / checkpoint.BEST_FILE, {"step": state["step"], "bleu": bleu}
            )
        else:
            state["bad_validations"] += 1
        if t.attention_sentences:
            save_attention_maps(
                model,
                data,
                t.attention_sentences,
                run_dir / "attention" / f"step_{state['step']}",
                device,
            )
        values = {
            "loss": loss,
            "ppl": math.exp(min(loss, 50)),
            "bleu": bleu,
            "best_bleu": state["best_bleu"],
            "epoch": state["epoch"],
            "elapsed_min": elapsed / 60,
        }
        log.log("valid", state["step"], values)
        say(
            f"step {state['step']} epoch {state['epoch']}: valid loss {loss:.3f} ppl {values['ppl']:.2f} "
            f"BLEU {bleu:.2f} (best {state['best_bleu']:.2f} at {state['best_step']}) {elapsed / 60:.1f} min"
        )
        model.train()

    def stop_reason(signal_name: str | None) -> str | None:
        if signal_name:
            return f"signal {signal_name}"
        if state["bad_validations"] >= t.patience:
            return f"no BLEU improvement in {t.patience} validations"
        if t.max_steps is not None and state["step"] >= t.max_steps:
            return f"max_steps {t.max_steps}"
        if t.max_time is not None and time.time() - started >= t.max_time * 60:
            return f"max_time {t.max_time} min"
        return None

    model.train()
    # A resumed run may already be over (its step budget spent, its patience run out).
    state["stop_reason"] = agree(runtime, stop_reason(None))
    with StopSignals() as signals:
        while state["stop_reason"] is None and state["epoch"] < t.max_epochs:
            epoch_batches = sampler.batches(state["epoch"])
            bar = tqdm(
                total=len(epoch_batches),
                initial=state["batch"],
                desc=f"epoch {state['epoch']}",
                disable=not (progress and runtime.main),
                leave=False,
                dynamic_ncols=True,
            )
            tick, tick_tokens = time.time(), 0
            while state["batch"] < len(epoch_batches):
                group = epoch_batches[state["batch"] : state["batch"] + t.accum_steps]
                loss, n_tokens = train_step(
                    ddp,
                    optimizer,
                    group,
                    data,
                    config,
                    runtime,
                    dtype,
                    lr=t.lr * schedule(state["step"] + 1),
                )
                state["batch"] += len(group)
                bar.update(len(group))
                if not math.isfinite(loss):
                    state["bad_steps"] += 1
                    if runtime.main:
                        say(
                            f"warning: non-finite loss at step {state['step'] + 1}; step skipped "
                            f"({state['bad_steps']} of at most {t.max_bad_steps})"
                        )
                    if state["bad_steps"] > t.max_bad_steps:
                        raise Seq2SeqError(
                            f"training stopped: {state['bad_steps']} steps with a NaN/Inf loss "
                            f"(max {t.max_bad_steps}); last good checkpoint kept; try a lower train.lr"
                        )
                    state["stop_reason"] = agree(runtime, stop_reason(signals.received))
                    if state["stop_reason"]:
                        break
                    continue
                state["step"] += 1
                tick_tokens += n_tokens
                if state["step"] % t.log_every == 0:
                    rate = tick_tokens / max(time.time() - tick, 1e-9)
                    lr = optimizer.param_groups[0]["lr"]
                    bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{rate:,.0f}")
                    log.log(
                        "train",
                        state["step"],
                        {"loss": loss, "lr": lr, "tokens_per_s": rate, "epoch": state["epoch"]},
                    )
                    tick, tick_tokens = time.time(), 0
                if t.validate_every and state["step"] % t.validate_every == 0:
                    if runtime.main:
                        validate()
                    save_last()
                    tick, tick_tokens = time.time(), 0  # tokens/s measures training alone
                state["stop_reason"] = agree(runtime, stop_reason(signals.received))
                if state["stop_reason"]:
                    break
            bar.close()
            if state["batch"] >= len(epoch_batches):
                state.update(epoch=state["epoch"] + 1, batch=0)
                if not t.validate_every and runtime.main and not (signals.received):
                    validate()
                state["stop_reason"] = state["stop_reason"] or agree(
                    runtime, stop_reason(signals.received)
                )
            save_last()
        state["stop_reason"] = state["stop_reason"] or f"max_epochs {t.max_epochs}"
        if runtime.main and state["valid_step"] != state["step"] and not signals.received:
            validate()  # the state the budget ended on is scored too, and a model always exists
        save_last()
    log.close()
    if runtime.main:
        say(
            f"stopped: {state['stop_reason']}; best validation BLEU {state['best_bleu']:.2f} at step "
            f"{state['best_step']}; {state['step']} steps, {(time.time() - started) / 60:.1f} min; run in {run_dir}"
        )
    return agree(runtime, state)  # validation counters live on rank 0


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    group: list[list[int]],
    data: Prepared,
    config: Config,
    runtime: Runtime,
    dtype,
    lr: float,
) -> tuple[float, int]:
    """One optimizer step over ``group`` (``accum_steps`` batches); returns the mean loss per
    target token over the whole global batch and its target token count."""
    t = config.train
    n_total = sum(sum(len(data.train_tgt[i]) + 1 for i in idx) for idx in group)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), device=runtime.device)
    for micro, idx in enumerate(group):
        shard = idx[runtime.rank :: runtime.world]
        weight = 1.0
        if not shard:  # fewer pairs than ranks: take part with zero weight
            shard, weight = idx[:1], 0.0
        batch: Batch = collate(
            [data.train_src[i] for i in shard], [data.train_tgt[i] for i in shard]
        )
        batch = batch.to(runtime.device)
        sync = micro == len(group) - 1 or not isinstance(model, nn.parallel.DistributedDataParallel)
        with contextlib.nullcontext() if sync else model.no_sync(), autocast(runtime.device, dtype):
            logits = model(batch.src, batch.tgt_in)
            loss = sequence_loss(logits, batch.tgt_out, t.label_smoothing) * weight
        # DDP averages gradients over ranks, so each rank scales its sum by world / n_total.
        (loss * runtime.world / n_total).backward()
        loss_sum += loss.detach()
    if runtime.world > 1:
        dist.all_reduce(loss_sum)
    mean_loss = loss_sum.item() / n_total
    # A finite loss can still have a NaN/Inf gradient: check the norm too (one reduction;
    # with clipping off, an infinite max_norm measures without scaling).
    norm = nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm or math.inf)
    if not (math.isfinite(mean_loss) and math.isfinite(norm.item())):
        optimizer.zero_grad(set_to_none=True)
        return math.nan, n_total
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    optimizer.step()
    return mean_loss, n_total


def agree(runtime: Runtime, value: Value) -> Value:
    """Rank 0's value for every rank, so that no rank waits for a step the others skip."""
    if runtime.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(runtime: Runtime, value: Value) -> list[Value]:
    """Every rank's ``value``, in rank order, on every rank."""
    if runtime.world == 1:
        return [value]
    values: list = [None] * runtime.world
    dist.all_gather_object(values, value)
    return values


def say(message: str) -> None:
    tqdm.write(message, file=sys.stderr)
