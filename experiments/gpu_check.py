"""Everything on a GPU in one short call, inside a lent machine's minutes: the device and the
kernels in force, the CUDA-marked tests, the README's main job for two minutes with its test
BLEU (greedy and beam 5), decoding on the GPU against the CPU, and bench_train at the default
shape (eager; compiled when time is left).

Each stage runs in a child process of its own with a deadline; one that fails or runs out
of time is recorded as such and the next stage goes on. The JSON record is rewritten after
every stage, so whatever ran comes back even when the call is cut short; a one-screen
summary ends the run.

    PYTHONPATH=. python experiments/gpu_check.py --json OUT/gpu_check.json
    python experiments/gpu_check.py --cpu --json /tmp/gpu_check.json   # the plumbing, on CPU

It runs from a checkout on a GPU machine's own PyTorch; a stage that needs a package that
is not installed there says so in its record. Without a GPU (and without ``--cpu``) it
says so in one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from experiments.stages import (  # noqa: E402
    Stage,
    dry_run,
    run_stages,
    scores,
    training_summary,
    write_json,
)

TOTAL_SECONDS = 360  # the whole check: a lent machine's 15 minutes hold it and a rerun
SAMPLE = REPO / "data" / "sample"


def environment(device: str) -> dict:
    """The machine (versions included), the accelerator, and the attention kernels the runtime
    turns on."""
    from seq2seq.run.runlog import accelerator, machine
    from seq2seq.run.runtime import setup_runtime

    runtime = setup_runtime(device)
    return {
        **machine(),
        "device": str(runtime.device),
        **accelerator(runtime.device),
    }


def decoding_stage(run_dir: Path, device: str, out: Path) -> None:
    """Greedy and beam 4 outputs of the trained model on ``device`` and on the CPU."""
    import dataclasses

    import torch

    from seq2seq.decoding.load import load_run
    from seq2seq.decoding.translate import translate_ids
    from seq2seq.run.runtime import setup_runtime

    where = setup_runtime(device).device
    config, tokenizer, model = load_run(run_dir)
    source = SAMPLE / f"valid.{config.data.src}"  # German sentences, for a de-en run
    lines = source.read_text(encoding="utf-8").splitlines()[:16]
    sentences = [tokenizer.encode(line, "src") for line in lines]
    found = {}
    for beam in (1, 4):
        decode = dataclasses.replace(config.decode, beam=beam, nbest=1)
        hyps = {}
        for device_here in (torch.device("cpu"), where):
            hyps[device_here.type] = translate_ids(
                model.to(device_here), sentences, decode, device=device_here
            )
        cpu, other = hyps["cpu"], hyps[where.type]
        same = sum(a.tokens == b.tokens for a, b in zip(cpu, other, strict=True))
        gap = max(abs(a.score - b.score) for a, b in zip(cpu, other, strict=True))
        found[f"beam {beam}"] = {"same_outputs": same, "of": len(cpu), "max_score_gap": gap}
    out.write_text(json.dumps(found, indent=2) + "\n")


def stages(args: argparse.Namespace, scratch: Path) -> list[Stage]:
    python, device = sys.executable, "cpu" if args.cpu else "cuda"
    run = scratch / "main-job"
    tiny = [x for s in dry_run() for x in ("--set", s)] if args.cpu else []
    budget = ["--max-time", str(args.train_minutes)] if not args.cpu else []
    train = [python, "-m", "seq2seq", "train", "--src", "de", "--tgt", "en", "--out", str(run)]
    evaluate = [python, "-m", "seq2seq", "evaluate", str(run), "--split", "test"]
    bench = [python, "experiments/bench_train.py", "--device", device, "--rounds", "3"]
    bench += ["--quick"] if args.cpu else []
    tests = [python, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
    tests += ["-o", "addopts=", "-m", "cuda", "tests/"]
    me = [python, __file__, "--stage"]
    train_deadline = 150 if args.cpu else int(args.train_minutes * 60) + 60
    found = [
        Stage("cuda tests", [*tests, *(["--collect-only"] if args.cpu else [])], 90),
        Stage(
            "main job",
            [*train, "--device", device, "--no-progress", *budget, *tiny],
            train_deadline,
            read=lambda: {"metrics": training_summary(run)},
        ),
        *[
            Stage(
                f"test BLEU {name}",
                [*evaluate, "--device", device, "--beam", beam, "-o", str(scratch / f"{file}.txt")],
                60,
                read=lambda file=file: scores(scratch / f"{file}.json"),
                needs=["main job"],
            )
            for name, beam, file in (("greedy", "1", "greedy"), ("beam 5", "5", "beam5"))
        ],
        Stage(
            "decoding GPU = CPU",
            [
                *me,
                "decoding",
                "--run",
                str(run),
                "--device",
                device,
                "--json",
                str(scratch / "dec.json"),
            ],
            60,
            read=lambda: json.loads((scratch / "dec.json").read_text()),
            needs=["main job"],
        ),
        Stage(
            "bench_train eager",
            [*bench, "--json", str(scratch / "bench_eager.json")],
            120,
            read=lambda: bench_summary(scratch / "bench_eager.json"),
        ),
    ]
    if not args.cpu:
        found.append(
            Stage(
                "bench_train compiled",
                [
                    *bench,
                    "--compile",
                    "--compiled",
                    "whole",
                    "--json",
                    str(scratch / "bench_c.json"),
                ],
                240,
                read=lambda: bench_summary(scratch / "bench_c.json"),
            )
        )
    if args.fail:
        found.insert(
            0, Stage(f"made to fail: {args.fail}", [python, "-c", "raise SystemExit(3)"], 10)
        )
    return found


def bench_summary(path: Path) -> dict:
    record = json.loads(path.read_text())
    keep = ("model", "tokens_per_s", "ms_per_step", "profiler_events_per_step", "warmup_seconds")
    return {
        "speedup_vs_best_reference": record["speedup_vs_best_reference"],
        "precision": record["precision"],
        "results": [{k: r[k] for k in keep if k in r} for r in record["results"]],
    }


def keep(scratch: Path, into: Path) -> None:
    """The stages' records, logs and configs so far, without weights or the data store."""
    import shutil

    skip = shutil.ignore_patterns("*.safetensors", "data", "checkpoints", "*.model", "*.png")
    shutil.copytree(scratch, into, ignore=skip, dirs_exist_ok=True)


