"""The speed tables, from the benchmarks' JSON records (``bench_train.py`` and
``bench_decode.py`` with ``--json experiments/results/NAME/benchmark.json``)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from experiments.records import BENCHMARK, RecordError
from experiments.records.device import device_check, gpu_check
from experiments.records.load import commit_of, read_json

_TRAINED = ("environment", "model_config", "parameters", "precision")  # _model_line's fields
NEEDS = {
    "train": (
        *_TRAINED,
        "rounds",
        "steps_per_round",
        "matmul_peak_flops_per_s",
        "results",
        "speedup_vs_best_reference",
    ),
    "profile": (*_TRAINED, "profile"),
    "decode": ("environment", "setup", "cases", "bleu"),
    "masks-memory": (*_TRAINED, "steps", "masks"),
    "masks-time": (*_TRAINED, "rounds", "steps_per_round", "masks"),
    "gpu-check": ("environment", "calls"),
    "device-check": ("stages", "budget_s", "deadlines_s"),
    "training-memory": (*_TRAINED, "steps", "memory", "peak_growth_mb_per_step"),
}


def speed_sections(folders: list[Path]) -> str:
    """A section per benchmark record: training ones first, then where a training step's
    time goes, then decoding, then dropout's two masks (``bench_masks.py``)."""
    loaded = [(folder.name, _benchmark(folder)) for folder in folders]
    parts = []
    for kind, title, render in (
        ("train", "Training speed", train_speed),
        ("profile", "Where a training step's time goes", profile_table),
        ("decode", "Decoding speed", decode_speed),
        ("masks-memory", "Dropout masks: training memory", masks_memory),
        ("masks-time", "Dropout masks: step time", masks_time),
        ("gpu-check", "On a GPU: gpu_check", gpu_check),
        ("device-check", "On a GPU: device_check", device_check),
        ("training-memory", "Memory through a training run", training_memory),
    ):
        found = [render(name, b) for name, b in loaded if b["benchmark"] == kind]
        parts.append(f"## {title}\n\n" + ("\n\n".join(found) or "No benchmark records yet."))
    return "\n\n".join(parts)


def _benchmark(folder: Path) -> dict[str, Any]:
    path = folder / BENCHMARK
    b = read_json(path)
    kind = b.get("benchmark")
    if kind not in NEEDS:
        raise RecordError(f"{path}: 'benchmark' must be one of {', '.join(NEEDS)}")
    for field in NEEDS[kind]:
        if field not in b:
            raise RecordError(f"{path}: no '{field}' field")
    return b


def environment_line(env: dict[str, Any]) -> str:
    commit = commit_of(env)
    return (
        f"{env['cpu']}, {env['threads']} torch thread(s), torch {env['versions']['torch']}, "
        f"commit {commit}"
    )


def _command(b: dict[str, Any]) -> str:
    return f"\n\nCommand: `{' '.join(b['command'])}`" if b.get("command") else ""


def _quick(b: dict[str, Any]) -> str:
    quick = b.get("quick") or b.get("setup", {}).get("quick")
    return " **A `--quick` run: its numbers prove the script runs, nothing more.**" * bool(quick)


def _weights(b: dict[str, Any]) -> str:
    m = b.get("model")
    return f" (weights {m['weights']}, sha256 `{m['sha256'][:16]}…`)" if m else ""


def _model_line(b: dict[str, Any]) -> str:
    c = b["model_config"]
    return (
        f"{environment_line(b['environment'])}; d_model {c['d_model']}, {c['n_heads']} heads, "
        f"d_ff {c['d_ff']}, {c['n_enc_layers']}+{c['n_dec_layers']} layers, "
        f"{b['parameters']:,} parameters, {b['precision']}"
    )


def profile_table(name: str, b: dict[str, Any]) -> str:
    """``bench_train.py --profile``: the share of the step's self CPU time by kind of
    operator, and the operators that take the most."""
    p = b["profile"]
    lines = [
        f"### `{name}`",
        "",
        f"{_model_line(b)}; {p['steps']} steps under torch.profiler, "
        f"{p['tokens_per_s']:,.0f} target tokens/s ({p['ms_per_step']:.0f} ms a step) with the "
        f"profiler on.{_quick(b)}{_command(b)}",
        "",
        "| kind | share of self CPU time |",
        "|---|---:|",
    ]
    shares = sorted(p["shares"].items(), key=lambda item: -item[1])
    lines += [f"| {kind} | {share:.1%} |" for kind, share in shares]
    lines += ["", "| operator | calls | share |", "|---|---:|---:|"]
    lines += [f"| `{o['name']}` | {o['calls']:,} | {o['share']:.1%} |" for o in p["operators"]]
    return "\n".join(lines)


