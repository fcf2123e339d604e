"""The device check's two in-process measurements of the trainer's own step (``device_check.py``
runs each in a child of its own): paired rates of the precisions ``train.precision`` accepts,
and a profile of 20 steps.

Both drive ``Trainer.train_step`` as ``Trainer.train_epoch`` does (a ``Prefetcher`` padding
the batches ahead, the dropout set, one step per group of batches), with TF32 switched as
``Trainer.run`` switches it, so that a rate here is the trainer's, not a bench's.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.bench_train import synchronize
from seq2seq.config import Config, config_from_dict, dropout_at, given_values
from seq2seq.data.batching import Prefetcher
from seq2seq.errors import Seq2SeqError
from seq2seq.run.precision import matmul_precision, precision_name
from seq2seq.run.runtime import Runtime
from seq2seq.training.trainer import Trainer

# The first is the baseline of the ratios; "-graphs": the step captured (train.cuda_graphs).
ARMS = ("tf32", "bf16", "fp16", "tf32-graphs", "bf16-graphs")
# Kernel launches and host waits, by the CUDA runtime and driver calls the profiler sees.
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel")
SYNCS = ("Synchronize",)  # cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize


def stage_config(overrides: list[str]) -> Config:
    """A config as ``seq2seq train --set`` builds it; a value it refuses raises Seq2SeqError."""
    return config_from_dict(given_values(None, overrides, None))


def trainer_for(config: Config, run_dir: Path, runtime: Runtime) -> Trainer:
    """A Trainer in ``run_dir``, its model in training mode, as ``Trainer.run`` leaves it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(config, run_dir, runtime, resume=False, tensorboard=False, progress=False)
    trainer.model.train()
    return trainer


def step_groups(trainer: Trainer, n: int) -> list[list[np.ndarray]]:
    """The first ``n`` steps' groups of batches of epoch 0, cycled if the epoch is shorter."""
    batches, per = trainer.sampler.batches(0), trainer.batches_per_step()
    groups = [batches[i : i + per] for i in range(0, len(batches) - per + 1, per)]
    return [groups[i % len(groups)] for i in range(n)]


def train_steps(trainer: Trainer, groups: list[list[np.ndarray]]) -> tuple[int, int, float]:
    """``groups`` stepped as ``train_epoch`` steps them; the target tokens, the steps skipped
    for a non-finite loss or gradient, and the last step's loss."""
    t, tokens, skipped, loss = trainer.config.train, 0, 0, math.nan
    trainer.model.set_dropout(dropout_at(trainer.config, 0.0))
    with Prefetcher(trainer.my_batches, groups, t.prefetch) as ready:
        for group, mine in zip(groups, ready, strict=False):
            loss, n_tokens = trainer.take_step(group, mine)  # a captured step's loss: None
            tokens, skipped = tokens + n_tokens, skipped + (loss is not None and math.isnan(loss))
    if trainer.graphs is not None:  # read once, at the end: the last loss, the device's skips
        loss, on_device = trainer.graphs.read()
        skipped += on_device
    return tokens, skipped, loss


def same_groups(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> bool:
    """Whether two lists of steps' groups hold the same batches (pair indices) in order."""
    flat_a, flat_b = [x for g in a for x in g], [x for g in b for x in g]
    return len(flat_a) == len(flat_b) and all(map(np.array_equal, flat_a, flat_b))


def timed_block(trainer: Trainer, groups: list[list[np.ndarray]]) -> dict[str, Any]:
    """``groups`` stepped between two synchronisations: target tokens a second."""
    device = trainer.runtime.device
    with matmul_precision(trainer.config.train.precision, device):
        synchronize(device)
        began = time.perf_counter()
        tokens, skipped, loss = train_steps(trainer, groups)
        synchronize(device)
        seconds = time.perf_counter() - began
    return {
        "steps": len(groups),
        "seconds": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds, 1),
        "skipped_steps": skipped,
        # every arm trains from the same weights on the same batches: a captured arm's loss
        # beside its eager arm's says whether it trains the same (up to dropout's masks)
        "last_loss": round(loss, 4) if loss is not None else None,
    }


# -- stage 1: paired rates ------------------------------------------------------------------


