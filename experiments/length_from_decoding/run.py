"""Output length comes from decoding and its stop rule, not from attention.

With a trained run (default ``runs/de-en``) on its test split:

1. shapes: one cross-attention call with 6 queries over 10 keys and one with 10 over 6;
2. lengths: output against source length, output/reference length ratios, stop reasons;
3. the limit: greedy decoding under several ``max_len = a * S + b`` settings, with and
   without EOS banned: which outputs move when the limit moves;
4. one sentence's P(EOS) at every step, up to where the loop stops (and, EOS banned, on
   to ``max_len``).

    python experiments/length_from_decoding/run.py [--run runs/de-en] [--quick --out DIR]
    python experiments/length_from_decoding/run.py --readme-only

A full run writes ``results.json``, the figures and ``README.md`` (from
``README.template.md``) into this folder. ``--quick`` trains a tiny model on ``data/sample``
for a few seconds and writes into ``--out`` (a temporary folder by default): a smoke test of
the code, not of the claims. ``--readme-only`` rewrites ``README.md`` from ``results.json``.
"""

from __future__ import annotations

import argparse
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
from seq2seq.decoding.search import Hypothesis, greedy_search, max_output_length, step_probs
from seq2seq.model.transformer import Seq2Seq
from seq2seq.training.entry import train
from seq2seq.vocab import EOS_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common
from common import (  # noqa: E402
    QUICK_MODEL,
    add_output_args,
    command,
    load_pairs,
    minutes_since,
    model_used,
    output_dir,
    save_figure,
    write_outputs,
    write_readme,
)

HERE = Path(__file__).resolve().parent
MAX_TOKENS = 4096  # source tokens per decoding batch
# (a, b) pairs for max_len = a * S + b; the last, roomiest, is the one the others are
# compared with. Small ones on purpose: a limit that never binds shows nothing.
SETTINGS = [(0.5, 2), (1.0, 0), (1.0, 5), (1.5, 10), (2.0, 20)]
QUICK_RUN = [
    *QUICK_MODEL,
    "train.max_steps=30",
    "train.warmup_steps=10",
    "train.threads=1",
    "train.attention_sentences=0",
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--run", default="runs/de-en", help="trained run directory (default: %(default)s)"
    )
    p.add_argument("--split", default="test", help="corpus split to decode (default: %(default)s)")
    p.add_argument("--example", type=int, default=0, help="sentence index for the P(EOS) trace")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    add_output_args(p, "tiny model and data; seconds")
    args = p.parse_args()
    if args.quick:
        args.threads = 1
    args.out = output_dir(p, args.out, args.quick, HERE)
    return args


def decode(
    model: Seq2Seq, src_ids: list[list[int]], a: float, b: int, ban_eos: bool = False
) -> list[Hypothesis]:
    """Greedy hypotheses in input order, decoded in length-sorted token-bounded batches."""
    out: list = [None] * len(src_ids)
    for idx in batches_of(src_ids, None, MAX_TOKENS):
        batch = collate([src_ids[i] for i in idx], None)
        for i, hyp in zip(
            idx,
            greedy_search(
                model, batch.src, DecodeConfig(max_len_a=a, max_len_b=b, ban_eos=ban_eos)
            ),
            strict=True,
        ):
            out[i] = hyp
    return out


def shapes(model: Seq2Seq) -> list[dict]:
    """One cross-attention call each way round: the output has one row per query."""
    attn = model.decoder_layers[0].cross_attn
    d = attn.d_model
    torch.manual_seed(0)
    rows = []
    with torch.inference_mode():
        for tq, tk in ((6, 10), (10, 6)):
            q, memory = torch.randn(1, tq, d), torch.randn(1, tk, d)
            out, weights = attn(q, memory, memory, need_weights=True)
            assert weights.shape[-2:] == (tq, tk) and out.shape[1] == tq
            rows.append(
                {
                    "queries": tq,
                    "keys": tk,
                    "weights": list(weights.shape),
                    "output": list(out.shape),
                }
            )
    return rows


