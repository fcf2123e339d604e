"""The GPU checks' records: ``experiments/gpu_check.py``'s (a column per call) and
``experiments/device_check.py``'s (a row per stage, then its rates, its profile and the
README's commands). A device check's record may hold stages that were cut or skipped: each
cell says what its stage left, or a dash."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from experiments.records.load import commit_of


def gpu_check(name: str, b: dict[str, Any]) -> str:
    """``experiments/gpu_check.py``'s records, a column per call: each stage's outcome and
    seconds, the main job's steps and scores, bench_train's ratios."""
    calls = b["calls"]
    lines = [
        f"### {name}",
        "",
        _gpu_line(b["environment"]),
        "",
        "| | " + " | ".join(f"call {i + 1} (code {c['code']})" for i, c in enumerate(calls)) + " |",
        "|---|" + "---:|" * len(calls),
    ]
    stages = list(dict.fromkeys(s for c in calls for s in c["stages"]))
    for stage in stages:
        cells = []
        for c in calls:
            found = c["stages"].get(stage)
            cells.append(
                "—" if found is None else f"{found['status']}, {found.get('seconds', 0):.0f} s"
            )
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")

    def row(label: str, read) -> None:
        lines.append(f"| {label} | " + " | ".join(_or_dash(read, c) for c in calls) + " |")

    row("main job: minutes", lambda c: f"{c['train_minutes']:g}")
    row("main job: steps", lambda c: f"{c['stages']['main job']['metrics']['steps']:,}")
    row("main job: precision", lambda c: c["stages"]["main job"]["metrics"]["precision"])
    row(
        "main job: median target tokens/s",
        lambda c: f"{c['stages']['main job']['metrics']['median_tokens_per_s']:,.0f}",
    )
    row("test2016 BLEU, greedy", lambda c: f"{c['stages']['test BLEU greedy']['bleu']:.2f}")
    row("test2016 BLEU, beam 5", lambda c: f"{c['stages']['test BLEU beam 5']['bleu']:.2f}")
    row(
        "bench_train eager: ours / best nn.Transformer",
        lambda c: f"{c['stages']['bench_train eager']['speedup_vs_best_reference']:.2f}x",
    )
    row("check's seconds in all", lambda c: f"{c['seconds']:.0f}")
    lines += [
        "",
        "Commands: " + "; ".join(f"call {i + 1}: `{c['command']}`" for i, c in enumerate(calls)),
    ]
    if b.get("note"):
        lines += ["", b["note"]]
    return "\n".join(lines)


def _gpu_line(env: dict[str, Any]) -> str:
    return (
        f"{env.get('gpu', '?')} (compute capability {env.get('gpu_capability', '?')}), "
        f"{env.get('cpu', '?')}, {env.get('threads', '?')} torch threads, "
        f"torch {env.get('versions', {}).get('torch', '?')}, CUDA {env.get('cuda', '?')}, "
        f"cuDNN {env.get('cudnn', '?')}; SDPA kernels on: {', '.join(env.get('sdpa_kernels', []))}"
    )


def _or_dash(read, call: dict[str, Any]) -> str:
    try:
        return read(call)
    except (KeyError, TypeError):
        return "—"


def device_check(name: str, b: dict[str, Any]) -> str:
    """``experiments/device_check.py``'s record: the machine, a row per stage (outcome,
    seconds against its deadline, what it found), then the rates of the precision arms, the
    profile's top operators and the README's commands."""
    stages = b["stages"]
    env = stages.get("env", {})
    lines = [f"### {name}", ""]
    if b.get("dry_run_on_cpu"):
        lines += ["**A dry run on the CPU: its numbers prove the check runs, nothing more.**", ""]
    lines += [
        _machine_line(env),
        "",
        f"Budget {b['budget_s']} s, the deadlines "
        + ", ".join(f"{k} {v}" for k, v in b["deadlines_s"].items())
        + f" s; {b.get('seconds', 0):.0f} s in all"
        + (f"; this call reran {', '.join(b['rerun'])}" if b.get("rerun") else "")
        + ".",
        "",
        "| stage | outcome | seconds (deadline) | what it found |",
        "|---|---|---:|---|",
    ]
    for stage, result in stages.items():
        found = result.get("why") or _or_dash(FINDINGS.get(stage, lambda r: "—"), result)
        seconds = (
            f"{result['seconds']:.0f} ({result['deadline_s']})" if "seconds" in result else "—"
        )
        lines.append(f"| {stage} | {result['status']} | {seconds} | {found} |")
    lines += _rates_table(stages.get("rates", {}))
    lines += _profile_table(stages.get("profile", {}))
    lines += _commands_table(stages.get("readme", {}), stages.get("torchrun", {}))
    lines += ["", f"Command: `{b['command']}`"] if b.get("command") else []
    return "\n".join(lines)


def _machine_line(env: dict[str, Any]) -> str:
    smi, host, e = env.get("nvidia_smi"), env.get("host", {}), env.get("environment", {})
    if isinstance(smi, dict):
        gpu = (
            f"{smi.get('name')} (driver {smi.get('driver_version')}; SM clock "
            f"{smi.get('clocks.sm')} of {smi.get('clocks.max.sm')}, power {smi.get('power.draw')}"
            f" of {smi.get('power.limit')})"
        )
    else:
        gpu = f"no GPU read by nvidia-smi ({smi or 'not asked'})"
    mhz = host.get("mhz_now", {}).get("median")
    versions = e.get("versions", {})
    missing = [m for m, found in env.get("imports", {}).items() if "error" in found]
    return (
        f"{gpu}; host {host.get('cpu', '?')}, {host.get('cpu_count', '?')} cores, "
        f"{'?' if mhz is None else f'{mhz:.0f}'} MHz now (max {host.get('lscpu CPU max MHz', '?')}), "
        f"load {', '.join(f'{x:.1f}' for x in host.get('load_average', [])) or '?'}; "
        f"torch {versions.get('torch', '?')}, CUDA {e.get('cuda', '—')}, cuDNN "
        f"{e.get('cudnn', '—')}, NCCL {e.get('nccl', '—')}; commit {commit_of(e)}; "
        + (f"not importable: {', '.join(missing)}" if missing else "every runtime import imported")
        + "."
    )


def _env_found(r: dict[str, Any]) -> str:
    missing = [m for m, found in r["imports"].items() if "error" in found]
    return f"CUDA {'available' if r.get('cuda') else 'not available'}; " + (
        f"missing {', '.join(missing)}" if missing else "imports all there"
    )


def _rates_found(r: dict[str, Any]) -> str:
    parts = [
        f"{arm} / {r['ratio_to']} {x['median']:.3f}× ({x['min']:.3f}–{x['max']:.3f}) over "
        f"{len(x['per_pair'])} pairs"
        for arm, x in r["ratios"].items()
    ]
    parts += [f"{arm} refused by the config" for arm in r.get("refused_arms", {})]
    if r.get("same_batches") is False:
        parts.append("**the arms' batches differed**")
    return "; ".join(parts) or "no whole pair"


def _profile_found(r: dict[str, Any]) -> str:
    s, sync = r["per_step"], r["sync_debug"]
    found = f"{r['precision']}: {r['ms_per_step_profiled']:.1f} ms a step profiled, "
    found += f"{s['aten_ops']:,.0f} aten ops a step"
    if not isinstance(r["top_device"], list):  # no GPU: the CPU's parts alone
        return found
    found += (
        f", GPU busy {s['device_ms']:.2f} ms a step, {s['kernel_launches']:,.0f} launches, "
        f"{s['syncs']:g} syncs, {s['memcpys']:g} copies a step"
    )
    if isinstance(sync, dict):
        found += f"; sync debug: {sync['per_step']:g} warnings a step"
        found += f" (first at {sync['sites'][0]['site']})" if sync["sites"] else ""
    return found


def _main_found(r: dict[str, Any]) -> str:
    m, util = r["metrics"], r.get("gpu_util", {})
    shown = f", GPU utilisation {util['mean']:.0f} % mean" if "mean" in util else ""
    bleu = m["best_valid_bleu"]
    return (
        f"{m['steps']:,} steps ({m['precision']}), best valid BLEU "
        f"{'—' if bleu is None else f'{bleu:.2f}'}, {m['median_tokens_per_s'] or 0:,.0f} target "
        f"tokens/s median{shown}"
    )


def _readme_found(r: dict[str, Any]) -> str:
    c = r["commands"]
    parts = []
    for name in ("evaluate greedy", "evaluate beam 5"):
        if "bleu" in c.get(name, {}):
            literature = c[name].get("bleu_lowercased_tokenized")
            scale = f" (literature scale {literature:.2f})" if literature is not None else ""
            parts.append(f"test BLEU {name.removeprefix('evaluate ')} {c[name]['bleu']:.2f}{scale}")
    serve = c.get("serve", {})
    if "startup_s" in serve:
        parts.append(f"serve up in {serve['startup_s']:.1f} s, {serve['status']}")
    load = c.get("seq2seq.load", {})
    if "load_s" in load:
        parts.append(
            f"load {load['load_s']:.1f} s, inspect {load['inspect_s']:.1f} s on {load['on']}"
        )
    passed = sum(x.get("status") == "passed" for x in c.values())
    return "; ".join([*parts, f"{passed} of {len(c)} commands passed"]) + f"; on {r['run']}"


def _torchrun_found(r: dict[str, Any]) -> str:
    c = r["commands"]
    train, nccl = c.get("train 20 steps", {}), c.get("NCCL calls, one rank", {})
    steps = _or_dash(lambda x: f"{x['metrics']['steps']} steps", train)
    calls = _or_dash(lambda x: f"{x['backend']} init {x['init_s']:.1f} s", nccl)
    return f"train {train.get('status', '—')} ({steps}); NCCL calls {nccl.get('status', '—')} ({calls})"


FINDINGS: dict[str, Callable[[dict[str, Any]], str]] = {
    "env": _env_found,
    "rates": _rates_found,
    "profile": _profile_found,
    "main": _main_found,
    "readme": _readme_found,
    "torchrun": _torchrun_found,
}


def _rates_table(r: dict[str, Any]) -> list[str]:
    """The arms: what each computes in, its median block rate, its ratio per pair."""
    if not r.get("median_tokens_per_s"):
        return []
    lines = [
        "",
        f"Rates: blocks of {r['sizes']['block']} steps after {r['sizes']['warmup']} warm-up "
        f"steps, each pair the arms forward then backward, on the same batches.",
        "",
        f"| arm | computes in | median target tokens/s | per pair, / {r['ratio_to']} |",
        "|---|---|---:|---|",
    ]
    for arm, rate in r["median_tokens_per_s"].items():
        ratios = r["ratios"].get(arm, {}).get("per_pair")
        shown = ", ".join(f"{x:.3f}" for x in ratios) if ratios else "—"
        lines.append(f"| {arm} | {r['arms'][arm]} | {rate:,.0f} | {shown} |")
    return lines


def _profile_table(r: dict[str, Any]) -> list[str]:
    """The five operators that take the most device time (CPU time without a GPU)."""
    rows = r.get("top_device") if isinstance(r.get("top_device"), list) else r.get("top_cpu")
    if not rows:
        return []
    lines = ["", "| operator (profile's top 5) | calls | self device ms | self CPU ms |"]
    lines.append("|---|---:|---:|---:|")
    lines += [
        f"| `{o['name']}` | {o['calls']:,} | {o['self_device_ms']:.2f} | {o['self_cpu_ms']:.2f} |"
        for o in rows[:5]
    ]
    return lines


def _commands_table(readme: dict[str, Any], torchrun: dict[str, Any]) -> list[str]:
    """Each README and torchrun command: its outcome and seconds."""
    commands = {**readme.get("commands", {}), **torchrun.get("commands", {})}
    if not commands:
        return []
    lines = ["", "| command | outcome | seconds |", "|---|---|---:|"]
    for name, c in commands.items():
        seconds = c.get("seconds", c.get("startup_s"))
        lines.append(
            f"| {name} | {c.get('status', '—')} | {_or_dash(lambda s: f'{s:.1f}', seconds)} |"
        )
    return lines