def precision_arms(
    overrides: list[str], arms: tuple[str, ...] = ARMS
) -> tuple[dict[str, Config], dict[str, str]]:
    """Each arm's config (``train.precision=ARM`` over ``overrides``; ``ARM-graphs`` with
    ``train.cuda_graphs=true`` too), and the arms the config refuses, with its message: an arm
    joins once ``train.precision`` accepts it."""
    accepted, refused = {}, {}
    for arm in arms:
        precision, _, graphs = arm.partition("-")
        settings = [f"train.precision={precision}"] + ["train.cuda_graphs=true"] * bool(graphs)
        try:
            accepted[arm] = stage_config([*overrides, *settings])
        except Seq2SeqError as e:
            refused[arm] = str(e)
    return accepted, refused


def abba_order(arms: list[str], pairs: int) -> list[tuple[int, str]]:
    """(pair, arm) blocks: each pair runs the arms forward then backward (A B B A with two
    arms, A B C C B A with three), so that a drift of the machine's speed over a pair weighs
    on every arm alike."""
    return [(p, arm) for p in range(pairs) for arm in [*arms, *reversed(arms)]]


def rates_summary(blocks: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Per arm the median block rate; per pair each arm's mean rate over its two blocks, and
    its ratio to the first arm's (the baseline) in the same pair, with their median and
    range over the whole pairs so far."""
    by_pair: dict[int, dict[str, list[float]]] = {}
    for b in blocks:
        by_pair.setdefault(b["pair"], {}).setdefault(b["arm"], []).append(b["tokens_per_s"])
    whole = {p: r for p, r in by_pair.items() if all(len(r.get(a, [])) == 2 for a in arms)}
    pairs = [
        {"pair": p, **{a: statistics.fmean(r[a]) for a in arms}} for p, r in sorted(whole.items())
    ]
    base = arms[0]
    ratios = {a: [row[a] / row[base] for row in pairs] for a in arms[1:]}
    return {
        "median_tokens_per_s": {
            a: statistics.median(b["tokens_per_s"] for b in blocks if b["arm"] == a)
            for a in arms
            if any(b["arm"] == a for b in blocks)
        },
        "pairs": pairs,
        "ratio_to": base,
        "ratios": {
            a: {
                "per_pair": [round(x, 4) for x in r],
                "median": round(statistics.median(r), 4),
                "min": round(min(r), 4),
                "max": round(max(r), 4),
            }
            for a, r in ratios.items()
            if r
        },
    }


def rates_stage(
    overrides: list[str],
    scratch: Path,
    runtime: Runtime,
    sizes: dict[str, int],
    write: Callable[[dict], None],
) -> None:
    """Stage 1: a Trainer per accepted precision arm, in one process, on the same batches:
    warmed up, then ``sizes["pairs"]`` mirrored pairs of blocks of ``sizes["block"]`` steps.
    ``write`` gets the result after every block."""
    configs, refused = precision_arms(overrides)
    found: dict[str, Any] = {"refused_arms": refused, "sizes": sizes, "arms": {}, "blocks": []}
    trainers = {}
    for arm, config in configs.items():
        try:  # a captured arm is refused where the step cannot be captured (a CPU)
            trainers[arm] = trainer_for(config, scratch / "rates" / arm, runtime)
        except Seq2SeqError as e:
            refused[arm] = str(e)
            continue
        named = precision_name(arm.partition("-")[0], trainers[arm].dtype, runtime.device)
        found["arms"][arm] = named + (", captured" if trainers[arm].graphs else "")
    write(found)
    arms = list(trainers)
    warm, block = sizes["warmup"], sizes["block"]
    groups = {a: step_groups(t, warm + sizes["pairs"] * block) for a, t in trainers.items()}
    # the same store and seed in every arm: the same batches, checked
    found["same_batches"] = all(same_groups(groups[arms[0]], g) for g in groups.values())
    for arm in arms:
        timed_block(trainers[arm], groups[arm][:warm])
    for pair, arm in abba_order(arms, sizes["pairs"]):
        steps = groups[arm][warm + pair * block : warm + (pair + 1) * block]
        found["blocks"].append({"pair": pair, "arm": arm, **timed_block(trainers[arm], steps)})
        found.update(rates_summary(found["blocks"], arms))
        write(found)


# -- stage 2: a profile ---------------------------------------------------------------------


def top_rows(averages: Any, key: str, n: int = 20) -> list[dict[str, Any]]:
    """The ``n`` operators that take the most ``key`` time (self CPU or self device)."""
    rows = sorted(averages, key=lambda e: -getattr(e, key))[:n]
    return [
        {
            "name": e.key,
            "calls": e.count,
            "self_cpu_ms": round(e.self_cpu_time_total / 1000, 3),
            "self_device_ms": round(e.self_device_time_total / 1000, 3),
        }
        for e in rows
    ]


def step_counts(events: Any, steps: int) -> dict[str, float]:
    """Per step: operators, kernel launches, host waits for the device and memory copies
    (CUDA runtime calls the profiler saw), and the device time of what ran on the GPU
    (kernels, copies, fills): the floor of a step that no host work would slow."""
    names = Counter(e.name for e in events)
    device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]

    def per_step(marks: tuple[str, ...]) -> float:
        return sum(c for n, c in names.items() if any(m in n for m in marks)) / steps

    return {
        "aten_ops": sum(c for n, c in names.items() if n.startswith("aten::")) / steps,
        "kernel_launches": per_step(LAUNCHES),
        # less the one synchronize that closes the profiled block
        "syncs": max(0.0, per_step(SYNCS) - 1 / steps),
        "memcpys": per_step(("cudaMemcpy",)),
        "device_events": len(device) / steps,
        "device_ms": sum(e.time_range.elapsed_us() for e in device) / 1000 / steps,
    }


def sync_warnings(trainer: Trainer, groups: list[list[np.ndarray]]) -> dict[str, Any]:
    """``groups`` stepped under ``torch.cuda.set_sync_debug_mode("warn")``: each operation
    that made the host wait for the device warns; their count and where they came from."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with matmul_precision(trainer.config.train.precision, trainer.runtime.device):
                train_steps(trainer, groups)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught)
    return {
        "steps": len(groups),
        "warnings": len(caught),
        "per_step": len(caught) / len(groups),
        "sites": [{"site": s, "count": c} for s, c in sites.most_common(10)],
        "first": str(caught[0].message).splitlines()[0] if caught else None,
    }


