"""MHA, GQA, MQA and MLA under one training budget: size, KV cache, speed, BLEU.

The same small model (``config.yaml``) is trained once per attention variant
(``variants.yaml``: g = 8 key/value heads with two seeds, g = 2, g = 1, and the MLA-style
latent cache), ``--jobs`` at a time with ``--train-threads`` torch threads each. Then, per
variant:

- parameters;
- decoder self-attention KV cache per generated token and sentence: the formula
  (``2 * L * g * Dh * bytes``; MLA ``L * d_latent * bytes``) against the bytes the
  ``DecoderCache`` holds (``.size()["self_bytes"]``) after T steps, divided by T and B;
- decoding speed: greedy search with EOS banned, batch 64, 128 output tokens, median of
  interleaved rounds;
- greedy BLEU on the test split.

    python experiments/kv_heads/run.py [--reuse] [--train-threads N] [--quick --out DIR]
    python experiments/kv_heads/run.py --readme-only

A full run trains into ``runs/experiments/kv_heads/VARIANT`` (replacing earlier runs there
unless ``--reuse``) and writes ``results.json``, ``README.md`` (from ``README.template.md``)
and a figure into this folder. ``--quick`` trains tiny models on ``data/sample`` for a few
seconds and writes into ``--out``: a smoke test of the code, not of the claims.
``--readme-only`` rewrites ``README.md`` from ``results.json`` and ``conclusion.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import sacrebleu
import torch
import yaml
from matplotlib.figure import Figure

from seq2seq import checkpoint
from seq2seq.batching import collate
from seq2seq.config import DecodeConfig, load_config
from seq2seq.model import Seq2Seq, count_parameters, padding_mask
from seq2seq.search import greedy_search
from seq2seq.translate import translate_ids
from seq2seq.vocab import BOS_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common
from common import (  # noqa: E402
    QUICK_MODEL,
    add_output_args,
    add_training_args,
    budget,
    command,
    load_pairs,
    minutes_since,
    output_dir,
    save_figure,
    train_all,
    train_threads,
    training_summary,
    write_outputs,
    write_readme,
)

HERE = Path(__file__).resolve().parent
CPU = torch.device("cpu")
QUICK = [
    *QUICK_MODEL,
    "train.max_steps=10",
    "train.max_time=null",
    "train.warmup_steps=5",
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(HERE / "config.yaml"), help="shared recipe (YAML)")
    p.add_argument("--variants", default=str(HERE / "variants.yaml"), help="variants (YAML)")
    add_training_args(p, "runs/experiments/kv_heads")
    p.add_argument("--batch", type=int, default=64, help="sentences per speed test batch")
    p.add_argument("--steps", type=int, default=128, help="output tokens in the speed test")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per variant")
    p.add_argument("--threads", type=int, default=2, help="torch threads for evaluation and timing")
    add_output_args(p, "tiny models and data; seconds")
    args = p.parse_args()
    if args.quick:
        args.threads, args.train_threads, args.batch, args.steps, args.rounds = 1, 1, 4, 16, 1
    args.train_threads = train_threads(args)
    args.out = output_dir(p, args.out, args.quick, HERE)
    if args.quick:
        args.runs = str(args.out / "runs")
    return args


def cache_bytes(model: Seq2Seq, src: torch.Tensor, steps: int) -> dict:
    """Bytes the decoder cache holds after ``steps`` tokens, per token and sentence (self-
    attention) and per source position and sentence (cross-attention), with the formulas."""
    c = model.config
    g = c.n_kv_heads or c.n_heads
    d_head = c.d_model // c.n_heads
    cache = model.new_cache()
    with torch.inference_mode():
        mask = padding_mask(src)
        memory = model.encode(src, mask)
        token = torch.full((src.shape[0], 1), BOS_ID)
        for _ in range(steps):
            logits, _ = model.decode(token, memory, mask, cache)
            token = logits[:, -1:].argmax(-1)
    size = cache.size()
    b, s = src.shape
    element = next(model.parameters()).element_size()
    per_token = c.d_latent if c.d_latent else 2 * g * d_head
    return {
        "self_formula": c.n_dec_layers * per_token * element,
        "self_measured": size["self_bytes"] / (steps * b),
        "cross_formula": c.n_dec_layers * 2 * g * d_head * element,
        "cross_measured": size["cross_bytes"] / (s * b),
    }


def decode_speed(models: dict[str, Seq2Seq], src: torch.Tensor, steps: int, rounds: int) -> dict:
    """Output tokens per second of greedy search with EOS banned, median of rounds that
    take the variants in turn, so drift in the machine's load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():  # warm-up
        greedy_search(model, src[:2], DecodeConfig(max_len_a=0.0, max_len_b=2, ban_eos=True))
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            hyps = greedy_search(
                model, src, DecodeConfig(max_len_a=0.0, max_len_b=steps, ban_eos=True)
            )
            times[name].append(time.perf_counter() - start)
            assert all(len(h.tokens) == steps for h in hyps)
    return {name: src.shape[0] * steps / statistics.median(t) for name, t in times.items()}


