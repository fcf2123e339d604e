"""Multi30k training speed before and after the store: the whole trainer of two checkouts.

The store changed the data path (the corpus read from disk, numpy index batches, a prefetch
thread, the clock agreed every ``log_every`` steps), with the goal that Multi30k training
speed stays within noise. This trains the default recipe for ``--steps`` steps with each checkout's
``seq2seq train`` in turn (``PYTHONPATH`` picks the code), alternating which goes first,
and reads the tokens/s the trainer logged after its first log interval (warm-up left
out), and its peak RSS where it logs one. Reported: each checkout's median over rounds and the median of the per-round ratios.

    git worktree add /tmp/before 03fedf9     # the commit before the store
    python experiments/scale/versions.py --before /tmp/before --threads 2 \\
        --json experiments/scale/versions.json
    python experiments/scale/versions.py --before . --after-env \\
        LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2     # the allocator alone
    python experiments/scale/versions.py --before . --quick   # seconds: the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from seq2seq.run.runlog import git_commit, machine  # noqa: E402
from seq2seq.training.curves import read_metrics  # noqa: E402

sys.path.insert(0, str(REPO / "experiments"))
from common import QUICK_MODEL  # noqa: E402

# Validation only at the end and on a few sentences: what is timed is the training steps.
SETTINGS = [
    "train.log_every=10",
    "train.valid_bleu_sentences=16",
    "train.attention_sentences=0",
    "train.average_last=0",
    "train.keep_last=1",
]
QUICK = [*QUICK_MODEL, "train.log_every=2"]


def train_once(
    code: Path, steps: int, settings: list[str], scratch: Path, extra_env: dict[str, str]
) -> tuple[float, float | None]:
    """Train once with the code in ``code``; the median tokens/s of its training log lines
    after the first (which includes the first steps' warm-up), and the peak RSS it logged
    (None from a checkout that logs none)."""
    run = scratch / "run"
    argv = ["--src", "de", "--tgt", "en", "--out", str(run), "--overwrite", "--no-progress"]
    argv += ["--max-steps", str(steps), *(a for s in settings for a in ("--set", s))]
    env = {**os.environ, **extra_env, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, "-m", "seq2seq", "train", *argv],
        env=env,
        cwd=scratch,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{code}: seq2seq train failed:\n{done.stderr[-2000:]}")
    trained = read_metrics(run).get("train", [])
    if len(trained) < 2:
        raise SystemExit(f"{code}: fewer than two training log lines; raise --steps")
    rate = statistics.median(r["tokens_per_s"] for r in trained[1:])
    return rate, trained[-1].get("peak_rss_mb")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--after", type=Path, default=REPO, help="default: this checkout")
    parser.add_argument(
        "--after-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable of the after side only (e.g. LD_PRELOAD=...: the same "
        "code with another allocator); repeatable",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60, help="steps per run (default: 60)")
    parser.add_argument("--threads", type=int, default=2, help="train.threads (default: 2)")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 rounds of 6 steps")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    settings = [*SETTINGS, f"train.threads={args.threads}"]
    if args.quick:
        args.rounds, args.steps, settings = 2, 6, [*SETTINGS, *QUICK, "train.threads=1"]
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    after_env = dict(kv.split("=", 1) for kv in args.after_env if "=" in kv)
    if len(after_env) != len(args.after_env):
        parser.error("--after-env takes NAME=VALUE")
    for name, code in sides.items():
        if not (code / "seq2seq" / "__init__.py").is_file():
            parser.error(f"--{name} {code}: not a seq2seq checkout (no seq2seq/__init__.py)")
    rates: dict[str, list[float]] = {name: [] for name in sides}
    peaks: dict[str, list[float | None]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                extra = after_env if name == "after" else {}
                rate, peak = train_once(sides[name], args.steps, settings, Path(scratch), extra)
                rates[name].append(rate)
                peaks[name].append(peak)
            print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:,.0f}" for n in sides))
    ratios = [a / b for a, b in zip(rates["after"], rates["before"], strict=True)]
    result = {
        "tokens_per_s": {name: statistics.median(v) for name, v in rates.items()},
        "each_round": rates,
        "peak_rss_mb_each_round": peaks,
        "ratio_after_before": statistics.median(ratios),
        "ratios": ratios,
        "steps": args.steps,
        "settings": settings,
        "checkouts": {name: git_commit(code) for name, code in sides.items()},
        "after_env": after_env,
        "machine": machine(),
        "command": [Path(sys.argv[0]).as_posix(), *sys.argv[1:]],
    }
    print(
        f"tokens/s, median of {args.rounds} rounds: before {result['tokens_per_s']['before']:,.0f}, "
        f"after {result['tokens_per_s']['after']:,.0f}; after/before {result['ratio_after_before']:.3f} "
        f"(per round {min(ratios):.3f}–{max(ratios):.3f})"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
