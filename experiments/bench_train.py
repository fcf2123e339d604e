"""Training throughput: seq2seq's model against ``torch.nn.Transformer`` of the same size.

Both models train (forward, backward, clipping, Adam step) on the same Multi30k batches,
interleaved: each round runs a few steps of every model, alternating the order, and the
median over rounds is reported, so a machine that slows down or speeds up part-way hurts
neither side more. The reference gets its best settings: pre-norm (``norm_first=True``),
``batch_first=True``, the same dims, ReLU, biases, the same dropout placement (embeddings
and residuals; attention and FFN-inner dropout as in our config), tied embeddings and
output, a causal mask plus key padding masks; with and without ``enable_nested_tensor``
(which PyTorch only uses for post-norm layers at inference, so both should tie).

With ``--muon``, our model trained by Muon (``train.optimizer muon``: Newton–Schulz on the
layers' matrices, Adam for the rest) joins as a contestant, a copy with the same initial
weights: what its step costs over Adam's is the seconds a step the clock judges it by.
``--muon-ns-steps N`` (repeatable) adds Muon with N Newton–Schulz iterations a step
(``train.muon_ns_steps``; ``--muon``'s is the config's, 5 by default).

With ``--compile``, ``torch.compile`` (inductor) joins as more contestants, each a copy of
the eager model with the same initial weights: the whole model with dynamic shapes, each
encoder and decoder layer compiled on its own (the embeddings, masks, output layer and
loss stay eager), the whole model in ``max-autotune-no-cudagraphs`` mode, the whole model
on batches padded to lengths in buckets of 16 (torch's automatic dynamic shapes), and the
best ``nn.Transformer`` set-up compiled whole. Compilation happens in the untimed warm-up
steps; its seconds are reported separately.

Model FLOP/s: analytic FLOPs per step (6 x non-embedding parameters x tokens they see,
plus the output layer and the attention scores, all x3 for forward + backward) over the
measured step time, as a fraction of the peak from a large fp32 and bf16 matmul measured
here. The goal: ours >= 1.3x the best reference. ``--json`` writes the results with the
machine they were measured on: ``--json experiments/results/NAME/benchmark.json`` makes
them a record that ``python -m experiments.records render`` turns into a speed table.

    python experiments/bench_train.py --run runs/de-en --json bench_train.json
    python experiments/bench_train.py --compile --threads 1 --json bench_compile_1.json
    python experiments/bench_train.py --quick          # seconds: proves the script runs
    python experiments/bench_train.py --muon --threads 1 --json bench_muon_1.json
    python experiments/bench_train.py --muon --muon-ns-steps 3 --threads 1 --rounds 6 --steps 4
    python experiments/bench_train.py --profile 12 --threads 2   # where our step's time goes
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # tests/ for the tiny run's settings

from helpers import TINY_RUN  # noqa: E402

from experiments.records.speed import muon_lines, train_table  # noqa: E402
from seq2seq.config import ModelConfig, load_config  # noqa: E402
from seq2seq.data.batching import Batch, Buckets, TokenBatchSampler, collate  # noqa: E402
from seq2seq.data.corpora import encode_pairs, load_corpus  # noqa: E402
from seq2seq.data.tokenizer import Tokenizer  # noqa: E402
from seq2seq.model.layers import sinusoidal_table  # noqa: E402
from seq2seq.model.transformer import build_model  # noqa: E402
from seq2seq.run.precision import (  # noqa: E402
    autocast,
    autocast_dtype,
    native_bf16,
    resolved_precision,
)
from seq2seq.run.runlog import accelerator, machine  # noqa: E402
from seq2seq.run.runtime import setup_runtime  # noqa: E402
from seq2seq.training.graphs import CapturedSteps  # noqa: E402
from seq2seq.training.optim import build_optimizer, sequence_loss  # noqa: E402
from seq2seq.vocab import PAD_ID  # noqa: E402

SPEEDUP_GOAL = 1.3  # ours over the best eager nn.Transformer set-up, in tokens/s
QUICK = [*TINY_RUN, "data.max_tokens=512"]  # --quick: the tests' tiny run, on small batches


class Reference(nn.Module):
    """``nn.Transformer`` dressed as our model: shared scaled embeddings, sinusoidal
    positions, tied output. Same call as ours: ``model(src, tgt_in) -> (B, T, V)``."""

    def __init__(self, c: ModelConfig, nested: bool, tgt_padding_mask: bool) -> None:
        super().__init__()
        self.tokens = nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=PAD_ID)
        self.register_buffer(
            "positions", sinusoidal_table(c.max_positions, c.d_model), persistent=False
        )
        self.scale = math.sqrt(c.d_model)
        self.dropout = nn.Dropout(c.dropout)
        encoder_layer = nn.TransformerEncoderLayer(
            c.d_model, c.n_heads, c.d_ff, c.dropout, batch_first=True, norm_first=True
        )
        with warnings.catch_warnings():  # "enable_nested_tensor is True, but ... norm_first"
            warnings.simplefilter("ignore")
            encoder = nn.TransformerEncoder(
                encoder_layer, c.n_enc_layers, nn.LayerNorm(c.d_model), enable_nested_tensor=nested
            )
        self.transformer = nn.Transformer(
            c.d_model,
            c.n_heads,
            c.n_enc_layers,
            c.n_dec_layers,
            c.d_ff,
            c.dropout,
            batch_first=True,
            norm_first=True,
            custom_encoder=encoder,
        )
        for module in self.transformer.modules():  # dropout where ours has it, nowhere else
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = c.attn_dropout
            if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
                module.dropout.p = c.activation_dropout  # the FFN-inner dropout
        self.tgt_padding_mask = tgt_padding_mask
        nn.init.normal_(self.tokens.weight, std=c.d_model**-0.5)

    def embed(self, ids: Tensor) -> Tensor:
        return self.dropout(self.tokens(ids) * self.scale + self.positions[: ids.shape[1]])

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_pad = src == PAD_ID  # (B, S), True = padding (torch's convention)
        n = tgt.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=tgt.device).triu(
            1
        )  # True = masked, like the padding masks
        x = self.transformer(
            self.embed(src),
            self.embed(tgt),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_key_padding_mask=(tgt == PAD_ID) if self.tgt_padding_mask else None,
        )
        return F.linear(x, self.tokens.weight)  # (B, T, V), tied output


def count(params) -> int:
    return sum(p.numel() for p in params)


@dataclass
class Flops:
    """Per-token costs of one model, from its parameters: 2 FLOPs per weight per token."""

    enc_params: int  # encoder layers + final norm: applied to source tokens
    dec_params: int  # decoder layers + final norm, cross-attention K/V projections excepted
    cross_kv_params: int  # applied to source (memory) tokens
    d_model: int
    vocab: int
    n_enc: int
    n_dec: int

    @classmethod
    def of(cls, model: nn.Module, c: ModelConfig) -> Flops:
        named = dict(model.named_parameters())
        enc = count(
            p for n, p in named.items() if n.startswith(("encoder_layers.", "encoder_norm."))
        )
        # Cross-attention's K|V rows of in_proj see source tokens, its Q rows target tokens.
        cross_kv = sum(
            p[c.d_model :].numel() for n, p in named.items() if ".cross_attn.in_proj." in n
        )
        dec = (
            count(p for n, p in named.items() if n.startswith(("decoder_layers.", "decoder_norm.")))
            - cross_kv
        )
        return cls(enc, dec, cross_kv, c.d_model, c.tgt_vocab_size, c.n_enc_layers, c.n_dec_layers)

    def training_step(self, batch: Batch) -> float:
        """Forward + backward (3x forward) FLOPs of one batch, counting real tokens only."""
        src_len = (batch.src != PAD_ID).sum(1).double()  # (B,)
        tgt_len = (batch.tgt_out != PAD_ID).sum(1).double()  # (B,)
        s, t = src_len.sum().item(), tgt_len.sum().item()
        linear = 2 * (self.enc_params * s + self.cross_kv_params * s + self.dec_params * t)
        output = 2 * self.d_model * self.vocab * t
        # QK^T and AV: 2 matmuls x 2 FLOPs x D per query-key pair; causal counted in full.
        pairs = self.n_enc * (src_len**2).sum() + self.n_dec * (
            (tgt_len**2).sum() + (tgt_len * src_len).sum()
        )
        attention = 4 * self.d_model * pairs.item()
        return 3 * (linear + output + attention)


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work, so that a clock read after it times the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(dtype: torch.dtype, n: int, repeats: int, device: torch.device) -> float:
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    a @ b  # warm up
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times)


def prepare_batches(args: argparse.Namespace, config) -> tuple[list[Batch], Tokenizer, str]:
    data = args.data
    corpus = load_corpus(data, args.src, args.tgt)
    pairs = corpus.splits["train"]
    if args.run and (Path(args.run) / "config.yaml").is_file():
        tokenizer, origin = Tokenizer.load(args.run), f"tokenizer of {args.run}"
    else:
        out = Path(tempfile.mkdtemp(prefix="bench-tokenizer-"))
        tokenizer = Tokenizer.train(
            [s for s, _ in pairs], [t for _, t in pairs], out, config.data.vocab_size
        )
        origin = f"tokenizer trained into {out}"
    src, tgt, _ = encode_pairs(pairs, tokenizer, config.data.max_len)
    d = config.data  # --captured: batches that fit their bucket's shape, for every contestant
    buckets = Buckets.covering(d.max_len, d.max_tokens, config.model.max_positions)
    sampler = TokenBatchSampler(
        [len(x) + 1 for x in src],
        [len(x) + 1 for x in tgt],
        d.max_tokens,
        seed=0,
        buckets=buckets if args.captured else None,
    )
    needed = args.rounds * args.steps + max(args.warmup, args.compile_warmup)
    batches = [
        collate([src[i] for i in idx], [tgt[i] for i in idx]) for idx in sampler.batches(0)[:needed]
    ]
    if len(batches) < needed:
        raise SystemExit(
            f"{data} gives {len(batches)} batches; need {needed} (fewer --rounds/--steps)"
        )
    return batches, tokenizer, f"{corpus.source_description}; {origin}"


def bucketed(batch: Batch, multiple: int) -> Batch:
    """``batch`` with its source and target lengths padded up to a multiple of ``multiple``:
    fewer distinct shapes for a compiled model; the loss ignores the extra PAD."""

    def pad(x: Tensor) -> Tensor:
        return F.pad(x, (0, -x.shape[1] % multiple), value=PAD_ID)

    return Batch(pad(batch.src), pad(batch.tgt_in), pad(batch.tgt_out), batch.n_tgt_tokens)


def compiled_contestants(
    ours: nn.Module, reference: nn.Module, which: str = "all"
) -> list[tuple[str, nn.Module, int]]:
    """(name, model, bucket) for each compiled set-up; copies, so the eager models stay eager.
    ``which="whole"``: ours and the reference compiled whole, dynamic, alone (minutes less)."""
    whole = torch.compile(copy.deepcopy(ours), dynamic=True)
    ref = torch.compile(copy.deepcopy(reference), dynamic=True)
    reference_name = "nn.Transformer, nested off, tgt padding mask on, compiled whole, dynamic"
    if which == "whole":
        return [("seq2seq, compiled whole, dynamic", whole, 0), (reference_name, ref, 0)]
    per_layer = copy.deepcopy(ours)
    for layer in [*per_layer.encoder_layers, *per_layer.decoder_layers]:
        layer.compile(dynamic=True)
    autotuned = torch.compile(copy.deepcopy(ours), mode="max-autotune-no-cudagraphs", dynamic=True)
    buckets = torch.compile(copy.deepcopy(ours))  # automatic dynamic shapes, the default
    return [
        ("seq2seq, compiled whole, dynamic", whole, 0),
        ("seq2seq, compiled per layer, dynamic", per_layer, 0),
        ("seq2seq, compiled whole, max-autotune-no-cudagraphs", autotuned, 0),
        ("seq2seq, compiled whole, lengths in buckets of 16", buckets, 16),
        (reference_name, ref, 0),
    ]


class Trainee:
    def __init__(self, name: str, model: nn.Module, config, dtype, bucket: int = 0) -> None:
        self.name, self.model, self.dtype, self.bucket = name, model.train(), dtype, bucket
        self.device = next(model.parameters()).device
        self.warmup_seconds = 0.0
        t = config.train
        self.optimizer = build_optimizer(
            model, config
        )  # the trainer's: fused Adam where torch has it
        self.label_smoothing, self.clip_norm = t.label_smoothing, t.clip_norm
        self.rates: list[float] = []
        self.step_times: list[float] = []
        self.flop_rates: list[float] = []
        self.losses: list[float] = []
        self.events = 0  # torch.profiler events of one step (profiler_events_per_step)

    def step(self, batch: Batch) -> float:
        """One optimizer step; returns its wall time in seconds."""
        if self.bucket:
            batch = bucketed(batch, self.bucket)
        synchronize(self.device)
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.dtype):
            logits = self.model(batch.src, batch.tgt_in)
        loss = sequence_loss(logits, batch.tgt_out, self.label_smoothing) / batch.n_tgt_tokens
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        self.optimizer.step()
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        self.losses.append(loss.item())
        return elapsed


class CapturedTrainee(Trainee):
    """The trainer's step captured as CUDA graphs (seq2seq/training/graphs.py), one per bucket
    shape, on ``model`` (ours, called unchecked; ``reference``: called as ``model(src,
    tgt_in)``): each batch padded to its bucket's shape, then its graph replayed. Captured
    before the warm-up, outside the timing."""

    def __init__(self, name: str, model: nn.Module, config, dtype, reference: bool) -> None:
        super().__init__(name, model, config, dtype)
        c, d = config.model, config.data
        self.buckets = Buckets.covering(d.max_len, d.max_tokens, c.max_positions)
        started = time.perf_counter()
        forward = model if reference else None  # None: ours, unchecked
        self.graphs = CapturedSteps(
            model, self.optimizer, config, self.buckets, dtype, None, forward
        )
        self.graphs.capture()
        self.capture_seconds = time.perf_counter() - started

    def step(self, batch: Batch) -> float:
        batch = batch.padded_to(*self.buckets.shape(batch))
        synchronize(self.device)
        start = time.perf_counter()
        self.graphs.step(batch, batch.n_tgt_tokens)
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        self.losses.append(self.graphs.read()[0])
        return elapsed


# What the profile's operators are, for the summary: the first pattern that is in the name.
KINDS = {
    "matrix multiplies": ("mm", "linear", "matmul", "baddbmm"),
    "fused attention": ("flash_attention", "scaled_dot_product"),
    "dropout": ("bernoulli", "dropout", "random_"),  # random_: layers.Dropout's draws
    "log-softmax and loss": ("log_softmax", "nll_loss", "cross_entropy"),
    "Adam": ("adam",),
    "casts and copies": ("copy_", "to_copy", "clone", "contiguous"),
    "fills and zeros": ("fill_", "zero_"),
}


def profiler_events_per_step(trainee: Trainee, batch: Batch) -> int:
    """torch.profiler's CPU events in one training step of a warmed-up ``trainee``, on any
    device: every operator call, the views and the operators that only call others included.
    Not a kernel count; a step that is launch-bound on a GPU grows with it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainee.step(batch)
    return sum(e.count for e in prof.key_averages() if not e.key.startswith("ProfilerStep"))


