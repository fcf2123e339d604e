"""Attention is not explanation: what cross-attention maps do and do not tell.

Two models trained from ``config.yaml`` with different seeds (the same recipe and step
budget, trained at once, ``--train-threads`` torch threads each), each scored on its last
state, are compared on the test split:

1. test BLEU (greedy) of each seed;
2. their cross-attention maps for the same sentences, teacher-forced on the reference so
   the shapes match: Jensen-Shannon divergence between matched layer maps (mean over
   heads) and the agreement of the rows' argmax source positions;
3. counterfactual weights: at inference, one layer's (or every layer's) cross-attention
   weights replaced by uniform or row-permuted ones: how often the greedy output changes
   and how much BLEU drops;
4. attention against sensitivity: for each output token (teacher-forced on the model's
   own greedy output), the source position with the highest attention weight against
   the one whose masking (key padding mask False in every cross-attention layer) changes
   the token's probability most.

    python experiments/attention_not_explanation/run.py [--seeds 1 2] [--reuse] [--quick --out DIR]
    python experiments/attention_not_explanation/run.py --models RUN RUN
    python experiments/attention_not_explanation/run.py --readme-only

A full run trains into ``runs/experiments/attention_not_explanation/seed*`` (replacing
earlier runs there unless ``--reuse``) and writes ``results.json``, the figures and
``README.md`` (from ``README.template.md``) into this folder. ``--quick`` trains tiny models
on ``data/sample`` for a few seconds and writes into ``--out``: a smoke test of the code,
not of the claims. ``--models`` analyses finished runs of one recipe with different seeds
instead of training (the kv_heads experiment trains three MHA seeds of one recipe).
``--readme-only`` rewrites ``README.md`` from ``results.json`` and
``conclusion.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import sacrebleu
import torch
from matplotlib.figure import Figure
from torch import Tensor

from seq2seq.config import DecodeConfig, load_config
from seq2seq.data.batching import batches_of, collate
from seq2seq.decoding.load import load_run
from seq2seq.decoding.search import Hypothesis, force_decode
from seq2seq.decoding.translate import translate_ids
from seq2seq.drawing.plotting import plot_attention
from seq2seq.inspect.influence import occlude
from seq2seq.inspect.interventions import replaced
from seq2seq.model.transformer import Seq2Seq
from seq2seq.run import checkpoint
from seq2seq.vocab import EOS_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common
from common import (  # noqa: E402
    DPI,
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
MAX_TOKENS = 4096  # source tokens per decoding batch
QUICK = [
    *QUICK_MODEL,
    "train.max_steps=20",
    "train.max_time=null",
    "train.warmup_steps=10",
]
MODES = ("uniform", "permuted")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(HERE / "config.yaml"), help="training recipe (YAML)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="one model per seed")
    p.add_argument(
        "--models",
        nargs="+",
        metavar="RUN",
        help="analyse these finished runs (one recipe, different train.seed) instead of training",
    )
    add_training_args(p, "runs/experiments/attention_not_explanation")
    p.add_argument("--max-sentences", type=int, default=None, help="test sentences (default: all)")
    p.add_argument("--example", type=int, default=0, help="test sentence drawn as maps")
    p.add_argument("--threads", type=int, default=2, help="torch threads for the analysis")
    add_output_args(p, "tiny models and data; seconds")
    args = p.parse_args()
    if len(set(args.seeds)) < 2 and not args.models:
        p.error("--seeds needs at least two different seeds")
    if args.models is not None and len(args.models) < 2:
        p.error("--models needs at least two runs")
    if args.quick:
        args.threads, args.train_threads = 1, 1
    args.train_threads = train_threads(args)
    args.out = output_dir(p, args.out, args.quick, HERE)
    if args.quick:
        args.runs = str(args.out / "runs")
    return args


# --- measurements ----------------------------------------------------------------------


def greedy(model: Seq2Seq, src_ids: list[list[int]]) -> list[Hypothesis]:
    return translate_ids(model, src_ids, DecodeConfig(max_tokens=MAX_TOKENS), device=CPU)


def bleu(tok, hyps: list[Hypothesis], refs: list[str]) -> float:
    return sacrebleu.corpus_bleu([tok.decode(h.tokens, "tgt") for h in hyps], [refs]).score


def head_mean_maps(
    model: Seq2Seq, src_ids: list[list[int]], tgt_ids: list[list[int]]
) -> list[Tensor]:
    """Teacher-forced cross-attention, mean over heads, per sentence: (L, T + 1, S_i)."""
    maps: list = [None] * len(src_ids)
    for idx in batches_of(src_ids, tgt_ids, MAX_TOKENS):
        src = collate([src_ids[i] for i in idx], None).src
        for i, hyp in zip(idx, force_decode(model, src, [tgt_ids[i] for i in idx]), strict=True):
            maps[i] = hyp.attention.mean(1)
    return maps


def jsd(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence in bits between rows: (..., S) -> (...), in [0, 1]."""
    m = (p + q) / 2

    def kl(x: Tensor, y: Tensor) -> Tensor:
        return (x * (x.clamp_min(1e-12).log2() - y.clamp_min(1e-12).log2())).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def compare_maps(maps_a: list[Tensor], maps_b: list[Tensor]) -> list[dict]:
    """Per layer (and for the mean over layers): mean row JSD between the two models, each
    model's mean row JSD to uniform, row argmax agreement, and the chance agreement 1/S."""
    n_layers = maps_a[0].shape[0]
    sums = torch.zeros(n_layers + 1, 5, dtype=torch.float64)  # jsd, jsd_a_u, jsd_b_u, agree, chance
    rows = 0
    for a, b in zip(maps_a, maps_b, strict=True):
        a = torch.cat([a, a.mean(0, keepdim=True)])  # (L + 1, T, S)
        b = torch.cat([b, b.mean(0, keepdim=True)])
        uniform = torch.full_like(a, 1.0 / a.shape[-1])
        sums[:, 0] += jsd(a, b).sum(-1)
        sums[:, 1] += jsd(a, uniform).sum(-1)
        sums[:, 2] += jsd(b, uniform).sum(-1)
        sums[:, 3] += (a.argmax(-1) == b.argmax(-1)).sum(-1)
        sums[:, 4] += a.shape[1] / a.shape[-1]
        rows += a.shape[1]
    means = (sums / rows).tolist()
    names = [str(i + 1) for i in range(n_layers)] + ["mean"]
    keys = ("jsd", "jsd_a_uniform", "jsd_b_uniform", "argmax_agree", "chance")
    return [
        {"layer": n, **dict(zip(keys, m, strict=True))} for n, m in zip(names, means, strict=True)
    ]