def plot(rows: list[dict], path: Path) -> None:
    fig = Figure(figsize=(10, 3.2))
    axes = fig.subplots(1, 3)
    names = [r["variant"] for r in rows]
    for ax, key, label in (
        (axes[0], "self_measured", "self-attn KV cache, bytes/token/sentence"),
        (axes[1], "tokens_per_s", "decode tokens/s (EOS banned)"),
        (axes[2], "test_bleu", "test BLEU (greedy)"),
    ):
        ax.bar(names, [r[key] for r in rows], color="tab:blue")
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    save_figure(fig, path)


def readme_values(r: dict) -> dict[str, str]:
    """The table and verdicts of ``README.template.md``, computed from the results ``r``."""
    rows = r["rows"]
    table = "\n".join(
        f"| {x['variant']} | {x['g']} | {x['d_latent'] or '-'} | {x['parameters']:,} "
        f"| {x['self_formula']:,} | {x['self_measured']:,.0f} | {x['cross_formula']:,} "
        f"| {x['cross_measured']:,.0f} | {x['tokens_per_s']:,.0f} | {x['test_bleu']:.2f} "
        f"| {x['steps']} | {x['weights']} | {x['valid_bleu']:.2f} |"
        for x in rows
    )
    match = all(x["self_formula"] == x["self_measured"] for x in rows)
    check = (
        "The measured self-attention cache equals the formula for every variant."
        if match
        else "**The measured self-attention cache differs from the formula for at least "
        "one variant: look into it.**"
    )
    seeds = [x for x in rows if x["variant"].startswith(rows[0]["variant"])]
    if len(seeds) > 1:
        gap = max(x["test_bleu"] for x in seeds) - min(x["test_bleu"] for x in seeds)
        seed_gap = (
            f"The {len(seeds)} {rows[0]['variant']} seeds land {gap:.2f} test BLEU apart: "
            + (
                "within a point, so the budget is long enough for differences above that to mean something."
                if gap <= 1.0
                else "**more than a point: seed noise is larger than the differences this run can show; "
                "train longer.**"
            )
        )
    else:
        seed_gap = "One seed per variant: no measure of seed noise in this run."
    base = rows[0]
    ratios = ", ".join(
        f"{x['variant']} {x['self_measured'] / base['self_measured']:.3f}× the cache, "
        f"{x['tokens_per_s'] / base['tokens_per_s']:.2f}× the speed, "
        f"{x['test_bleu'] - base['test_bleu']:+.2f} BLEU"
        for x in rows[1:]
    )
    return {
        "table": table,
        "check": check,
        "seed_gap": seed_gap,
        "base": base["variant"],
        "ratios": ratios,
    }


def main() -> int:
    args = parse_args()
    if args.readme_only:
        write_readme(HERE, args.out, readme_values)
        return 0
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = Path(args.runs)
    variants = yaml.safe_load(Path(args.variants).read_text(encoding="utf-8"))
    base_sets = [*(QUICK if args.quick else []), f"train.threads={args.train_threads}"]
    configs = {
        name: load_config(args.config, [*base_sets, *sets]) for name, sets in variants.items()
    }
    train_all(configs, runs, args.reuse, args.jobs)
    train_min = minutes_since(started)
    torch.set_num_threads(args.threads)

    loaded = {name: checkpoint.load_run(runs / name) for name in variants}
    d = next(iter(configs.values())).data
    pairs = load_pairs(d)
    refs = [t for _, t in pairs]
    models, rows, speed_src = {}, [], {}
    cache_batch, cache_steps = min(8, args.batch), min(32, args.steps)
    for name, (config, tok, model) in loaded.items():
        limit = config.model.max_positions - 1
        src_ids = [x[:limit] for x in tok.encode_batch([s for s, _ in pairs], "src")]
        hyps = translate_ids(model, src_ids, config.decode, device=CPU)
        bleu = sacrebleu.corpus_bleu([tok.decode(h.tokens, "tgt") for h in hyps], [refs]).score
        speed_src[name] = collate(src_ids[: args.batch], None).src
        models[name] = model
        c = config.model
        rows.append(
            {
                "variant": name,
                "g": c.n_kv_heads or c.n_heads,
                "d_latent": c.d_latent,
                "parameters": count_parameters(model),
                "test_bleu": bleu,
                **cache_bytes(model, speed_src[name][:cache_batch], cache_steps),
                **training_summary(runs / name),
            }
        )
    # One source batch for every variant: EOS banned, the output length is fixed and the
    # source's content barely matters to the time (its length does: the same for all).
    src = next(iter(speed_src.values()))
    for row, speed in zip(
        rows, decode_speed(models, src, args.steps, args.rounds).values(), strict=True
    ):
        row["tokens_per_s"] = speed
    plot(rows, args.out / "kv_heads.png")
    t = next(iter(configs.values())).train
    results = {
        "rows": rows,
        "sentences": len(pairs),
        "batch": args.batch,
        "steps": args.steps,
        "rounds": args.rounds,
        "threads": args.threads,
        "jobs": args.jobs,
        "train_threads": args.train_threads,
        "cache_batch": cache_batch,
        "cache_steps": cache_steps,
        "budget": budget(t),
        "command": command(),
        "runs": str(runs),
        "train_min": train_min,
        "wall_min": minutes_since(started),
    }
    write_outputs(HERE, args.out, results, readme_values, "a figure", indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