def summary(record: dict) -> str:
    lines = [
        f"gpu_check on {record['environment'].get('gpu', record['environment'].get('device'))}"
    ]
    for name, result in record["stages"].items():
        lines.append(f"  {name:24} {result['status']:10} {result.get('seconds', 0):6.1f} s")
    job = record["stages"].get("main job", {}).get("metrics")
    if job:
        lines.append(
            f"main job: {job['steps']} steps, best valid BLEU {job['best_valid_bleu']}, "
            f"{job['median_tokens_per_s']} tokens/s"
        )
    for name in ("test BLEU greedy", "test BLEU beam 5"):
        if "bleu" in record["stages"].get(name, {}):
            lines.append(f"{name}: {record['stages'][name]['bleu']}")
    for name in ("bench_train eager", "bench_train compiled"):
        found = record["stages"].get(name, {})
        if "speedup_vs_best_reference" in found:
            lines.append(
                f"{name}: ours / best nn.Transformer {found['speedup_vs_best_reference']:.2f}x"
            )
    lines.append(f"{record['seconds']:.0f} s in all")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="dry run of the plumbing, on the CPU")
    parser.add_argument("--json", type=Path, required=True, help="the record, rewritten per stage")
    parser.add_argument("--train-minutes", type=float, default=2.0)
    parser.add_argument("--total", type=int, default=TOTAL_SECONDS, help="seconds for everything")
    parser.add_argument(
        "--keep", type=Path, help="copy each stage's files here (no weights, no data store)"
    )
    parser.add_argument("--fail", metavar="WHY", help="add a stage that fails (tests the plumbing)")
    parser.add_argument("--stage", choices=["decoding"], help=argparse.SUPPRESS)
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage == "decoding":
        decoding_stage(args.run, args.device, args.json)
        return 0
    import torch

    if not (args.cpu or torch.cuda.is_available()):
        print(
            "gpu_check: no GPU is present here (--cpu runs its plumbing on the CPU)",
            file=sys.stderr,
        )
        return 2
    began = time.monotonic()
    minutes = None if args.cpu else args.train_minutes  # a dry run trains a step budget
    record: dict = {"dry_run_on_cpu": args.cpu, "train_minutes": minutes, "stages": {}}

    def write() -> None:
        record["seconds"] = round(time.monotonic() - began, 1)
        write_json(args.json, record)

    try:
        record["environment"] = environment("cpu" if args.cpu else "cuda")
    except Exception as e:  # noqa: BLE001 -- recorded, and the stages go on
        record["environment"] = {"error": f"{type(e).__name__}: {e}"}
    write()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:

        def save() -> None:
            write()
            if args.keep:
                keep(Path(scratch), args.keep)

        run_stages(
            stages(args, Path(scratch)),
            record["stages"],
            save,
            lambda: args.total - (time.monotonic() - began),
            tag="gpu_check",
        )
    write()
    print(summary(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