def counterfactuals(model: Seq2Seq, tok, src_ids, refs, base: list[Hypothesis]) -> list[dict]:
    """Greedy outputs with cross-attention weights replaced, one layer at a time and all."""
    n_layers = len(model.decoder_layers)
    base_bleu = bleu(tok, base, refs)
    settings = [([i], str(i + 1), mode) for mode in MODES for i in range(n_layers)]
    settings += [(list(range(n_layers)), "all", mode) for mode in (*MODES, "kept")]
    rows = []
    for layers, name, mode in settings:
        with replaced(model, layers, mode):
            hyps = greedy(model, src_ids)
        score = bleu(tok, hyps, refs)
        changed = sum(h.tokens != b.tokens for h, b in zip(hyps, base, strict=True))
        rows.append(
            {
                "layers": name,
                "mode": mode,
                "changed": changed / len(base),
                "bleu": score,
                "bleu_drop": base_bleu - score,
            }
        )
    return rows


def attention_vs_sensitivity(model: Seq2Seq, src_ids, out_ids) -> list[dict]:
    """For every output token (teacher-forced on the model's own output, EOS step included):
    does the source position with the highest attention (per layer, mean over heads; and
    the mean over layers) equal the one whose masking changes the token's probability
    most? Also with the source EOS left out of both argmaxes."""
    n_layers = len(model.decoder_layers)
    agree = torch.zeros(2, n_layers + 1, dtype=torch.float64)  # [all positions, no EOS]
    chance = torch.zeros(2, dtype=torch.float64)
    tokens = 0
    for src_list, out in zip(src_ids, out_ids, strict=True):
        src = collate([src_list], None).src  # (1, S)
        s, t = src.shape[1], len(out) + 1
        occlusion = occlude(model, src, [*out, EOS_ID], need_weights=True)
        att = torch.stack([w.mean(0) for w in occlusion.attention])  # (L, T, S)
        att = torch.cat([att, att.mean(0, keepdim=True)])  # (L + 1, T, S)
        effect = (occlusion.masked_probs - occlusion.probs).abs()  # (S, T)
        agree[0] += (att.argmax(-1) == effect.argmax(0)).sum(-1)
        agree[1] += (att[..., :-1].argmax(-1) == effect[:-1].argmax(0)).sum(-1)
        chance += torch.tensor([t / s, t / (s - 1)], dtype=torch.float64)
        tokens += t
    names = [str(i + 1) for i in range(n_layers)] + ["mean"]
    agree, chance = (agree / tokens).tolist(), (chance / tokens).tolist()
    return [
        {
            "layer": n,
            "agree": agree[0][i],
            "agree_no_eos": agree[1][i],
            "chance": chance[0],
            "chance_no_eos": chance[1],
        }
        for i, n in enumerate(names)
    ]


