"""Dropout's masks, A/B: ``layers.Dropout`` (16 random bits an element, a boolean mask kept for
backward) against ``F.dropout`` (``nn.Dropout`` in its place), on the default recipe.

``memory``: each mask trains the same batches from the same weights and seed in a fresh
process (peak RSS is a high-water mark, so one process per mask); the record has its peak
resident memory (what the trainer logs as ``peak_rss_mb``) and the largest number of bytes
one step keeps for backward. Memory does not depend on the machine's load: one run does.

``time``: both masks train in one process, interleaved: each round runs a few steps of each,
alternating the order, each from the same seed; the median step time over rounds is reported.
Timing wants an idle machine.

    python experiments/bench_masks.py memory --json experiments/results/NAME/benchmark.json
    python experiments/bench_masks.py time --threads 2 --json bench_masks_time.json
    python experiments/bench_masks.py time --quick      # seconds: proves the script runs
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.bench_train import (  # noqa: E402
    QUICK,
    Trainee,
    count,
    prepare_batches,
    write_record,
)
from seq2seq.config import dropout_at, load_config  # noqa: E402
from seq2seq.model.dropout import Dropout  # noqa: E402
from seq2seq.model.transformer import build_model  # noqa: E402
from seq2seq.run.precision import autocast_dtype  # noqa: E402
from seq2seq.run.runtime import peak_memory  # noqa: E402

MASKS = ("layers.Dropout", "F.dropout")


def with_mask(model: nn.Module, mask: str) -> nn.Module:
    """``model`` itself for ``layers.Dropout``; a copy (the same weights) whose ``layers.Dropout``
    modules are ``nn.Dropout`` of the same p for ``F.dropout``."""
    if mask == MASKS[0]:
        return model
    other = copy.deepcopy(model)
    for module in list(other.modules()):
        for name, child in module.named_children():
            if isinstance(child, Dropout):
                setattr(module, name, nn.Dropout(child.p))
    return other


def saved_bytes(trainee: Trainee, batch) -> int:
    """Bytes that one training step of ``trainee`` keeps for its backward: each storage once,
    the parameters' among them."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainee.step(batch)
    return sum(storages.values())


def recipe(args: argparse.Namespace):
    """The default recipe's config (``--quick``: a tiny model) and its autocast dtype here."""
    config = load_config(None, (QUICK if args.quick else []) + args.overrides)
    precision = config.train.precision if args.precision == "auto" else args.precision
    return config, autocast_dtype(precision, torch.device("cpu"))


def seeded_model(config) -> nn.Module:
    """The model from seed 0, its dropout where the recipe starts."""
    torch.manual_seed(0)
    model = build_model(config.model)
    model.set_dropout(dropout_at(config, 0))
    return model


def measure_memory(args: argparse.Namespace) -> dict:
    """One mask (``args.mask``) trains the saved batches once; its peaks, as one JSON line."""
    config, dtype = recipe(args)
    saved = torch.load(args.child, weights_only=False)
    config.model.src_vocab_size, config.model.tgt_vocab_size = saved["vocab"]
    trainee = Trainee(args.mask, with_mask(seeded_model(config), args.mask), config, dtype)
    torch.manual_seed(1)
    most = max(saved_bytes(trainee, batch) for batch in saved["batches"])
    return {"mask": args.mask, "saved_mb": most / 2**20, **peak_memory(torch.device("cpu"))}


def memory(args: argparse.Namespace, config, batches) -> dict:
    """Each mask in its own process, on the same batches, the same command otherwise."""
    path = Path(tempfile.mkdtemp(prefix="bench-masks-")) / "batches.pt"
    vocab = (config.model.src_vocab_size, config.model.tgt_vocab_size)
    torch.save({"batches": batches, "vocab": vocab}, path)
    found = []
    for mask in MASKS:
        command = [sys.executable, __file__, "memory", "--child", str(path), "--mask", mask]
        command += ["--precision", args.precision] + ["--quick"] * args.quick
        command += [f"--set={o}" for o in args.overrides]
        command += ["--threads", str(args.threads)] if args.threads else []
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        found.append(json.loads(out.strip().splitlines()[-1]))
        print(f"{mask}: {found[-1]}", file=sys.stderr)
    return {"steps": len(batches), "masks": found}


def timing(args: argparse.Namespace, config, batches, dtype, model) -> dict:
    """Median ms a step of each mask, interleaved rounds from the same seed each."""
    trainees = [Trainee(mask, with_mask(model, mask), config, dtype) for mask in MASKS]
    for trainee in trainees:  # the same untimed warm-up step
        torch.manual_seed(0)
        trainee.step(batches[0])
    timed = batches[1:]
    for r in range(args.rounds):
        chunk = timed[r * args.steps : (r + 1) * args.steps]
        for trainee in trainees if r % 2 == 0 else trainees[::-1]:
            torch.manual_seed(r)
            trainee.step_times.append(statistics.mean(trainee.step(b) for b in chunk))
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{t.name} {1000 * t.step_times[-1]:.0f} ms" for t in trainees),
            file=sys.stderr,
        )
    results = {
        t.name: {
            "ms_per_step": 1000 * statistics.median(t.step_times),
            "ms_per_step_min": 1000 * min(t.step_times),
            "ms_per_step_max": 1000 * max(t.step_times),
            "final_loss": t.losses[-1],
        }
        for t in trainees
    }
    ratio = results[MASKS[1]]["ms_per_step"] / results[MASKS[0]]["ms_per_step"]
    return {
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "masks": results,
        "f_dropout_over_layers_dropout": ratio,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measure", choices=("memory", "time"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5, help="steps per mask per round")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps")
    parser.add_argument("--json", type=Path, help="also write the record here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # batches to measure
    parser.add_argument("--mask", choices=MASKS, default=MASKS[0], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 2, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(measure_memory(args)))
        return
    config, dtype = recipe(args)
    args.run, args.data, args.src, args.tgt = "", "multi30k", "de", "en"
    args.warmup, args.compile_warmup, args.captured = 1, 0, False  # what prepare_batches reads
    batches, tokenizer, source = prepare_batches(args, config)
    c = config.model
    c.src_vocab_size, c.tgt_vocab_size = tokenizer.src_vocab_size, tokenizer.tgt_vocab_size
    model = seeded_model(config)
    if args.measure == "memory":
        fields = memory(args, config, batches)
    else:
        fields = timing(args, config, batches, dtype, model)
    print(json.dumps(fields, indent=2))
    if args.json:
        kind = f"masks-{args.measure}"
        write_record(
            args.json, kind, args, config, source, count(model.parameters()), dtype, fields
        )


if __name__ == "__main__":
    main()
