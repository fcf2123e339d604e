"""Decoding with and without the KV cache, against output length.

A random-init model of the default size (``ModelConfig()``: d_model 256, 8 heads, 3 + 3
layers, 8000 subwords) decodes a batch of random source sentences greedily with EOS
banned, so every output has exactly the requested length, once with the cache
(``use_cache=True``: one new position per step) and once without (the whole prefix
recomputed at every step). The weights do not matter to the time, only the shapes, so no
training is needed. Two measurements:

- total time of ``greedy_search`` for output lengths 16 ... 256, median of interleaved
  rounds, and that both give the same tokens;
- the time of every single decoder step of one decoding at the longest length: constant-
  ish with the cache, growing with the prefix without.

    python experiments/kv_cache/run.py [--threads 2] [--quick --out DIR]
    python experiments/kv_cache/run.py --readme-only

A full run writes ``results.json``, ``README.md`` (from ``README.template.md``) and a figure
into this folder; ``--readme-only`` rewrites ``README.md`` from ``results.json`` and
``conclusion.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

from seq2seq.config import DecodeConfig, ModelConfig
from seq2seq.decoding.search import greedy_search
from seq2seq.model.masks import padding_mask
from seq2seq.model.transformer import Seq2Seq, build_model
from seq2seq.vocab import BOS_ID, EOS_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common
from common import (  # noqa: E402
    add_output_args,
    command,
    minutes_since,
    output_dir,
    save_figure,
    write_outputs,
    write_readme,
)

HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[16, 32, 64, 128, 256],
        help="output lengths (default: %(default)s)",
    )
    p.add_argument("--batch", type=int, default=16, help="sentences (default: %(default)s)")
    p.add_argument("--src-len", type=int, default=24, help="source length (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    add_output_args(p, "tiny model and lengths; seconds")
    args = p.parse_args()
    if args.quick:
        args.threads, args.lengths, args.batch, args.src_len, args.rounds = 1, [4, 8, 16], 4, 6, 1
    args.out = output_dir(p, args.out, args.quick, HERE)
    return args


def model_config(quick: bool) -> ModelConfig:
    if quick:
        return ModelConfig(
            src_vocab_size=100,
            tgt_vocab_size=100,
            d_model=32,
            n_heads=4,
            d_ff=64,
            n_enc_layers=2,
            n_dec_layers=2,
            max_positions=64,
        )
    return ModelConfig()


def total_times(model: Seq2Seq, src: torch.Tensor, lengths: list[int], rounds: int) -> list[dict]:
    """Median wall time of greedy search per length and mode; rounds take every
    (length, mode) in turn so that drift in the machine's load hits all alike."""
    times = {(n, c): [] for n in lengths for c in (True, False)}
    outputs = {}
    greedy_search(model, src, DecodeConfig(max_len_a=0.0, max_len_b=2, ban_eos=True))  # warm-up
    for _ in range(rounds):
        for n, cached in times:
            start = time.perf_counter()
            hyps = greedy_search(
                model, src, DecodeConfig(max_len_a=0.0, max_len_b=n, use_cache=cached, ban_eos=True)
            )
            times[(n, cached)].append(time.perf_counter() - start)
            outputs[(n, cached)] = [h.tokens for h in hyps]
    rows = []
    for n in lengths:
        cached, uncached = statistics.median(times[(n, True)]), statistics.median(times[(n, False)])
        assert all(len(t) == n for t in outputs[(n, True)])
        rows.append(
            {
                "length": n,
                "cached_s": cached,
                "uncached_s": uncached,
                "same_tokens": outputs[(n, True)] == outputs[(n, False)],
            }
        )
    return rows


def step_times(model: Seq2Seq, src: torch.Tensor, length: int, cached: bool) -> list[float]:
    """Seconds of each decoder step (decode + next token) of one greedy decoding with EOS
    banned: the loop of ``greedy_search``, timed per step."""
    out = []
    with torch.inference_mode():
        mask = padding_mask(src)
        memory = model.encode(src, mask)
        cache = model.new_cache() if cached else None
        prefix = torch.full((src.shape[0], 1), BOS_ID)  # (B, 1 + n)
        for _ in range(length):
            start = time.perf_counter()
            tgt = prefix[:, -1:] if cached else prefix
            logits, _ = model.decode(tgt, memory, mask, cache)
            last = logits[:, -1].float()
            last[:, EOS_ID] = float("-inf")
            prefix = torch.cat([prefix, last.argmax(-1, keepdim=True)], 1)
            out.append(time.perf_counter() - start)
    return out