def profile_step(trainee: Trainee, warmup: list[Batch], batches: list[Batch]) -> dict:
    """The operators that take our step's time (torch.profiler, self CPU time), printed, and
    the share of each kind in ``KINDS``: printed and returned, with the operators that take
    the most."""
    from torch.profiler import ProfilerActivity, profile

    for batch in warmup:
        trainee.step(batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        seconds = sum(trainee.step(batch) for batch in batches)
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=20))
    total = sum(e.self_cpu_time_total for e in averages)
    shares = dict.fromkeys([*KINDS, "other"], 0.0)
    for event in averages:
        name = event.key.lower()
        kind = next((k for k, marks in KINDS.items() if any(m in name for m in marks)), "other")
        shares[kind] += event.self_cpu_time_total / total
    tokens = sum(b.n_tgt_tokens for b in batches)
    print(
        f"{len(batches)} steps, {tokens / seconds:,.0f} target tokens/s under the profiler; "
        f"{torch.get_num_threads()} threads; self CPU time by kind:"
    )
    for kind, share in sorted(shares.items(), key=lambda item: -item[1]):
        print(f"  {kind:22} {100 * share:5.1f}%")
    top = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:10]
    return {
        "steps": len(batches),
        "tokens_per_s": tokens / seconds,
        "ms_per_step": 1000 * seconds / len(batches),
        "shares": shares,
        "operators": [
            {"name": e.key, "calls": e.count, "share": e.self_cpu_time_total / total} for e in top
        ],
    }


