"""MHA, GQA, MQA and MLA under one training budget: size, KV cache, speed, BLEU.

The same small model (``config.yaml``, whose step budget is fixed before the runs) is
trained once per attention variant (``variants.yaml``: g = 8 key/value heads with three
seeds, g = 2, g = 1, and the MLA-style latent cache), ``--jobs`` at a time with
``--train-threads`` torch threads each. Every model is scored on its last state (the
weights after exactly the budget's steps). Then, per variant:

- parameters;
- decoder self-attention KV cache per generated token and sentence: the formula
  (``2 * L * g * Dh * bytes``; MLA ``L * d_latent * bytes``) against the bytes the
  ``DecoderCache`` holds (``.size()["self_bytes"]``) after T steps, divided by T and B;
- decoding speed: greedy search with EOS banned, batch 64, 128 output tokens, median of
  interleaved rounds;
- greedy BLEU on the test split, and the verdict: does it differ from MHA by more than the
  MHA seeds' spread allows (``verdict``)?

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
import math
import statistics
import sys
import time
from pathlib import Path

import sacrebleu
import torch
import yaml
from matplotlib.figure import Figure

from seq2seq.config import DecodeConfig, load_config
from seq2seq.data.batching import collate
from seq2seq.decoding.load import load_run
from seq2seq.decoding.search import greedy_search
from seq2seq.decoding.translate import translate_ids
from seq2seq.model.masks import padding_mask
from seq2seq.model.transformer import Seq2Seq, count_parameters
from seq2seq.vocab import BOS_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common
from common import (  # noqa: E402
    QUICK_MODEL,
    add_output_args,
    add_training_args,
    budget,
    command,
    last_state,
    load_pairs,
    minutes_since,
    model_used,
    output_dir,
    save_figure,
    scoring_note,
    train_all,
    train_threads,
    write_outputs,
    write_readme,
)

HERE = Path(__file__).resolve().parent
CPU = torch.device("cpu")
MIN_SEEDS = 3  # MHA seeds below which the spread is not measured well enough for a verdict
# Student's t, two-sided 95%, by degrees of freedom (seeds - 1): the prediction interval's
# factor. Past the table's end 2.0 (the t quantile tends to 1.96).
T_95 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
RULE = (
    f"a variant differs from MHA only when its test BLEU lies outside the interval in which "
    f"a further MHA seed would land 95% of the time (the MHA mean ± t(n − 1) · sd · "
    f"√(1 + 1/n) for n ≥ {MIN_SEEDS} seeds); inside it, this run shows no difference"
)
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


def seed_band(base: list[float]) -> float:
    """Half-width of the 95% prediction interval of one more base seed around the base
    seeds' mean: t(n - 1) * sd * sqrt(1 + 1/n), for n seeds."""
    n = len(base)
    return T_95.get(n - 1, 2.0) * statistics.stdev(base) * math.sqrt(1 + 1 / n)


def verdict(base: list[float], value: float) -> str:
    """Whether one variant's score differs from the base's seeds: only when it lies outside
    the interval in which a further base seed would land 95% of the time."""
    if len(base) < MIN_SEEDS:
        return f"needs ≥ {MIN_SEEDS} MHA seeds; rerun pending"
    difference = value - statistics.mean(base)
    if abs(difference) <= seed_band(base):
        return "no difference beyond seed noise"
    return "different: " + ("higher" if difference > 0 else "lower")


def base_seeds(rows: list[dict]) -> list[dict]:
    """The first variant's rows: itself and its other seeds (``NAME-seedN``)."""
    name = rows[0]["variant"]
    return [x for x in rows if x["variant"] == name or x["variant"].startswith(f"{name}-seed")]


def verdict_lines(rows: list[dict]) -> str:
    """The MHA seeds' spread, the rule, and each other variant's verdict against them."""
    seeds = base_seeds(rows)
    bleu = [x["test_bleu"] for x in seeds]
    name, mean = rows[0]["variant"], statistics.mean(bleu)
    spread = (
        f"sd {statistics.stdev(bleu):.2f}; a further {name} seed would land within "
        f"±{seed_band(bleu):.2f} of the mean 95% of the time"
        if len(bleu) >= MIN_SEEDS
        else "too few seeds to measure their spread"
    )
    listed = ", ".join(f"{b:.2f}" for b in bleu)
    return "\n".join(
        [
            f"The {len(bleu)} {name} seed(s): {listed}; mean {mean:.2f}, {spread}. "
            f"The rule: {RULE}.",
            "",
            *(
                f"- {x['variant']}: {x['test_bleu']:.2f}, {x['test_bleu'] - mean:+.2f} against "
                f"the {name} mean: {verdict(bleu, x['test_bleu'])}"
                for x in rows
                if x not in seeds
            ),
        ]
    )


def check_budget(used: dict[str, dict], steps: int | None) -> None:
    """Every model trained exactly the budget fixed in the config and is scored on the
    state it ended on: a reused run trained to another budget is refused."""
    for name, x in used.items():
        if x["steps"] != steps or x["weights"] != f"step {steps}":
            raise SystemExit(
                f"{name}: trained {x['steps']} steps, scored {x['weights']}; the config's "
                f"budget is {steps} steps (retrain it without --reuse)"
            )


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
    base = rows[0]
    seeds = base_seeds(rows)
    ratios = ", ".join(
        f"{x['variant']} {x['self_measured'] / base['self_measured']:.3f}× the cache, "
        f"{x['tokens_per_s'] / base['tokens_per_s']:.2f}× the speed"
        for x in rows
        if x not in seeds
    )
    return {
        "table": table,
        "check": check,
        "verdicts": verdict_lines(rows),
        "scoring": scoring_note(r),
        "base": base["variant"],
        "ratios": ratios,
        **conclusion_values(rows),
    }


def conclusion_values(rows: list[dict]) -> dict[str, object]:
    """What ``conclusion.md`` quotes: each variant's row (``v``), its speed and its cache
    against the first variant's (``speed``, ``cache_cut``: how many times smaller), and the
    first variant's seeds (``seeds``: test BLEU mean, sd, prediction band, range; their
    speeds' range and spread in %)."""
    base = rows[0]
    bleu = [x["test_bleu"] for x in base_seeds(rows)]
    speeds = [x["tokens_per_s"] for x in base_seeds(rows)]
    several = len(bleu) >= 2
    seeds = {
        "mean": statistics.mean(bleu),
        "sd": statistics.stdev(bleu) if several else math.nan,
        "band": seed_band(bleu) if several else math.nan,
        "range": max(bleu) - min(bleu),
        "speed_min": min(speeds),
        "speed_max": max(speeds),
        "speed_spread": 100 * (max(speeds) / min(speeds) - 1),
    }
    return {
        "v": {x["variant"]: x for x in rows},
        "speed": {x["variant"]: x["tokens_per_s"] / base["tokens_per_s"] for x in rows},
        "cache_cut": {x["variant"]: base["self_measured"] / x["self_measured"] for x in rows},
        "seeds": seeds,
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

    scored = {name: last_state(runs / name) for name in variants}
    used = {name: model_used(runs / name, path) for name, path in scored.items()}
    check_budget(used, next(iter(configs.values())).train.max_steps)
    loaded = {name: load_run(path) for name, path in scored.items()}
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
                **used[name],
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
        "scoring": "last state",
        "command": command(),
        "runs": str(runs),
        "train_min": train_min,
        "wall_min": minutes_since(started),
    }
    write_outputs(HERE, args.out, results, readme_values, "a figure", indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