def growth(times: list[float]) -> float:
    """Mean step time over the last tenth of the steps over that of the first tenth."""
    k = max(1, len(times) // 10)
    return statistics.mean(times[-k:]) / statistics.mean(times[:k])


def plot(rows: list[dict], steps: dict[str, list[float]], path: Path) -> None:
    fig = Figure(figsize=(10, 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    lengths = [r["length"] for r in rows]
    ax1.plot(lengths, [r["cached_s"] for r in rows], "o-", label="with cache")
    ax1.plot(lengths, [r["uncached_s"] for r in rows], "s-", label="without cache")
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="output tokens (EOS banned)",
        ylabel="seconds",
        title="greedy decoding time",
    )
    ax1.set_xticks(lengths)
    ax1.set_xticklabels([str(n) for n in lengths])
    ax1.legend(fontsize=8)
    for name, times in steps.items():
        ax2.plot(range(1, len(times) + 1), [1000 * t for t in times], lw=0.8, label=name)
    ax2.set(xlabel="step (prefix length)", ylabel="ms per step", title="cost of each step")
    ax2.legend(fontsize=8)
    save_figure(fig, path)


def readme_values(r: dict) -> dict[str, object]:
    """The table, ratios and verdict of ``README.template.md``, computed from the results ``r``."""
    rows = r["rows"]
    table = "\n".join(
        f"| {x['length']} | {x['cached_s']:.3f} | {x['uncached_s']:.3f} "
        f"| {x['uncached_s'] / x['cached_s']:.1f}× | {1000 * x['cached_s'] / x['length']:.2f} "
        f"| {1000 * x['uncached_s'] / x['length']:.2f} | {'yes' if x['same_tokens'] else '**no**'} |"
        for x in rows
    )
    first, last = rows[0], rows[-1]
    same = (
        "Cached and uncached decoding gave the same tokens at every length."
        if all(x["same_tokens"] for x in rows)
        else "**Cached and uncached decoding gave different tokens at some length: check the cache.**"
    )
    cached_ms = [1000 * x["cached_s"] / x["length"] for x in rows]
    return {
        "table": table,
        "first": first["length"],
        "last": last["length"],
        "scale": last["length"] / first["length"],
        "cached_growth": last["cached_s"] / first["cached_s"],
        "uncached_growth": last["uncached_s"] / first["uncached_s"],
        "same": same,
        # for the conclusion: ms per token, and the cache's speed-up, by output length
        "cached_ms": (min(cached_ms), max(cached_ms)),
        "uncached_ms": {x["length"]: 1000 * x["uncached_s"] / x["length"] for x in rows},
        "speedup": {x["length"]: x["uncached_s"] / x["cached_s"] for x in rows},
    }


def main() -> int:
    args = parse_args()
    if args.readme_only:
        write_readme(HERE, args.out, readme_values)
        return 0
    torch.set_num_threads(args.threads)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    config = model_config(args.quick)
    if max(args.lengths) >= config.max_positions:
        raise SystemExit(f"lengths must stay below max_positions={config.max_positions}")
    torch.manual_seed(0)
    model = build_model(config).eval()
    src = torch.randint(4, config.src_vocab_size, (args.batch, args.src_len))
    src[:, -1] = EOS_ID
    rows = total_times(model, src, args.lengths, args.rounds)
    longest = max(args.lengths)
    steps = {
        name: step_times(model, src, longest, cached)
        for name, cached in (("with cache", True), ("without cache", False))
    }
    plot(rows, steps, args.out / "kv_cache.png")
    c = config
    results = {
        "model": f"d_model {c.d_model}, {c.n_heads} heads, {c.n_enc_layers} + {c.n_dec_layers} "
        f"layers, d_ff {c.d_ff}, vocabulary {c.tgt_vocab_size}",
        "rows": rows,
        "step_times": steps,
        "growth": {k: growth(v) for k, v in steps.items()},
        "batch": args.batch,
        "src_len": args.src_len,
        "rounds": args.rounds,
        "threads": args.threads,
        "command": command(),
        "wall_min": minutes_since(started),
    }
    write_outputs(HERE, args.out, results, readme_values, "a figure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