def write_record(
    path: Path,
    kind: str,
    args: argparse.Namespace,
    config,
    source: str,
    n_params: int,
    dtype: torch.dtype | None,
    fields: dict,
) -> None:
    """The JSON record ``experiments.records`` renders: what ran, where, and ``fields``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": kind,
        "command": ["python", *sys.argv],
        "environment": {
            **machine(),
            "device": getattr(args, "device", "cpu"),
            **accelerator(torch.device(getattr(args, "device", "cpu"))),
        },
        "data": source,
        "max_tokens": config.data.max_tokens,
        "model_config": vars(config.model),
        "parameters": n_params,
        "threads": torch.get_num_threads(),
        "precision": "bf16"
        if dtype
        else "tf32"
        if getattr(args, "precision", "") == "tf32"
        else "fp32",
        **fields,
        "quick": args.quick,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config",
        type=Path,
        help="run config whose model/data sections to use (default: defaults)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE"
    )
    parser.add_argument(
        "--run", default="runs/de-en", help="take the tokenizer of this run when it exists"
    )
    parser.add_argument("--data", default="multi30k", help="corpus (default: %(default)s, shipped)")
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="steps per model per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--device", default="cpu", help="cpu (default), cuda, cuda:N: where the models train"
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "tf32", "bf16"),
        default="auto",
        help="auto: what the trainer would use (bf16 only where native); tf32: fp32 with "
        "TensorFloat-32 matrix multiplies on CUDA",
    )
    parser.add_argument("--matmul-size", type=int, default=4096)
    parser.add_argument(
        "--compile", action="store_true", help="add torch.compile set-ups (minutes of compiling)"
    )
    parser.add_argument(
        "--compiled",
        choices=("all", "whole"),
        default="all",
        help="with --compile: every compiled set-up, or ours and the reference compiled whole",
    )
    parser.add_argument(
        "--compile-warmup",
        type=int,
        default=12,
        help="untimed steps of each compiled set-up: enough shapes that it stops recompiling",
    )
    parser.add_argument(
        "--muon", action="store_true", help="add our model trained by Muon (train.optimizer)"
    )
    parser.add_argument(
        "--muon-ns-steps",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="add Muon with N Newton–Schulz iterations a step (train.muon_ns_steps); repeatable",
    )
    parser.add_argument(
        "--captured",
        action="store_true",
        help="CUDA: add the trainer's captured step (train.cuda_graphs) for ours and for "
        "nn.Transformer; every contestant then takes batches bounded by their buckets",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny model, few steps: proves the script runs"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--profile",
        type=int,
        metavar="STEPS",
        help="instead of the comparison: where our step's time goes, over STEPS profiled steps",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup, args.matmul_size = 2, 2, 1, 512
        args.compile_warmup = 2
        args.overrides = [*QUICK, *args.overrides]
    device = setup_runtime(args.device, args.threads).device
    if args.captured and device.type != "cuda":
        parser.error(f"--captured needs a CUDA device (this is {device})")

    config = load_config(args.config, args.overrides)
    batches, tokenizer, source = prepare_batches(args, config)
    batches = [b.to(device) for b in batches]
    c = config.model
    c.src_vocab_size, c.tgt_vocab_size = tokenizer.src_vocab_size, tokenizer.tgt_vocab_size
    if args.precision == "auto":  # what the trainer would use on this device
        args.precision = resolved_precision(config.train.precision, device)
    dtype = autocast_dtype(args.precision, device) if args.precision == "bf16" else None
    if args.precision == "bf16" and dtype is None:
        args.precision = "fp32"  # bf16 is not native here: the trainer computes in fp32
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"

    torch.manual_seed(0)
    ours = build_model(c).to(device)
    trainees = [Trainee("seq2seq", ours, config, dtype)]
    if args.profile:
        profiled = batches[args.warmup :][: args.profile]
        found = profile_step(trainees[0], batches[: args.warmup], profiled)
        if args.json:
            write_record(
                args.json,
                "profile",
                args,
                config,
                source,
                n_params=count(ours.parameters()),
                dtype=dtype,
                fields={"profile": found},
            )
        return
    for nested, tgt_pad in ((True, True), (False, True), (False, False)):
        name = f"nn.Transformer, nested {'on' if nested else 'off'}, tgt padding mask {'on' if tgt_pad else 'off'}"
        trainees.append(Trainee(name, Reference(c, nested, tgt_pad).to(device), config, dtype))
    if dtype is not None:  # the reference's best set-up may be fp32: its bf16 attention is slow
        name = "nn.Transformer, nested off, tgt padding mask on, fp32"
        trainees.append(Trainee(name, Reference(c, False, True).to(device), config, None))
    if args.compile:
        reference = trainees[2].model  # nested off, tgt padding mask on, in the same precision
        for name, model, bucket in compiled_contestants(ours, reference, args.compiled):
            trainees.append(Trainee(name, model, config, dtype, bucket))
    if args.captured:  # the same starting weights as the eager ones, and their own optimizer
        trainees.append(
            CapturedTrainee(
                "seq2seq, the trainer's step, captured",
                copy.deepcopy(ours),
                config,
                dtype,
                reference=False,
            )
        )
        reference = trainees[2].model  # nested off, tgt padding mask on
        name = "nn.Transformer, nested off, tgt padding mask on, captured"
        trainees.append(CapturedTrainee(name, copy.deepcopy(reference), config, dtype, True))
    for ns_steps in [None] * args.muon + args.muon_ns_steps:
        muon = copy.deepcopy(config)
        muon.train.optimizer = "muon"
        name = "seq2seq, Muon"
        if ns_steps is not None:
            muon.train.muon_ns_steps = ns_steps
            name += f", {ns_steps} Newton–Schulz steps"
        trainees.append(Trainee(name, copy.deepcopy(ours), muon, dtype))
    n_ours = count(ours.parameters())
    for trainee in trainees[1:]:  # the same architecture, so the same parameter count
        assert count(trainee.model.parameters()) == n_ours, (
            trainee.name,
            count(trainee.model.parameters()),
            n_ours,
        )
    flops = Flops.of(ours, c)

    print(
        f"data: {source}; {len(batches)} batches of <= {config.data.max_tokens} tokens",
        file=sys.stderr,
    )
    print(
        f"model: d_model {c.d_model}, {c.n_heads} heads, d_ff {c.d_ff}, {c.n_enc_layers}+{c.n_dec_layers} layers, "
        f"vocab {c.tgt_vocab_size}, {n_ours:,} parameters; {torch.get_num_threads()} threads; "
        f"{'bf16 autocast' if dtype else 'fp32'}",
        file=sys.stderr,
    )

    for trainee in trainees:
        start = time.perf_counter()
        warmup = args.compile_warmup if "compiled" in trainee.name else args.warmup
        for batch in batches[:warmup]:
            trainee.step(batch)
        trainee.warmup_seconds = time.perf_counter() - start
        print(f"warm-up {trainee.name}: {trainee.warmup_seconds:.1f} s", file=sys.stderr)
    for trainee in trainees:  # each warmed up above
        trainee.events = profiler_events_per_step(trainee, batches[0])
    timed = batches[args.warmup :]
    step_flops = [flops.training_step(b) for b in timed]
    for r in range(args.rounds):
        chunk = slice(r * args.steps, (r + 1) * args.steps)
        order = trainees if r % 2 == 0 else trainees[::-1]
        for trainee in order:
            seconds = [trainee.step(b) for b in timed[chunk]]
            tokens = sum(b.n_tgt_tokens for b in timed[chunk])
            trainee.rates.append(tokens / sum(seconds))
            trainee.step_times.append(sum(seconds) / len(seconds))
            trainee.flop_rates.append(sum(step_flops[chunk]) / sum(seconds))
        print(
            f"round {r + 1}/{args.rounds}: "
            + "; ".join(f"{t.name} {t.rates[-1]:,.0f}" for t in order),
            file=sys.stderr,
        )

    peaks = {"fp32": matmul_peak(torch.float32, args.matmul_size, 3, device)}
    if native_bf16(device):  # emulated bf16 takes minutes and is no peak
        peaks["bf16"] = matmul_peak(torch.bfloat16, args.matmul_size, 3, device)
    results = []
    for trainee in trainees:
        results.append(
            {
                "model": trainee.name,
                "tokens_per_s": statistics.median(trainee.rates),
                "tokens_per_s_min": min(trainee.rates),
                "tokens_per_s_max": max(trainee.rates),
                "tokens_per_s_rounds": [round(r, 1) for r in trainee.rates],
                "ms_per_step": 1000 * statistics.median(trainee.step_times),
                "model_flops_per_s": statistics.median(trainee.flop_rates),
                "final_loss": trainee.losses[-1],
                "warmup_seconds": trainee.warmup_seconds,
                "capture_seconds": getattr(trainee, "capture_seconds", None),
                "profiler_events_per_step": trainee.events,
            }
        )
    best_ref = max(
        (
            r
            for r in results
            if r["model"].startswith("nn.Transformer")
            and "compiled" not in r["model"]
            and "captured" not in r["model"]
        ),
        key=lambda r: r["tokens_per_s"],
    )
    speedup = results[0]["tokens_per_s"] / best_ref["tokens_per_s"]
    used = "bf16" if dtype else args.precision

    print("\n" + train_table(results, peaks))
    print(
        f"\nmeasured matmul peak ({args.matmul_size}², {torch.get_num_threads()} threads): "
        f"fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s"
        + (f", bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s" if "bf16" in peaks else ", no native bf16")
        + f"; training uses {used}"
    )
    print(
        f"seq2seq / best nn.Transformer ({best_ref['model']}): {speedup:.2f}x "
        f"(goal >= {SPEEDUP_GOAL}x)" + ("" if speedup >= SPEEDUP_GOAL else " -- NOT MET")
    )
    compiled = [r for r in results if r["model"].startswith("seq2seq, compiled")]
    if compiled:
        best = max(compiled, key=lambda r: r["tokens_per_s"])
        gain = best["tokens_per_s"] / results[0]["tokens_per_s"]
        print(
            f"best compiled seq2seq ({best['model']}) / eager: {gain:.2f}x"
            + (" -- compile wins" if gain > 1.0 else " -- eager stays")
        )

    captured = [r for r in results if r["model"] == "seq2seq, the trainer's step, captured"]
    if captured:
        gain = captured[0]["tokens_per_s"] / best_ref["tokens_per_s"]
        print(
            f"seq2seq, the trainer's step, captured / best eager nn.Transformer: {gain:.2f}x "
            f"(goal >= {SPEEDUP_GOAL}x); / our eager step: "
            f"{captured[0]['tokens_per_s'] / results[0]['tokens_per_s']:.2f}x"
        )

    for line in muon_lines(results):
        print(line)

    if args.json:
        fields = {
            "batches": len(batches),
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "matmul_peak_flops_per_s": peaks,
            "results": results,
            "speedup_vs_best_reference": speedup,
            "speedup_goal": SPEEDUP_GOAL,
        }
        write_record(args.json, "train", args, config, source, n_ours, dtype, fields)


if __name__ == "__main__":
    main()
