"""Feeding the training step: batches gathered and padded ahead of it on a thread
(``train.prefetch``, the default 2) against in the training thread (``train.prefetch=0``).

The trainer's own pieces run the loop (``Trainer.my_batches`` into ``Prefetcher`` into
``Trainer.train_step``) on Multi30k with the default recipe, interleaved: each round trains
the same steps' batches once each way, alternating which goes first, and the median over
rounds is reported with the median of the per-round ratios. On a CPU the two should tie:
padding a batch costs well under 1% of a step, and the thread only moves that cost off the
step's path. On CUDA the thread also pins the batches, so that copies overlap the step.

    python experiments/bench_feed.py --threads 2 --json bench_feed.json
    python experiments/bench_feed.py --quick     # seconds: proves the script runs

With ``--subword-alpha A`` it times subword sampling instead (``data.subword_alpha``): the
seconds to sample one epoch, and the step on sampled batches while the worker samples the
next epoch against the same steps with no worker running, interleaved the same way.

    python experiments/bench_feed.py --threads 2 --subword-alpha 0.1 --json bench_subword.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from seq2seq.config import load_config  # noqa: E402
from seq2seq.data.batching import Prefetcher  # noqa: E402
from seq2seq.run.runlog import machine  # noqa: E402
from seq2seq.run.runtime import setup_runtime  # noqa: E402
from seq2seq.training.trainer import Trainer  # noqa: E402

QUICK = [
    "data.data=sample",
    "data.vocab_size=300",
    "model.d_model=32",
    "model.n_heads=4",
    "model.d_ff=64",
    "model.n_enc_layers=1",
    "model.n_dec_layers=1",
    "data.max_tokens=160",
]


def seconds_per_step(trainer: Trainer, groups: list, ahead: int) -> float:
    began = time.perf_counter()
    with Prefetcher(trainer.my_batches, groups, ahead) as ready:
        for group, mine in zip(groups, ready, strict=True):
            trainer.train_step(group, mine)
    return (time.perf_counter() - began) / len(groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=8, help="steps per setting per round")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 rounds of 2 steps")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--subword-alpha", type=float, help="time subword sampling at this alpha")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 2
    if args.subword_alpha:
        return bench_subwords(args)
    config = load_config(None, [*(QUICK if args.quick else []), "train.max_steps=1"])
    runtime = setup_runtime("cpu", args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(config, Path(run_dir), runtime, False, False, False)
        batches = trainer.sampler.batches(0)
        per_step = trainer.batches_per_step()
        groups = [batches[i : i + per_step] for i in range(0, len(batches), per_step)]
        seconds_per_step(trainer, groups[: args.steps], 0)  # warm-up
        times: dict[int, list[float]] = {0: [], 2: []}
        for r in range(args.rounds):
            chunk = groups[(r + 1) * args.steps : (r + 2) * args.steps] or groups[: args.steps]
            for ahead in (0, 2) if r % 2 == 0 else (2, 0):
                times[ahead].append(seconds_per_step(trainer, chunk, ahead))
    ratios = [b / a for a, b in zip(times[0], times[2], strict=True)]
    result = {
        "benchmark": "feed",
        "environment": machine(),
        "command": sys.argv,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "ms_per_step": {f"prefetch {k}": 1000 * statistics.median(v) for k, v in times.items()},
        "ratio_prefetch_2_over_0": statistics.median(ratios),
        "ratios": ratios,
    }
    for name, ms in result["ms_per_step"].items():
        print(f"{name}: {ms:.1f} ms/step (median of {args.rounds} rounds)")
    print(f"prefetch 2 / prefetch 0: {result['ratio_prefetch_2_over_0']:.3f} (median ratio)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def bench_subwords(args: argparse.Namespace) -> None:
    """The step with an epoch being sampled beside it, against the step alone."""
    sampling = [f"data.subword_alpha={args.subword_alpha}", "data.subword_epochs=[0,0]"]
    quick = [o for o in QUICK if not o.startswith("data.vocab_size")] + ["data.vocab_size=400"]
    overrides = [*(quick if args.quick else []), *sampling, "train.max_steps=1"]
    config = load_config(None, overrides)
    runtime = setup_runtime("cpu", args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(config, Path(run_dir), runtime, False, False, False)
        began = time.perf_counter()
        trainer.use_pairs(trainer.epoch_pairs())  # epoch 0, sampled before it starts
        sample_s = time.perf_counter() - began
        trainer.subwords.__exit__()  # sampling epoch 0 started epoch 1's worker: stop it
        groups = [[b] for b in trainer.sampler.batches(0)]
        seconds_per_step(trainer, groups[: args.steps], 2)  # warm-up
        times: dict[str, list[float]] = {"alone": [], "sampling beside": []}
        for r in range(args.rounds):
            chunk = groups[(r + 1) * args.steps : (r + 2) * args.steps] or groups[: args.steps]
            for name in ("alone", "sampling beside")[:: 1 if r % 2 == 0 else -1]:
                if name == "sampling beside":
                    trainer.subwords._start(r + 1, args.subword_alpha)
                times[name].append(seconds_per_step(trainer, chunk, 2))
                trainer.subwords.__exit__()
    ratios = [b / a for a, b in zip(times["alone"], times["sampling beside"], strict=True)]
    result = {
        "benchmark": "feed, subword sampling",
        "environment": machine(),
        "command": sys.argv,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "pairs": len(trainer.data.train),
        "sample_epoch_s": sample_s,
        "ms_per_step": {k: 1000 * statistics.median(v) for k, v in times.items()},
        "ratio_sampling_over_alone": statistics.median(ratios),
        "ratios": ratios,
    }
    print(f"sampling one epoch of {result['pairs']:,} pairs: {sample_s:.1f} s")
    for name, ms in result["ms_per_step"].items():
        print(f"{name}: {ms:.1f} ms/step (median of {args.rounds} rounds)")
    print(f"sampling beside / alone: {result['ratio_sampling_over_alone']:.3f} (median ratio)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