# --- figures and report ----------------------------------------------------------------


def plot_counterfactuals(rows_by_seed: dict[str, list[dict]], path: Path) -> None:
    fig = Figure(figsize=(9, 3.4))
    axes = fig.subplots(1, 2)
    for ax, key, label in (
        (axes[0], "changed", "% of greedy outputs changed"),
        (axes[1], "bleu_drop", "BLEU drop"),
    ):
        for k, (seed, rows) in enumerate(rows_by_seed.items()):
            shown = [r for r in rows if r["mode"] != "kept"]
            xs = [i + 0.4 * k for i in range(len(shown))]
            ys = [100 * r[key] if key == "changed" else r[key] for r in shown]
            ax.bar(xs, ys, width=0.4, label=f"seed {seed}")
        ax.set_xticks([i + 0.2 for i in range(len(shown))])
        ax.set_xticklabels(
            [f"{r['mode'][:4]} L{r['layers']}" for r in shown], rotation=60, fontsize=7
        )
        ax.set(ylabel=label)
        ax.legend(fontsize=7)
    fig.suptitle("cross-attention weights replaced at inference, per decoder layer", fontsize=9)
    save_figure(fig, path)


def fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def percent_range(values: list[float]) -> str:
    """'55.3–65.5%' (one value: '55.3%'), as the tables print shares."""
    low, high = f"{100 * min(values):.1f}", f"{100 * max(values):.1f}"
    return f"{low}%" if low == high else f"{low}–{high}%"


def percent_list(values: list[float]) -> str:
    """One share per seed, as printed: '7.2% and 7.3%', or '6.7% for every seed'."""
    shown = list(dict.fromkeys(f"{100 * v:.1f}%" for v in values))
    return f"{shown[0]} for every seed" if len(shown) == 1 < len(values) else " and ".join(shown)


def sensitivity_summary(sensitivity: dict[str, list[dict]]) -> str:
    """Section 3's table in a sentence, over every seed: the per-layer agreement with and
    without the source EOS, the mean over layers, and chance."""
    rows = [x for seed in sensitivity.values() for x in seed]
    layers = [x for x in rows if x["layer"] != "mean"]
    means = [x for x in rows if x["layer"] == "mean"]
    chance = [x["chance"] for x in means]
    times = statistics.mean(x["agree"] / x["chance"] for x in means)
    per_layer = percent_range([x["agree"] for x in layers])
    return (
        "Per layer, the most-attended source position coincides with the one whose masking "
        f"changes the token's probability most for {per_layer} of output tokens "
        f"({percent_range([x['agree_no_eos'] for x in layers])} without the source EOS), "
        f"{percent_range([x['agree'] for x in means])} for the mean over layers, about "
        f"{times:.0f} times the chance level ({percent_list(chance)}; "
        f"{percent_list([x['chance_no_eos'] for x in means])} without EOS)."
    )


