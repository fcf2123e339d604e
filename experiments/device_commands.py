"""The device check's stages that run the project's own commands (``device_check.py`` starts
each in a child of its own): the README's main job with the GPU sampled beside it, the README's
commands on its run, and torchrun; and what they share with the driver: the stage's result
file, the commands' device flags, and the packing of the stages' files.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.stages import REPO, Stage, dry_run, run_stage, scores, training_summary, write_json

FILES = "files.tar.gz"
CHECK = Path(__file__).with_name("device_check.py")
FALLBACK_STEPS = 300  # a run for the README commands when the main job left none
COMMAND_CAP = 30  # s: no README command may take the rest of the stage's time alone
SENTENCE = "Ein Hund läuft über die Wiese."  # the README's
ATTENTION_SENTENCE = "Ein Mann fährt Fahrrad auf der Straße."
GPU_SAMPLES = "utilization.gpu,clocks.sm,power.draw"
PACKED = (".json", ".jsonl", ".log", ".txt", ".csv", ".yaml", ".html")
PACK_SKIP = ("data", "checkpoints", "deps", "subword")  # folders of weights, stores, wheels
PACK_MAX_BYTES = 4_000_000  # a file larger than this stays behind


def write_result(args: argparse.Namespace, found: dict[str, Any]) -> None:
    write_json(args.scratch / f"{args.stage}.json", found)


def cli_flags(args: argparse.Namespace) -> list[str]:
    """What a README command gets beside its own arguments: nothing on a GPU (auto is
    cuda:0, as for a user), the CPU in a dry run."""
    return ["--device", "cpu"] if args.cpu else []


def pack(scratch: Path, target: Path) -> None:
    """The small text files under ``scratch`` (logs, metrics, hypotheses, the explorer page),
    one gzipped tar at ``target``, whole or not at all."""
    from seq2seq.fileio import atomic_path

    files = [
        f
        for f in sorted(scratch.rglob("*"))
        if f.is_file()
        and f.suffix in PACKED
        and not set(f.relative_to(scratch).parts[:-1]) & set(PACK_SKIP)
        and f.stat().st_size <= PACK_MAX_BYTES
    ]
    with atomic_path(target) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(scratch)))


def train_command(args: argparse.Namespace, run: Path, budget: list[str]) -> list[str]:
    """``seq2seq train`` as the README runs it, into ``run`` (ours: replaced on a rerun)."""
    command = [sys.executable, "-m", "seq2seq", "train", "--src", "de", "--tgt", "en"]
    command += ["--out", str(run), "--overwrite", "--no-progress", *cli_flags(args)]
    tiny = [x for s in dry_run() for x in ("--set", s)] if args.cpu else []
    return [*command, *(tiny or budget)]


def shown(command: list[str], args: argparse.Namespace) -> str:
    """A command as the record shows it: python3, paths in the checkout relative to it, and
    the scratch folder as SCRATCH."""
    text = " ".join(["python3", *command[1:]])
    return text.replace(str(args.scratch), "SCRATCH").replace(f"{REPO}{os.sep}", "")


def main_child(args: argparse.Namespace) -> int:
    """Stage 3: the README main job for 3 minutes (the tiny run's steps in the dry run), the
    GPU's utilisation sampled beside it; the record and the packed files renewed every 15 s,
    so that a cut call still brings back the run so far."""
    run = args.scratch / "main"
    command = train_command(args, run, ["--max-time", "3"])
    command += [x for setting in args.main_set for x in ("--set", setting)]
    found: dict[str, Any] = {"command": shown(command, args)}
    began = time.monotonic()
    sampler = GpuSampler(args.scratch / "gpu_util.csv")
    with open(args.scratch / "main-train.log", "w") as log:
        train = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    while True:
        try:
            train.wait(timeout=15)
            break
        except subprocess.TimeoutExpired:
            found["metrics"] = metrics_so_far(run)
            write_result(args, found)
            pack(args.scratch, args.out / FILES)
    found.update(
        rc=train.returncode,
        seconds=round(time.monotonic() - began, 1),
        metrics=metrics_so_far(run),
        gpu_util=sampler.stop(),
    )
    write_result(args, found)
    return train.returncode


def metrics_so_far(run: Path) -> dict[str, Any] | str:
    try:
        return training_summary(run)
    except (OSError, ValueError, KeyError, IndexError) as e:
        return f"not yet: {e}"


class GpuSampler:
    """GPU 0's utilisation, SM clock and power once a second into ``csv``: nvidia-smi's loop
    (started and stopped by its PID), else torch.cuda.utilization on a thread (it needs
    NVML), else nothing, said so."""

    def __init__(self, csv: Path) -> None:
        self.csv, self.proc, self.thread, self.stopping = csv, None, None, threading.Event()
        query = [f"--query-gpu={GPU_SAMPLES}", "--format=csv,noheader,nounits", "-lms", "1000"]
        try:
            with open(csv, "w") as out:
                self.proc = subprocess.Popen(["nvidia-smi", *query], stdout=out)
            self.source = "nvidia-smi"
        except OSError:
            self.source = "torch.cuda.utilization"
            self.thread = threading.Thread(target=self._sample_with_torch, daemon=True)
            self.thread.start()

    def _sample_with_torch(self) -> None:
        import torch

        with open(self.csv, "w") as out:
            while not self.stopping.wait(1.0):
                try:
                    out.write(f"{torch.cuda.utilization(0)}\n")
                    out.flush()
                except Exception as e:  # noqa: BLE001 -- no CUDA, or no NVML: said once
                    self.source = f"not sampled: {type(e).__name__}: {e}"
                    return

    def stop(self) -> dict[str, Any]:
        """Stop sampling; the utilisation's mean, median and max over the samples."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        rows = [line.split(",") for line in self.csv.read_text().splitlines()]
        util = sorted(int(r[0]) for r in rows if r[0].strip().isdigit())
        found: dict[str, Any] = {"source": self.source, "samples": len(util)}
        if util:
            found.update(mean=round(sum(util) / len(util), 1), median=util[len(util) // 2])
            found["max"] = util[-1]
        return found


def readme_child(args: argparse.Namespace) -> int:
    """Stage 4: the README's commands on the main job's run (or, where it left no weights,
    on a short run trained here), each with its own cap; the result rewritten after each."""
    from seq2seq.run.checkpoint import BEST_FILE

    out = args.scratch / "readme"
    out.mkdir(parents=True, exist_ok=True)
    run = args.scratch / "main"
    found: dict[str, Any] = {"run": "the main job's run", "commands": {}}
    if not (run / BEST_FILE).is_file():
        run = args.scratch / "fallback"
        command = train_command(args, run, ["--max-steps", str(FALLBACK_STEPS)])
        found["run"] = f"trained here, the main job having left no weights: {shown(command, args)}"
        found["commands"]["train"] = command_result(args, "train", command, 120, out)
    seq2seq = [sys.executable, "-m", "seq2seq"]
    flags = cli_flags(args)
    for name, command, read in (
        ("evaluate greedy", ["evaluate", run, "--split", "test", "-o", out / "greedy.txt"],
         lambda _: scores(out / "greedy.json")),
        ("evaluate beam 5", ["evaluate", run, "--split", "test", "--beam", "5",
                             "-o", out / "beam5.txt"], lambda _: scores(out / "beam5.json")),
        ("translate --verbose", ["translate", run, "--verbose", SENTENCE], None),
        ("attention -o html", ["attention", run, ATTENTION_SENTENCE, "-o", out / "explorer.html"],
         lambda _: {"html_bytes": (out / "explorer.html").stat().st_size}),
    ):  # fmt: skip
        full = [*seq2seq, *map(str, command), *flags]
        if command[0] == "evaluate" and importlib.util.find_spec("sacremoses") is None:
            why = "needs sacremoses (the literature-scale BLEU), not importable: carry its wheel"
            found["commands"][name] = {"status": "skipped", "why": why}
        else:
            found["commands"][name] = command_result(args, name, full, COMMAND_CAP, out, read)
        write_result(args, found)
    found["commands"]["serve"] = serve_check(args, run)
    write_result(args, found)
    load = [sys.executable, "-c", LOAD_AND_INSPECT, str(run), "cpu" if args.cpu else "auto"]
    found["commands"]["seq2seq.load"] = command_result(
        args, "seq2seq.load", load, COMMAND_CAP, out, last_json
    )
    write_result(args, found)
    return 0 if all(c["status"] in ("passed", "skipped") for c in found["commands"].values()) else 1


def command_result(
    args: argparse.Namespace,
    name: str,
    command: list[str],
    cap: int,
    logs: Path,
    read: Callable[[Path], dict] | None = None,
) -> dict[str, Any]:
    """One command, as a stage of its own (run_stage: its cap, its tail, its whole output in
    a log, which ``read`` gets with the files the command wrote)."""
    log = logs / (re.sub(r"[^\w.]+", "-", name).strip("-") + ".log")  # evaluate-greedy.log
    stage = Stage(name, command, cap, read=read and (lambda: read(log)), log=log)
    return {"command": shown(command, args), **run_stage(stage, cap)}


def last_json(log: Path) -> dict[str, Any]:
    return json.loads(log.read_text().strip().splitlines()[-1])


# seq2seq.load as a notebook calls it: the device "auto" finds cuda:0 on a GPU.
LOAD_AND_INSPECT = f"""
import json, sys, time
import seq2seq
began = time.monotonic()
r = seq2seq.load(sys.argv[1], device=sys.argv[2])
loaded = time.monotonic() - began
text = r.translate({SENTENCE!r})
began = time.monotonic()
html = r.inspect({ATTENTION_SENTENCE!r})._repr_html_()
inspected = time.monotonic() - began
want = "cpu" if sys.argv[2] == "cpu" else "cuda:0"
print(json.dumps({{"repr": repr(r), "on": want, "translation": text, "load_s": round(loaded, 2),
                  "inspect_s": round(inspected, 2), "inspect_html_chars": len(html)}}))
sys.exit(0 if want in repr(r) else 3)
"""


def serve_check(args: argparse.Namespace, run: Path) -> dict[str, Any]:
    """``seq2seq serve`` started (its PID kept), the empty page and one translation asked
    for, as a browser's typed address asks (no Origin header), then stopped by its PID."""
    command = [sys.executable, "-m", "seq2seq", "serve", str(run), "--port", "0", *cli_flags(args)]
    found: dict[str, Any] = {"command": shown(command, args)}
    began = time.monotonic()
    with open(args.scratch / "readme" / "serve.log", "w") as log:
        server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(server.stdout, selectors.EVENT_READ)
            line = server.stdout.readline() if sel.select(timeout=COMMAND_CAP) else ""
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        found["startup_s"] = round(time.monotonic() - began, 2)
        if not url:
            found.update(status="failed", tail=[line.strip()])
            return found
        found["requests"] = [get(url.group(0)), get(url.group(0) + "?text=Ein+Hund+l%C3%A4uft.")]
        answered = found["requests"][1].get("records", 0) >= 1
        ok = all(r["status"] == 200 for r in found["requests"]) and answered
        found["status"] = "passed" if ok else "failed"
        return found
    finally:
        found["stopped_by"] = stop(server)


def get(url: str) -> dict[str, Any]:
    """One GET: status, seconds, and how many translations the explorer page holds."""
    began = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=COMMAND_CAP) as answer:
            status, page = answer.status, answer.read().decode("utf-8")
    except OSError as e:  # an HTTP error status too
        return {"url": url, "status": getattr(e, "code", None), "error": str(e)}
    data = re.search(r'id="explorer-data"[^>]*>(.*?)</script>', page, re.S)
    records = len(json.loads(data.group(1)).get("records", [])) if data else None
    return {"url": url, "status": status, "seconds": round(time.monotonic() - began, 3),
            "records": records}  # fmt: skip


def stop(process: subprocess.Popen) -> str:
    """SIGINT to ``process`` by its PID, as Ctrl-C stops the server; SIGKILL after 5 s."""
    os.kill(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=5)
        return f"SIGINT (rc {process.returncode})"
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        return "SIGKILL, 5 s after SIGINT"


def torchrun_child(args: argparse.Namespace) -> int:
    """Stage 5: ``torchrun --nproc_per_node=1`` trains 20 steps on the GPU. One process makes
    no process group (``setup_runtime`` makes one for several), so a second torchrun of one
    rank makes the NCCL calls the trainer's several processes make (``nccl_child``)."""
    out = args.scratch / "torchrun"
    out.mkdir(parents=True, exist_ok=True)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    budget = ["--max-steps", "20", "--set", "train.valid_bleu_sentences=100"]  # the path, not BLEU
    train = train_command(args, args.scratch / "torchrun-run", budget)
    probe = [str(CHECK), "--stage", "nccl", "--scratch", str(args.scratch), "--out", str(args.out)]
    probe += ["--cpu"] if args.cpu else []
    found: dict[str, Any] = {"commands": {}}
    for name, command, read in (
        ("train 20 steps", [*launch, *train[1:]],
         lambda _: {"metrics": metrics_so_far(args.scratch / "torchrun-run")}),
        ("NCCL calls, one rank", [*launch, *probe], last_json),
    ):  # fmt: skip
        found["commands"][name] = command_result(args, name, command, 120, out, read)
        write_result(args, found)
    return 0 if all(c["status"] == "passed" for c in found["commands"].values()) else 1


def nccl_child(args: argparse.Namespace) -> int:
    """Under torchrun: the process group as ``setup_runtime`` makes it (NCCL with the GPU as
    ``device_id``; gloo on the CPU), then the collectives the trainer calls: an all_reduce
    of a device tensor, a gloo side group's all_gather_object (``main_first``), a barrier."""
    import torch
    import torch.distributed as dist

    from seq2seq.run.runtime import _device_id

    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    backend = "gloo" if args.cpu else "nccl"
    found: dict[str, Any] = {"backend": backend, "world": int(os.environ["WORLD_SIZE"])}
    began = time.monotonic()
    dist.init_process_group(backend, **_device_id(device))
    found["init_s"] = round(time.monotonic() - began, 2)
    total = torch.ones((), device=device)
    dist.all_reduce(total)
    found["all_reduce"] = total.item()
    side = dist.new_group(backend="gloo")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": dist.get_rank()}, group=side)
    found["all_gather_object"] = gathered
    dist.barrier(**({} if args.cpu else {"device_ids": [0]}))
    dist.destroy_process_group()
    found["calls_s"] = round(time.monotonic() - began, 2)
    print(json.dumps(found))
    return 0
