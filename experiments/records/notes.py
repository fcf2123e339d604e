"""The measurements behind the advice of the user pages (docs/training.md, docs/python_api.md):
each a committed JSON record outside ``results/``, written by the script it names, rendered
here so that a page says what to do and links the evidence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.records import REPO, RecordError
from experiments.records.load import commit_of, read_json


def _machine(env: dict[str, Any]) -> str:
    flags = ", ".join(env.get("cpu_bf16_flags") or []) or "no bf16 flags"
    commit = commit_of(env)
    threads = f"{env['threads']} thread{'s' * (env['threads'] != 1)}"
    return f"{env['cpu']} ({flags}), {threads}, commit {commit}"


def _command(command: list[str] | str) -> str:
    return f"`{command if isinstance(command, str) else ' '.join(command)}`"


def subword_cost(r: dict[str, Any]) -> list[str]:
    """``experiments/bench_feed.py --subword-alpha``: sampling an epoch in the worker, and
    the step beside it against the step alone."""
    ms = r["ms_per_step"]
    return [
        f"{_machine(r['environment'])}; {r['rounds']} interleaved rounds of "
        f"{r['steps_per_round']} steps. Command: {_command(r['command'])}.",
        "",
        "| corpus pairs | sampling an epoch, s | step alone, ms | step beside the sampler, ms "
        "| ratio (median) | ratio min–max |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {r['pairs']:,} | {r['sample_epoch_s']:.1f} | {ms['alone']:.0f} "
        f"| {ms['sampling beside']:.0f} | {r['ratio_sampling_over_alone']:.2f}× "
        f"| {min(r['ratios']):.2f}–{max(r['ratios']):.2f}× |",
    ]


def memory_plateau(r: dict[str, Any]) -> list[str]:
    """``experiments/scale/plateau.py``: a training process's peak RSS over a longer stretch."""
    lines = [
        f"{_machine(r['environment'])}; each scale run resumed for {r['steps']} steps, its "
        f"peak RSS as the trainer logged it. Command: {_command(r['command'])}.",
        "",
        "| corpus pairs | RSS before the first step, MB | peak after the first step, MB "
        f"| peak after {r['steps']} steps, MB |",
        "|---:|---:|---:|---:|",
    ]
    for size, s in r["sizes"].items():
        by_step = s["peak_rss_mb_by_step"]
        lines.append(
            f"| {int(size):,} | {s['ready_rss_mb']:,.0f} | {by_step[0][1]:,.0f} "
            f"| {by_step[-1][1]:,.0f} |"
        )
    return lines