def profile_stage(
    config: Config,
    scratch: Path,
    runtime: Runtime,
    sizes: dict[str, int],
    out: Path,
    write: Callable[[dict], None],
) -> None:
    """Stage 2: one Trainer at ``config``'s precision, warmed up, then torch.profiler over
    ``sizes["steps"]`` steps (CPU, and CUDA on a GPU) and, on a GPU, ``sizes["sync_steps"]``
    steps under sync debug mode. The top-20 tables are written into ``out`` too; ``write``
    gets the step's time first, before the profile's events are read (seconds on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    trainer = trainer_for(config, scratch / "profile", runtime)
    cuda = runtime.device.type == "cuda"
    warm, steps = sizes["warmup"], sizes["steps"]
    groups = step_groups(trainer, warm + steps + sizes["sync_steps"])
    timed_block(trainer, groups[:warm])
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        block = timed_block(trainer, groups[warm : warm + steps])
    found: dict[str, Any] = {
        "precision": precision_name(config.train.precision, trainer.dtype, runtime.device),
        "steps": steps,
        "ms_per_step_profiled": round(1000 * block["seconds"] / steps, 3),
        "tokens_per_s_profiled": block["tokens_per_s"],
    }
    write(found)
    averages = prof.key_averages()
    found["per_step"] = step_counts(prof.events(), steps)
    found["top_cpu"] = top_rows(averages, "self_cpu_time_total")
    out.mkdir(parents=True, exist_ok=True)
    sorts = ["self_cpu_time_total", *(["self_device_time_total"] if cuda else [])]
    for sort in sorts:
        (out / f"top20_{sort}.txt").write_text(averages.table(sort_by=sort, row_limit=20))
    if cuda:
        found["top_device"] = top_rows(averages, "self_device_time_total")
        found["sync_debug"] = sync_warnings(trainer, groups[warm + steps :])
    else:
        found["top_device"] = found["sync_debug"] = "skipped (no cuda)"
    write(found)