def length_stats(hyps: list[Hypothesis], src_lens: list[int], ref_lens: list[int]) -> dict:
    out_lens = [len(h.tokens) for h in hyps]
    ratios = [o / r for o, r in zip(out_lens, ref_lens, strict=True) if r > 0]
    stops = [h.stop_reason for h in hyps]
    ratios_sorted = sorted(ratios)
    return {
        "sentences": len(hyps),
        "out_lens": out_lens,
        "ratios": ratios,
        "ratio_mean": sum(ratios) / len(ratios),
        "ratio_median": ratios_sorted[len(ratios_sorted) // 2],
        "stop_shares": {r: stops.count(r) / len(stops) for r in ("eos", "max_len")},
        "src_lens": src_lens,
    }


def limit_sweep(model: Seq2Seq, src_ids: list[list[int]], max_positions: int) -> list[dict]:
    """Every setting with and without EOS banned, each compared with the roomiest setting."""
    src_lens = [len(s) + 1 for s in src_ids]  # + EOS: what the search counts as S
    runs = {ab: decode(model, src_ids, *ab) for ab in SETTINGS}
    roomiest = runs[SETTINGS[-1]]
    rows = []
    for a, b in SETTINGS:
        hyps = runs[(a, b)]
        banned = decode(model, src_ids, a, b, ban_eos=True)
        limits = [max_output_length(s, a, b, max_positions) for s in src_lens]
        eos = [i for i, h in enumerate(hyps) if h.stop_reason == "eos"]
        cut = [i for i, h in enumerate(hyps) if h.stop_reason == "max_len"]
        ref = [h.tokens for h in roomiest]
        rows.append(
            {
                "a": a,
                "b": b,
                "n_eos": len(eos),
                "n_max_len": len(cut),
                # EOS-stopped outputs: identical to the roomiest setting's output?
                "eos_identical": sum(hyps[i].tokens == ref[i] for i in eos),
                # limit-stopped outputs: exactly max_len tokens, a prefix of the roomiest
                # output, and different from it (the only outputs that moved)?
                "cut_exact": sum(len(hyps[i].tokens) == limits[i] for i in cut),
                "cut_prefix": sum(ref[i][: limits[i]] == hyps[i].tokens for i in cut),
                "cut_changed": sum(hyps[i].tokens != ref[i] for i in cut),
                "changed": sum(h.tokens != r for h, r in zip(hyps, ref, strict=True)),
                # EOS banned: every output exactly max_len tokens, and it starts with the
                # output that stopped at EOS (banning EOS changes nothing before that step)
                "banned_exact": sum(
                    len(h.tokens) == n for h, n in zip(banned, limits, strict=True)
                ),
                "banned_extends": sum(
                    banned[i].tokens[: len(hyps[i].tokens)] == hyps[i].tokens for i in eos
                ),
                "banned_lens": [len(h.tokens) for h in banned],
                "max_lens": limits,
            }
        )
    return rows


def greedy_p_eos(
    model: Seq2Seq, src: Tensor, decode: DecodeConfig
) -> tuple[Hypothesis, list[float]]:
    """Greedy search's output for one sentence and P(EOS) at each of its steps, read back by
    teacher-forcing that output (``step_probs``)."""
    hyp = greedy_search(model, src, decode)[0]
    steps = hyp.tokens + [EOS_ID] if hyp.stop_reason == "eos" else hyp.tokens
    return hyp, step_probs(model, src, steps)[:, EOS_ID].tolist()


def eos_trace(model: Seq2Seq, src: list[int], a: float, b: int) -> dict:
    batch = collate([src], None).src
    normal, p_eos = greedy_p_eos(model, batch, DecodeConfig(max_len_a=a, max_len_b=b))
    banned, banned_p_eos = greedy_p_eos(
        model, batch, DecodeConfig(max_len_a=a, max_len_b=b, ban_eos=True)
    )
    return {
        "tokens": normal.tokens,
        "stop_reason": normal.stop_reason,
        "p_eos": p_eos,
        "banned_tokens": banned.tokens,
        "banned_p_eos": banned_p_eos,
        "max_len": max_output_length(len(src) + 1, a, b, model.config.max_positions),
    }


# --- figures ---------------------------------------------------------------------------


def plot_lengths(stats: dict, a: float, b: int, path: Path) -> None:
    fig = Figure(figsize=(12, 3.6))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    src, out = stats["src_lens"], stats["out_lens"]
    for reason, color in (("eos", "tab:blue"), ("max_len", "tab:red")):
        idx = [i for i, r in enumerate(stats["stops"]) if r == reason]
        ax1.scatter(
            [src[i] for i in idx],
            [out[i] for i in idx],
            s=6,
            alpha=0.4,
            c=color,
            label=f"stopped at {reason}",
        )
    xs = [min(src), max(src)]
    ax1.plot(xs, [a * x + b for x in xs], "k--", lw=1, label=f"max_len = {a}·S + {b}")
    ax1.set(
        xlabel="source length S (subwords + EOS)",
        ylabel="output length (subwords)",
        title="output vs source length",
    )
    ax1.legend(fontsize=7)
    ax2.hist(stats["ratios"], bins=40, color="tab:gray")
    ax2.axvline(1.0, color="k", lw=1)
    ax2.set(
        xlabel="output / reference length (subwords)",
        ylabel="sentences",
        title=f"length ratio, median {stats['ratio_median']:.2f}",
    )
    shares = stats["stop_shares"]
    ax3.bar(list(shares), [100 * v for v in shares.values()], color=["tab:blue", "tab:red"])
    for i, v in enumerate(shares.values()):
        ax3.text(i, 100 * v, f"{100 * v:.1f}%", ha="center", va="bottom", fontsize=8)
    ax3.set(ylabel="% of sentences", title="stop reason", ylim=(0, 110))
    save_figure(fig, path)


def plot_limits(rows: list[dict], src_lens: list[int], path: Path) -> None:
    fig = Figure(figsize=(10, 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    labels = [f"{r['a']}·S+{r['b']}" for r in rows]
    n = [r["n_eos"] + r["n_max_len"] for r in rows]
    same = [100 * r["eos_identical"] / k for r, k in zip(rows, n, strict=True)]
    other = [100 * (r["n_eos"] - r["eos_identical"]) / k for r, k in zip(rows, n, strict=True)]
    cut = [100 * r["n_max_len"] / k for r, k in zip(rows, n, strict=True)]
    ax1.bar(labels, same, color="tab:blue", label="EOS, same as roomiest")
    ax1.bar(labels, other, bottom=same, color="tab:orange", label="EOS, different")
    ax1.bar(
        labels,
        cut,
        bottom=[s + o for s, o in zip(same, other, strict=True)],
        color="tab:red",
        label="cut at max_len",
    )
    ax1.set(ylabel="% of sentences", title="normal decoding under each max_len")
    ax1.tick_params(axis="x", labelsize=7)
    ax1.legend(fontsize=7)
    for r, label in zip(rows, labels, strict=True):
        line = sorted(zip(src_lens, r["max_lens"], strict=True))
        drawn = ax2.plot([x for x, _ in line], [y for _, y in line], lw=0.8, label=label)
        ax2.scatter(src_lens, r["banned_lens"], s=5, alpha=0.4, color=drawn[0].get_color())
    ax2.set(
        xlabel="source length S",
        ylabel="output length",
        title="EOS banned: dots = outputs, lines = max_len",
    )
    ax2.legend(fontsize=7)
    save_figure(fig, path)


def plot_trace(trace: dict, pieces: list[str], banned_pieces: list[str], path: Path) -> None:
    fig = Figure(figsize=(max(6, 0.3 * len(trace["banned_p_eos"]) + 2), 3.6))
    ax = fig.subplots()
    nb = len(trace["banned_p_eos"])
    ax.plot(
        range(1, nb + 1),
        trace["banned_p_eos"],
        color="0.6",
        ls="--",
        marker=".",
        label="EOS banned (runs to max_len)",
    )
    n = len(trace["p_eos"])
    ax.plot(
        range(1, n + 1),
        trace["p_eos"],
        color="tab:blue",
        marker="o",
        label=f"normal (stops: {trace['stop_reason']})",
    )
    ax.axvline(n, color="tab:blue", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(1, nb + 1))
    labels = [
        (pieces[i] if i < len(pieces) else "</s>") if i < n else banned_pieces[i] for i in range(nb)
    ]
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set(
        ylabel="P(EOS) at the step",
        title="the stop decision, step by step (x labels: the token emitted at that step)",
    )
    ax.legend(fontsize=7)
    save_figure(fig, path)


# --- report ----------------------------------------------------------------------------


def pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f}%" if n else "n/a"


def model_line(r: dict) -> str:
    """Which model the results come from, as ``results.json`` records it."""
    m = r.get("model")
    if m is None:
        return "Which weights: not recorded (these results predate the record; rerun pending)."
    return (
        f"Weights: `{m['weights_file']}`, {m['weights']}, validation BLEU {m['valid_bleu']:.2f} "
        f"(sha256 `{m['sha256'][:16]}…`); the run trained {m['steps']} steps in "
        f"{m['minutes']:.1f} min, best validation BLEU {m['best_valid_bleu']:.2f}."
    )


def readme_values(r: dict) -> dict[str, str]:
    """The tables, verdicts and conclusion of ``README.template.md``, computed from the
    results ``r``."""
    s = r["lengths"]
    shape_rows = "\n".join(
        f"| {x['queries']} | {x['keys']} | {x['weights']} | {x['output']} |" for x in r["shapes"]
    )
    limit_rows = "\n".join(
        f"| {x['a']}·S+{x['b']} | {x['n_eos']} | {x['n_max_len']} "
        f"| {pct(x['eos_identical'], x['n_eos'])} | {pct(x['cut_exact'], x['n_max_len'])} "
        f"| {pct(x['cut_prefix'], x['n_max_len'])} | {x['changed']} "
        f"| {pct(x['banned_exact'], s['sentences'])} | {pct(x['banned_extends'], x['n_eos'])} |"
        for x in r["limits"]
    )
    t = r["trace"]
    trace_rows = "\n".join(
        f"| {i + 1} | `{tok}` | {p:.2e} |"
        for i, (tok, p) in enumerate(zip(t["pieces"], t["p_eos"], strict=False))
    )
    eos_ok = all(x["eos_identical"] == x["n_eos"] for x in r["limits"])
    cut_ok = all(x["cut_exact"] == x["cut_prefix"] == x["n_max_len"] for x in r["limits"])
    banned_ok = all(x["banned_exact"] == s["sentences"] for x in r["limits"])
    moved_only_cut = all(x["changed"] == x["cut_changed"] for x in r["limits"])
    verdict = [
        (
            "Every output that stopped at EOS was identical to the roomiest setting's output, in every setting"
            if eos_ok
            else "**Some EOS-stopped outputs differ from the roomiest setting's output: look into it before concluding anything**"
        )
        + ".",
        (
            "Every output cut by the limit has exactly max_len tokens and is a prefix of the roomiest setting's output"
            if cut_ok
            else "**Not every cut output is exactly max_len tokens long and a prefix of the roomiest output**"
        )
        + ".",
        (
            "The outputs that changed between settings are all among the cut ones"
            if moved_only_cut
            else "**Some outputs that changed were not cut by the limit**"
        )
        + ".",
        (
            "With EOS banned, every output has exactly max_len = a·S + b tokens"
            if banned_ok
            else "**With EOS banned, not every output has exactly max_len tokens**"
        )
        + ".",
    ]
    if eos_ok and cut_ok and moved_only_cut and banned_ok:
        conclusion = (
            f"On this model and test set, where each translation ended was decided by the loop: "
            f"{100 * s['stop_shares']['eos']:.1f}% of outputs ended when EOS was the most likely next "
            "token and the rest were cut by the limit; moving a and b changed only the outputs the "
            "limit cut, and with EOS banned every output ran to exactly a·S + b tokens. The "
            "attention output had one row per query in both shape checks."
        )
    else:
        conclusion = "**The numbers above break at least one of the claims; see the bold lines.**"
    roomiest = r["limits"][-1]
    return {
        "shape_rows": shape_rows,
        "limit_rows": limit_rows,
        "roomiest": f"{roomiest['a']}·S+{roomiest['b']}",
        "model_line": model_line(r),
        "verdict": " ".join(verdict),
        "trace_rows": trace_rows,
        "conclusion": conclusion,
    }


def main() -> int:
    args = parse_args()
    if args.readme_only:
        write_readme(HERE, args.out, readme_values)
        return 0
    torch.set_num_threads(args.threads)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(args.run)
    if args.quick:
        run_dir = args.out / "run"
        train(load_config(None, QUICK_RUN), run_dir, overwrite=True, progress=False)
    config, tok, model = load_run(run_dir)
    d = config.data
    pairs = load_pairs(d, args.split)
    limit = config.model.max_positions - 1
    src_ids = [ids[:limit] for ids in tok.encode_batch([s for s, _ in pairs], "src")]
    ref_ids = tok.encode_batch([t for _, t in pairs], "tgt")
    src_lens = [len(s) + 1 for s in src_ids]
    a, b = config.decode.max_len_a, config.decode.max_len_b

    hyps = decode(model, src_ids, a, b)
    stats = length_stats(hyps, src_lens, [len(r) for r in ref_ids])
    stats["stops"] = [h.stop_reason for h in hyps]
    texts = [tok.decode(h.tokens, "tgt") for h in hyps]
    bleu = sacrebleu.corpus_bleu(texts, [[t for _, t in pairs]])
    limits = limit_sweep(model, src_ids, config.model.max_positions)

    i = args.example
    trace = eos_trace(model, src_ids[i], a, b)
    pieces = tok.pieces(
        trace["tokens"] + ([EOS_ID] if trace["stop_reason"] == "eos" else []), "tgt"
    )
    banned_pieces = tok.pieces(trace["banned_tokens"], "tgt")
    trace.update(
        index=i,
        source=pairs[i][0],
        reference=pairs[i][1],
        pieces=pieces,
        text=tok.decode(trace["tokens"], "tgt"),
    )

    plot_lengths(stats, a, b, args.out / "lengths.png")
    plot_limits(limits, src_lens, args.out / "max_len.png")
    plot_trace(trace, pieces, banned_pieces, args.out / "eos_trace.png")
    results = {
        "run": str(run_dir),
        "model": model_used(run_dir),
        "split": args.split,
        "decode_a": a,
        "decode_b": b,
        "shapes": shapes(model),
        "bleu": bleu.score,
        "bleu_length_ratio": bleu.sys_len / max(bleu.ref_len, 1),
        "lengths": stats,
        "limits": limits,
        "trace": trace,
        "threads": args.threads,
        "command": command(),
        "wall_min": minutes_since(started),
    }
    write_outputs(HERE, args.out, results, readme_values, "figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