def train_speed(name: str, b: dict[str, Any]) -> str:
    """Target tokens/s of each set-up, its spread over rounds and its share of the peaks."""
    peaks = b["matmul_peak_flops_per_s"]
    lines = [
        f"### `{name}`",
        "",
        f"{_model_line(b)}; median of {b['rounds']} rounds of "
        f"{b['steps_per_round']} steps.{_quick(b)}{_command(b)}",
        "",
        train_table(b["results"], peaks),
    ]
    speedup, goal = b["speedup_vs_best_reference"], b.get("speedup_goal")
    verdict = f" (goal ≥ {goal}×: {'met' if speedup >= goal else 'not met'})" if goal else ""
    lines += ["", f"seq2seq / best eager nn.Transformer: {speedup:.2f}×{verdict}."]
    muon = muon_lines(b["results"])
    return "\n".join(lines + (["", *(f"- {line}" for line in muon)] if muon else []))


def paired_ratios(base: list[float], other: list[float]) -> list[float]:
    """``base``'s rate over ``other``'s (other's seconds over base's) for each pair of rounds,
    one run in each order, their rates averaged."""
    whole = len(base) // 2 * 2
    return [(base[i] + base[i + 1]) / (other[i] + other[i + 1]) for i in range(0, whole, 2)]


def muon_lines(results: list[dict[str, Any]]) -> list[str]:
    """Each Muon contestant's seconds a step over our Adam's (``results[0]``), per pair of
    rounds (one in each order), so that a drift of the machine's speed weighs on both alike."""
    lines = []
    for r in (r for r in results if r["model"].startswith("seq2seq, Muon")):
        pairs = paired_ratios(results[0]["tokens_per_s_rounds"], r["tokens_per_s_rounds"])
        lines.append(
            f"{r['model']} / seq2seq: "
            + (f"{statistics.median(pairs):.2f}× the seconds a step, median of {len(pairs)} "
               f"pairs of rounds ({min(pairs):.2f}–{max(pairs):.2f})" if pairs else "no whole pair")
        )  # fmt: skip
    return lines


def decode_speed(name: str, b: dict[str, Any]) -> str:
    """Each A/B case's tokens/s and ratio against its goal; the engines' test BLEU."""
    s = b["setup"]
    lines = [
        f"### `{name}`",
        "",
        f"{environment_line(b['environment'])}; run `{s['run']}`{_weights(b)}, "
        f"{s['sentences']} sentences, "
        f"output lengths {', '.join(map(str, s['lengths']))} (EOS banned), median of "
        f"{s['repeats']} repeats on {s['device']}.{_quick(b)}{_command(b)}",
        "",
        cases_table(b["cases"]),
    ]
    if b["bleu"]:
        lines += ["", bleu_table(b["bleu"])]
    return "\n".join(lines)


def masks_memory(name: str, b: dict[str, Any]) -> str:
    """``bench_masks.py memory``: each mask's peak resident memory and what a step keeps."""
    how = (
        f"the same {b['steps']} batches from the same weights and seed, each mask in a fresh "
        "process"
    )
    rows = [f"| {m['mask']} | {m['peak_rss_mb']:,.0f} | {m['saved_mb']:,.1f} |" for m in b["masks"]]
    return _masks_section(
        name, b, how, "peak RSS, MB | kept for backward by the largest step, MB", rows
    )


def masks_time(name: str, b: dict[str, Any]) -> str:
    """``bench_masks.py time``: each mask's median step time over interleaved rounds."""
    how = (
        f"median of {b['rounds']} interleaved rounds of {b['steps_per_round']} steps, the same "
        "seed each"
    )
    rows = [
        f"| {mask} | {m['ms_per_step']:.1f} | {m['ms_per_step_min']:.1f}–{m['ms_per_step_max']:.1f} |"
        for mask, m in b["masks"].items()
    ]
    return _masks_section(name, b, how, "ms/step (median) | min–max", rows)


