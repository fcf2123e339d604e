"""Benchmark: seq2seq's MultiHeadAttention against torch.nn.MultiheadAttention.

One run, A/B interleaved: every round times each contender once on the same inputs, and
the table reports the median over rounds, so drift in the machine's load hits both alike.
Run it on an otherwise idle machine:

    python experiments/bench_attention.py [--rounds 15] [--threads 2] [--json out.json]

Goals: ours / torch <= 1.05 in every case (no weights); the weights path <= 1.5x
our fast path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from seq2seq.model.attention import MultiHeadAttention

SHAPES = [(64, 24, 256, 8), (8, 256, 256, 8)]  # (B, T = S, D, H)


def timed(fn, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def contenders(b: int, t: int, d: int, h: int, backward: bool):
    torch.manual_seed(0)
    ours = MultiHeadAttention(d, h)
    ref = nn.MultiheadAttention(d, h, batch_first=True)
    for m in (ours, ref):
        m.train(backward)
    x = torch.randn(b, t, d, requires_grad=backward)
    memory = torch.randn(b, t, d, requires_grad=backward)

    def run(call):
        def step():
            if backward:
                out = call()
                out.sum().backward()
            else:
                with torch.inference_mode():
                    call()

        return step

    return {
        "ours": run(lambda: ours(x, memory, memory)[0]),
        "torch": run(lambda: ref(x, memory, memory, need_weights=False)[0]),
        "ours+weights": run(lambda: ours(x, memory, memory, need_weights=True)[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows = []
    for b, t, d, h in SHAPES:
        for backward in (False, True):
            fns = contenders(b, t, d, h, backward)
            inner = max(1, int(0.05 / max(timed(fns["ours"], 1), 1e-6)))
            for fn in fns.values():  # warm up
                timed(fn, inner)
            samples = {name: [] for name in fns}
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    samples[name].append(timed(fn, inner))
            med = {name: statistics.median(v) for name, v in samples.items()}
            rows.append(
                {
                    "shape": f"B={b} T=S={t} D={d} H={h}",
                    "pass": "fwd+bwd" if backward else "fwd",
                    "ours_ms": med["ours"] * 1e3,
                    "torch_ms": med["torch"] * 1e3,
                    "ratio": med["ours"] / med["torch"],
                    "weights_ms": med["ours+weights"] * 1e3,
                    "weights_ratio": med["ours+weights"] / med["ours"],
                }
            )

    print(
        f"torch {torch.__version__}, {args.threads} threads, {args.rounds} interleaved rounds, median\n"
    )
    print(
        "| shape | pass | ours ms | torch ms | ours/torch (goal <= 1.05) | weights ms | weights/fast (goal <= 1.5) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['shape']} | {r['pass']} | {r['ours_ms']:.3f} | {r['torch_ms']:.3f} | "
            f"{r['ratio']:.3f} {'ok' if r['ratio'] <= 1.05 else 'MISS'} | {r['weights_ms']:.3f} | "
            f"{r['weights_ratio']:.2f} {'ok' if r['weights_ratio'] <= 1.5 else 'MISS'} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