def allocators(glibc: dict[str, Any], jemalloc: dict[str, Any]) -> list[str]:
    """``experiments/scale/versions.py --after-env``: the same checkout with and without an
    allocator setting, interleaved rounds."""
    lines = [
        f"{_machine(glibc['machine'])}; the default recipe on Multi30k, {glibc['steps']} steps "
        f"a round, {len(glibc['ratios'])} interleaved rounds. Commands: "
        f"{_command(glibc['command'])}, {_command(jemalloc['command'])}.",
        "",
        "| setting | tokens/s, against the default allocator (median) | min–max "
        "| peak RSS, GB: default | with the setting |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in (glibc, jemalloc):
        peaks = r["peak_rss_mb_each_round"]
        setting = ", ".join(f"`{k}={Path(v).name}`" for k, v in r["after_env"].items())
        lines.append(
            f"| {setting} | {r['ratio_after_before']:.2f}× | {min(r['ratios']):.2f}–"
            f"{max(r['ratios']):.2f}× | {_gb(peaks['before'])} | {_gb(peaks['after'])} |"
        )
    return lines


def _gb(mb: list[float]) -> str:
    low, high = min(mb) / 1000, max(mb) / 1000
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"


def notebook_latency(r: dict[str, Any]) -> list[str]:
    """``experiments/notebook_latency.py``: ``import seq2seq`` to the first inline explorer."""
    cold, warm = r["each_cold_s"], r["each_warm_s"]
    return [
        f"{r['machine']}, {r['threads']} threads; weights {r['weights']}, so the output ran to "
        f"{r['stop_reason']}, longer than a trained model's; one sentence ({r['sentence']!r}), "
        f"median of {r['repeats']} fresh processes. {r['note'][:1].upper()}{r['note'][1:]}; "
        f"load averages {_loads(r['load_average'][:3])}; {_loads(r['load_average'][3:])}. "
        f"Command: {_command(r['command'])}.",
        "",
        "| from | to | seconds (median) | min–max |",
        "|---|---|---:|---:|",
        f"| `import seq2seq` | the first inline explorer | {r['cold_s']:.1f} "
        f"| {min(cold):.1f}–{max(cold):.1f} |",
        f"| `import seq2seq` | the run loaded | {r['load_s']:.1f} | |",
        f"| the first explorer | the same call again | {r['warm_s']:.1f} "
        f"| {min(warm):.1f}–{max(warm):.1f} |",
        "",
        f"One explorer's HTML output: {r['html_bytes'] / 1000:.0f} kB.",
    ]


def influence_precision(*records: dict[str, Any]) -> list[str]:
    """``experiments/influence_precision.py``: how far a map's precision moves its drops, one
    machine a record."""
    lines = []
    for r in records:
        lines += [
            f"{_machine(r['environment'])}; the run `{r['run']}` ({r['model']['steps']} steps, "
            f"trained in {r['model']['precision']}), the occlusion map of its greedy output for "
            f"each of the {r['sentences']} sentences of `{r['file']}` ({r['rows']} rows). "
            f"Command: {_command(r['command'])}.",
            "",
            "| map against reference | largest cell move, nats | median over sentences of each "
            "one's largest | largest move of a row's top-two gap | rows whose top column differs |",
            "|---|---:|---:|---:|---:|",
        ]
        for pair, m in r["pairs"].items():
            lines.append(
                f"| {pair} | {m['largest_cell_nats']:.3g} | "
                f"{m['median_sentence_largest_cell_nats']:.3g} | "
                f"{m['largest_top_two_gap_move_nats']:.3g} | "
                f"{m['rows_whose_top_column_differs']} of {r['rows']} |"
            )
        lines.append("")
    return lines[:-1]


def word_alignments(r: dict[str, Any]) -> list[str]:
    """``experiments/alignment/run.py``: links from each attention map against those from
    influence, and each against the hand-made gold."""
    m = r["model"]
    rows = [("attention: " + a["map"], a, f"{a['agreement']:.1%}") for a in r["attention"]]
    rows += [
        ("influence (occlusion)", r["influence"], ""),
        ("diagonal, no model", r["diagonal"], ""),
    ]
    best = min(r["attention"], key=lambda a: a["aer"])
    lines = [
        f"{_machine(r['environment'])}; the run `{r['run']}` ({m['steps']} steps, weights "
        f"{m['weights']}, validation BLEU {m['valid_bleu']:.1f}), teacher-forced on the "
        f"{r['sentences']} reference translations of `{r['files']['ref']}` ({r['target_words']} "
        f"target words), scored against `{r['files']['gold']}`, a gold alignment the project made "
        f"by hand (not a published one). Command: {_command(r['command'])}.",
        "",
        "| links from | same source word as influence | AER | precision | recall |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s, agree in rows:
        lines.append(
            f"| {name} | {agree} | {s['aer']:.3f} | {s['precision']:.3f} | {s['recall']:.3f} |"
        )
    lines += [
        "",
        f"Agreement counts the target words whose most influential source word is no tie "
        f"({r['target_words'] - r['influence_ties']} of {r['target_words']}); chance, one source "
        f"word drawn at random per target word: {r['chance_agreement']:.1%}. The lowest AER of "
        f"an attention map: {best['map']}, {best['aer']:.3f}; influence's "
        f"{r['influence']['aer']:.3f}; the diagonal's {r['diagonal']['aer']:.3f}, below that of "
        f"{sum(a['aer'] > r['diagonal']['aer'] for a in r['attention'])} of the "
        f"{len(r['attention'])} attention maps.",
        "",
        "What it shows: how often each map's most attended source word is the one whose hiding "
        "lowers the word most, and how close each comes to one annotator's links on a couple of "
        "dozen short sentences. What it does not: agreement with influence is not correctness "
        "(occlusion is one measure of influence, with its own caveats), a low AER does not make "
        "attention an explanation of why a word was written, and so few sentences of one "
        "annotator on one small model rank the maps only roughly.",
    ]
    return lines


def _loads(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


# Each section: its title, the records it reads (relative to the repository) and its renderer.
NOTES: list[tuple[str, tuple[str, ...], Callable[..., list[str]]]] = [
    ("Subword sampling's cost", ("experiments/scale/bench_subword.json",), subword_cost),
    ("Training memory over steps", ("experiments/scale/plateau.json",), memory_plateau),
    (
        "The allocator: glibc's thresholds and jemalloc",
        (
            "experiments/scale/allocator_glibc_thresholds.json",
            "experiments/scale/allocator_jemalloc.json",
        ),
        allocators,
    ),
    ("The first explorer in a notebook", ("experiments/notebook/latency.json",), notebook_latency),
    (
        "Influence maps: how far the precision moves a drop",
        (
            "experiments/results/influence_precision_tour.json",
            "experiments/results/influence_precision_tour_avx2.json",
        ),
        influence_precision,
    ),
    (
        "Word alignments: attention against influence and a hand-made gold",
        ("experiments/results/alignment_deen.json",),
        word_alignments,
    ),
]


def notes_section(repo: Path = REPO) -> str:
    """The measurements of ``NOTES``, a section each, naming its records."""
    parts = ["## Measurements behind the user pages"]
    for title, paths, render in NOTES:
        missing = [p for p in paths if not (repo / p).is_file()]
        if missing:
            raise RecordError(f"{missing[0]}: missing (a record {title!r} renders)")
        records = ", ".join(f"`{p}`" for p in paths)
        body = render(*(read_json(repo / p) for p in paths))
        parts.append("\n".join([f"### {title}", "", f"Records: {records}.", "", *body]))
    return "\n\n".join(parts)