def training_memory(name: str, b: dict[str, Any]) -> str:
    """``bench_memory.py``: resident memory at two step counts, and the peak's growth."""
    lines = [
        f"### `{name}`",
        "",
        f"{_model_line(b)}; the trainer's own epochs without validations.{_quick(b)}{_command(b)}",
        "",
        "| step | peak RSS, MB | RSS, MB |",
        "|---:|---:|---:|",
    ]
    for step in b["steps"]:
        m = b["memory"][str(step)]
        now = f"{m['rss_mb']:,.0f}" if "rss_mb" in m else "–"
        lines.append(f"| {step:,} | {m['peak_rss_mb']:,.0f} | {now} |")
    first, last = b["steps"]
    growth = b["peak_growth_mb_per_step"]
    said = f"Peak growth from step {first:,} to {last:,}: {growth:.2f} MB a step"
    if "seconds_per_step" in b:  # records before it had no clock
        said += f", {b['seconds_per_step']:.3f} s a step"
    caches = b["environment"].get("kernel_caches")
    kept = (
        ", ".join(f"{name}={value or 'unset (1,024)'}" for name, value in caches.items())
        if caches
        else "not recorded"
    )
    lines += ["", f"{said}. Kernel caches: {kept}."]
    return "\n".join(lines)


def _masks_section(name: str, b: dict[str, Any], how: str, columns: str, rows: list[str]) -> str:
    """A ``bench_masks.py`` record: what ran and how, then a row per mask."""
    lines = [f"### `{name}`", "", f"{_model_line(b)}; {how}.{_quick(b)}{_command(b)}", ""]
    lines += [f"| mask | {columns} |", "|---|" + "---:|" * (columns.count("|") + 1), *rows]
    return "\n".join(lines)


def train_table(results: list[dict[str, Any]], peaks: dict[str, float]) -> str:
    """``bench_train.py``'s rows: what it prints and what the render shows."""
    lines = [
        "| set-up | target tokens/s (median) | min–max | ms/step | model GFLOP/s | of fp32 peak "
        "| of bf16 peak | warm-up s | profiler events/step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['model']} | {r['tokens_per_s']:,.0f} "
        f"| {r['tokens_per_s_min']:,.0f}–{r['tokens_per_s_max']:,.0f} | {r['ms_per_step']:.1f} "
        f"| {r['model_flops_per_s'] / 1e9:.2f} | {r['model_flops_per_s'] / peaks['fp32']:.1%} "
        f"| {_share(r['model_flops_per_s'], peaks.get('bf16'))} | {r['warmup_seconds']:.1f} "
        f"| {r.get('profiler_events_per_step', '—')} |"
        for r in results
    ]
    return "\n".join(lines)


def _share(rate: float, peak: float | None) -> str:
    """``rate`` as a share of ``peak``; a dash where no peak was measured (no native bf16)."""
    return "—" if peak is None else f"{rate / peak:.1%}"


def cases_table(rows: list[dict[str, Any]]) -> str:
    """``bench_decode.py``'s A/B cases: tokens/s of each side, ratio, goal, verdict."""
    lines = [
        "| case | ours tok/s | reference tok/s | ratio | goal | pass |",
        "|---|---:|---:|---:|---|---|",
    ]
    lines += [
        f"| {r['case']} | {r['ours_tok_s']:,.0f} | {r['reference_tok_s']:,.0f} "
        f"| {r['ratio']:.2f} | {r['goal']} | {_passed(r['pass'])} |"
        for r in rows
    ]
    return "\n".join(lines)


def bleu_table(rows: list[dict[str, Any]]) -> str:
    """``bench_decode.py --ctranslate2``'s test BLEU per engine and beam."""
    lines = ["| engine | beam | test BLEU | goal | pass |", "|---|---:|---:|---|---|"]
    lines += [
        f"| {r['engine']} | {r['beam']} | {r['bleu']:.2f} | {r.get('goal', '-')} "
        f"| {_passed(r.get('pass'))} |"
        for r in rows
    ]
    return "\n".join(lines)


def _passed(value: bool | None) -> str:
    return "-" if value is None else ("pass" if value else "FAIL")