def readme_values(r: dict) -> dict[str, object]:
    """The tables and verdicts of ``README.template.md``, computed from the results ``r``
    (read back from JSON, so the per-seed results are keyed by the seed as a string)."""
    seeds = [str(s) for s in r["seeds"]]
    a, b = seeds[0], seeds[1]
    train_rows = "\n".join(
        f"| {s} | {r['training'][s]['steps']} | {r['training'][s]['minutes']:.1f} "
        f"| {r['training'][s]['weights']} "
        f"| {r['training'][s]['valid_bleu']:.2f} | {r['test_bleu'][s]:.2f} |"
        for s in seeds
    )
    gap = abs(r["test_bleu"][a] - r["test_bleu"][b])
    within = f"The test BLEU of seeds {a} and {b} differs by {gap:.2f}: " + (
        "within a point."
        if gap <= 1.0
        else "**more than a point, so the premise 'equally good models' does not hold in this run**; "
        "read the map comparison with that in mind."
    )
    map_rows = "\n".join(
        f"| {x['layer']} | {fmt(x['jsd'])} | {fmt(x['jsd_a_uniform'])} | {fmt(x['jsd_b_uniform'])} "
        f"| {100 * x['argmax_agree']:.1f}% | {100 * x['chance']:.1f}% |"
        for x in r["maps"]
    )
    cf_rows = "\n".join(
        f"| {s} | {x['layers']} | {x['mode']} | {100 * x['changed']:.1f}% | {x['bleu']:.2f} "
        f"| {x['bleu_drop']:+.2f} |"
        for s in seeds
        for x in r["counterfactual"][s]
    )
    # Chance depends on the lengths of each seed's own greedy outputs: one column per seed.
    sens_rows = "\n".join(
        f"| {x['layer']} | "
        + " | ".join(
            f"{100 * y['agree']:.1f}% / {100 * y['agree_no_eos']:.1f}% "
            f"| {100 * y['chance']:.1f}% / {100 * y['chance_no_eos']:.1f}%"
            for y in (r["sensitivity"][s][i] for s in seeds)
        )
        + " |"
        for i, x in enumerate(r["sensitivity"][a])
    )
    kept = [x for s in seeds for x in r["counterfactual"][s] if x["mode"] == "kept"]
    control = (
        "The control (wrapper in place, weights kept) changed "
        + ", ".join(f"{100 * x['changed']:.1f}%" for x in kept)
        + " of the outputs: "
        + (
            "the hook itself is neutral."
            if all(x["changed"] < 0.01 for x in kept)
            else "**more than 1%, so the hook itself moves outputs: check it.**"
        )
    )
    training = (
        f"training {r['train_min']:.1f} min, {r['jobs']} models at a time with "
        f"{r['train_threads']} torch thread(s) each"
        if r.get("trained_here", True)
        else "no training: --models names runs trained before, whose config.yaml and "
        "train.log say how"
    )
    seed_cols = " | ".join(f"seed {s} | chance, seed {s}" for s in seeds)
    return {
        "a": a,
        "b": b,
        "scoring": scoring_note(r),
        "sensitivity_summary": sensitivity_summary(r["sensitivity"]),
        "train_rows": train_rows,
        "within": within,
        "map_rows": map_rows,
        "cf_rows": cf_rows,
        "control": control,
        "seed_cols": seed_cols,
        "seed_separators": "---|---|" * len(seeds),
        "sens_rows": sens_rows,
        "training": training,
    }


