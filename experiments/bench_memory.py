"""Memory through a training run: the process's peak and current resident memory at two step
counts of the default recipe, so that a growth that goes on after the warm-up shows the day it
comes.

The trainer's own loop runs (``Trainer.train_epoch``: the dropout schedule, the prefetching
thread, the step, the log), on Multi30k with the default recipe, without the validations (a
validation's decoding has memory of its own, and issue 59 saw the growth between them). The
peak rises while the longest batches come for the first time, then should level off: the
record gives the peak's MB a step between the two counts, where a leak shows. Take both counts
past the warm-up (issue 59 compared steps 300 and 800).

    python experiments/bench_memory.py --threads 1 --at 300 800 --json bench_memory.json
    python experiments/bench_memory.py --quick     # seconds: proves the script runs
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # tests/ for the tiny run's settings

from helpers import TINY_RUN  # noqa: E402

from seq2seq.config import load_config  # noqa: E402
from seq2seq.run.precision import describe_precision  # noqa: E402
from seq2seq.run.runlog import machine  # noqa: E402
from seq2seq.run.runtime import setup_runtime  # noqa: E402
from seq2seq.training.trainer import Trainer  # noqa: E402

NO_VALIDATION = "train.validate_every=1000000000"  # steps: never within a bench


def resident_mb() -> dict[str, float]:
    """This process's resident memory now and at its peak (Linux's /proc; the peak alone
    elsewhere)."""
    sizes = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10}
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes["rss_mb"] = int(line.split()[1]) / 2**10
    return sizes


def train_and_measure(trainer: Trainer, at: list[int]) -> dict[int, dict[str, float]]:
    """Train to the last of ``at`` through the trainer's own epochs; the memory at each."""
    seen: dict[int, dict[str, float]] = {}
    after_step = trainer.after_step

    def measured(*args: object) -> None:
        after_step(*args)
        if trainer.state.step in at:
            seen[trainer.state.step] = {**resident_mb(), "clock_s": time.perf_counter()}

    trainer.after_step = measured
    trainer.model.train()
    while trainer.state.stop_reason is None:
        trainer.train_epoch()
    trainer.log.close()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", type=int, nargs=2, default=[300, 800], metavar="STEP")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--set", action="append", default=[], help="a config override")
    parser.add_argument("--quick", action="store_true", help="the tiny run, steps 5 and 10")
    parser.add_argument("--json", type=Path, help="also write the record here")
    args = parser.parse_args()
    if args.quick:
        args.at = [5, 10]
    first, last = sorted(args.at)
    if not 0 < first < last:
        parser.error("--at takes two different positive step counts")
    overrides = [*(TINY_RUN if args.quick else []), *args.set]
    config = load_config(None, [*overrides, f"train.max_steps={last}", NO_VALIDATION])
    runtime = setup_runtime("cpu", args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(config, Path(run_dir), runtime, False, False, False)
        seen = train_and_measure(trainer, [first, last])
    growth = (seen[last]["peak_rss_mb"] - seen[first]["peak_rss_mb"]) / (last - first)
    seconds = (seen[last].pop("clock_s") - seen[first].pop("clock_s")) / (last - first)
    result = {
        "benchmark": "training-memory",
        "environment": machine(),
        "command": sys.argv,
        "quick": args.quick,
        "overrides": overrides,
        "model_config": vars(config.model),
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "precision": describe_precision(config.train.precision, trainer.dtype, runtime.device),
        "steps": [first, last],
        "memory": {str(step): seen[step] for step in (first, last)},
        "peak_growth_mb_per_step": growth,
        "seconds_per_step": seconds,  # between the two counts: the machine's load moves it
    }
    for step in (first, last):
        sizes = ", ".join(f"{k} {v:,.0f}" for k, v in seen[step].items())
        print(f"step {step}: {sizes}")
    print(
        f"peak growth from step {first} to {last}: {growth:.3f} MB a step, {seconds:.3f} s a step"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
