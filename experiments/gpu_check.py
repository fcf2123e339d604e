"""Everything on a GPU in one command, under ten minutes: the device and precision found, the
CUDA-marked tests, a short training and its resume, decoding equal to the CPU's on the
trained model, bench_train eager and compiled, and a two-process torchrun job where two GPUs
are present. Writes one JSON record.

    python experiments/gpu_check.py --json experiments/results/gpu-check/gpu_check.json
    python experiments/gpu_check.py --cpu --json /tmp/gpu_check.json   # the plumbing, on CPU

Without a GPU (and without ``--cpu``) it says so in one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # tests/ for the tiny run's settings

from helpers import TINY_RUN  # noqa: E402

from seq2seq.config import load_config  # noqa: E402
from seq2seq.decoding.load import load_run  # noqa: E402
from seq2seq.decoding.translate import translate_ids  # noqa: E402
from seq2seq.run.precision import autocast_dtype, describe_precision  # noqa: E402
from seq2seq.run.runlog import accelerator, machine  # noqa: E402
from seq2seq.training.trainer import train  # noqa: E402

TINY = [
    *TINY_RUN,
    "data.max_len=60",
    "data.max_tokens=160",
    "model.max_positions=64",
    "train.valid_bleu_sentences=4",
    "train.keep_last=0",
    "train.average_last=0",
]
STEPS = 20  # trained, then resumed for as many again


def run(command: list[str], timeout: int) -> dict:
    """A subprocess's exit status, seconds and last lines."""
    began = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
    return {"rc": done.returncode, "seconds": round(time.monotonic() - began, 1), "tail": tail}


def training_and_resume(device: str, out: Path) -> dict:
    config = load_config(None, [*TINY, f"train.device={device}", f"train.max_steps={STEPS}"])
    first = train(config, out, progress=False)
    config = load_config(None, [*TINY, f"train.device={device}", f"train.max_steps={2 * STEPS}"])
    resumed = train(config, out, resume=True, progress=False)
    return {"steps": [first["step"], resumed["step"]], "best_bleu": resumed["best_bleu"]}


def decoding_on_both(run_dir: Path, device: torch.device) -> dict:
    """Greedy and beam outputs of the trained model on ``device`` and on the CPU."""
    config, tokenizer, model = load_run(run_dir)
    lines = (REPO / "data" / "sample" / f"valid.{config.data.src}").read_text().splitlines()
    sentences = [tokenizer.encode(line, "src") for line in lines[:8]]
    found = {}
    for beam in (1, 4):
        decode = dataclasses.replace(config.decode, beam=beam, nbest=1)
        hyps = {}
        for where in (torch.device("cpu"), device):
            hyps[str(where)] = translate_ids(model.to(where), sentences, decode, device=where)
        cpu, other = hyps["cpu"], hyps[str(device)]
        same = sum(a.tokens == b.tokens for a, b in zip(cpu, other, strict=True))
        gap = max(abs(a.score - b.score) for a, b in zip(cpu, other, strict=True))
        found[f"beam {beam}"] = {"same_outputs": same, "of": len(cpu), "max_score_gap": gap}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="dry run of the plumbing, on the CPU")
    parser.add_argument("--json", type=Path, required=True, help="the record written")
    args = parser.parse_args()
    if not (args.cpu or torch.cuda.is_available()):
        print(
            "gpu_check: no GPU is present here (--cpu runs its plumbing on the CPU)",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = autocast_dtype("bf16", device)
    record = {
        "dry_run_on_cpu": args.cpu,
        "environment": {**machine(), "device": str(device), **accelerator(device)},
        "precision": describe_precision("bf16", dtype, device),
    }
    python = sys.executable
    tests = [python, "-m", "pytest", "-q", "-p", "no:xdist", "-o", "addopts=", "-m", "cuda"]
    record["cuda_tests"] = run([*tests, *(["--collect-only"] if args.cpu else [])], 300)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        out = Path(scratch)
        record["training"] = training_and_resume(str(device), out / "run")
        record["decoding"] = decoding_on_both(out / "run", device)
        bench = [python, "experiments/bench_train.py", "--quick", "--device", str(device)]
        for name, extra in (("eager", []), ("compiled", ["--compile"])):
            if args.cpu and extra:
                record[f"bench_{name}"] = "skipped: compiling takes minutes on a CPU"
                continue
            result = run([*bench, *extra, "--json", str(out / f"bench_{name}.json")], 420)
            if result["rc"] == 0:
                result["results"] = json.loads((out / f"bench_{name}.json").read_text())["results"]
            record[f"bench_{name}"] = result
        if not args.cpu and torch.cuda.device_count() >= 2:
            torchrun = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
            sets = [x for s in [*TINY, f"train.max_steps={STEPS}"] for x in ("--set", s)]
            job = [*torchrun, "-m", "seq2seq", "train", "--out", str(out / "ddp"), *sets]
            record["torchrun_two_gpus"] = run([*job, "--no-progress"], 300)
        else:
            record["torchrun_two_gpus"] = f"skipped: {torch.cuda.device_count()} GPU(s) here"
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"gpu_check: record written to {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