def seeded_runs(dirs: list[Path]) -> dict[int, Path]:
    """Finished runs by their ``train.seed``; they must share every other setting that
    shapes the model, or the comparison is not between seeds."""
    configs = {d: checkpoint.load_config_file(d) for d in dirs}
    seeds = {c.train.seed: d for d, c in configs.items()}
    if len(seeds) < len(dirs):
        raise SystemExit("--models: two runs have the same train.seed")
    first = configs[dirs[0]]
    for d, c in configs.items():
        if (c.model, c.data) != (first.model, first.data):
            raise SystemExit(f"--models: {d} has another model or data config than {dirs[0]}")
    return seeds


def main() -> int:
    args = parse_args()
    if args.readme_only:
        write_readme(HERE, args.out, readme_values)
        return 0
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.models:
        run_dirs, train_min = seeded_runs([Path(m) for m in args.models]), 0.0
        args.seeds = list(run_dirs)
    else:
        base_sets = [*(QUICK if args.quick else []), f"train.threads={args.train_threads}"]
        configs = {
            f"seed{seed}": load_config(args.config, [*base_sets, f"train.seed={seed}"])
            for seed in args.seeds
        }
        train_all(configs, Path(args.runs), args.reuse, args.jobs)
        run_dirs = {s: Path(args.runs) / f"seed{s}" for s in args.seeds}
        train_min = minutes_since(started)
    torch.set_num_threads(args.threads)

    scored = {s: last_state(run_dirs[s]) for s in args.seeds}
    training = {s: model_used(run_dirs[s], scored[s]) for s in args.seeds}
    if len({t["steps"] for t in training.values()}) > 1:
        raise SystemExit("the models trained different numbers of steps: not one budget")
    loaded = {s: load_run(path) for s, path in scored.items()}
    base = loaded[args.seeds[0]][0]
    d = base.data
    pairs = load_pairs(d)
    pairs = pairs[: args.max_sentences]
    refs = [t for _, t in pairs]
    ids = {}
    for s, (config, tok, _) in loaded.items():
        limit = config.model.max_positions - 1
        ids[s] = (
            [x[:limit] for x in tok.encode_batch([p for p, _ in pairs], "src")],
            [x[: limit - 1] for x in tok.encode_batch(refs, "tgt")],
        )
    first = args.seeds[0]
    if any(ids[s] != ids[first] for s in args.seeds):
        raise SystemExit(
            "the seeds' tokenizers split the test set differently: maps cannot be matched"
        )
    src_ids, ref_ids = ids[first]
    tok = loaded[first][1]

    results: dict = {
        "seeds": args.seeds,
        "sentences": len(pairs),
        "example": args.example,
        "budget": budget(base.train),
        "scoring": "last state",
        "training": training,
        "test_bleu": {},
        "counterfactual": {},
        "sensitivity": {},
    }
    maps = {}
    for s, (_, _, model) in loaded.items():
        hyps = greedy(model, src_ids)
        results["test_bleu"][s] = bleu(tok, hyps, refs)
        maps[s] = head_mean_maps(model, src_ids, ref_ids)
        results["counterfactual"][s] = counterfactuals(model, tok, src_ids, refs, hyps)
        results["sensitivity"][s] = attention_vs_sensitivity(
            model, src_ids, [h.tokens for h in hyps]
        )
        example = force_decode(
            model, collate([src_ids[args.example]], None).src, [ref_ids[args.example]]
        )[0]
        plot_attention(
            example.attention.numpy(),
            tok.pieces(src_ids[args.example] + [EOS_ID], "src"),
            tok.pieces(ref_ids[args.example] + [EOS_ID], "tgt"),
            args.out / f"maps_seed{s}.png",
            heads="mean",
            title=f"seed {s}: cross-attention, mean over heads",
            dpi=DPI,
        )
    results["maps"] = compare_maps(maps[first], maps[args.seeds[1]])
    plot_counterfactuals(results["counterfactual"], args.out / "counterfactual.png")
    results.update(
        command=command(),
        runs=", ".join(str(run_dirs[s]) for s in args.seeds),
        jobs=args.jobs,
        train_threads=args.train_threads,
        threads=args.threads,
        train_min=train_min,
        trained_here=not args.models,
        wall_min=minutes_since(started),
    )
    write_outputs(HERE, args.out, results, readme_values, "figures", indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
