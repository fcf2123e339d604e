"""Translating a long file streams: peak memory does not grow with the number of lines,
and a SIGKILL half-way leaves every line already written whole and correct.

Trains a tiny model (or takes ``--run``), writes files of 10,000 and 100,000 lines cycled
from data/sample, translates each with ``seq2seq translate RUN -i IN -o OUT`` and reports
the process's peak RSS (``ru_maxrss`` from ``wait4``); then kills the 100,000-line
translation at random moments and checks the written lines against the full output.

    OMP_NUM_THREADS=1 python experiments/robustness/stream_memory.py [--json RECORD]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from test_robustness import TINY, env  # noqa: E402

from seq2seq.config import load_config  # noqa: E402
from seq2seq.run.runlog import machine  # noqa: E402
from seq2seq.training.entry import train  # noqa: E402


def translate(run: Path, src: Path, out: Path, kill_after: float | None = None) -> dict:
    command = [
        sys.executable,
        "-m",
        "seq2seq",
        "translate",
        str(run),
        "-i",
        str(src),
        "-o",
        str(out),
        # Short outputs keep 100,000 lines quick: streaming is about lines, not their length.
        "--max-len-a",
        "0",
        "--max-len-b",
        "4",
    ]
    began = time.time()
    proc = subprocess.Popen(command, cwd=REPO, env=env(), stderr=subprocess.DEVNULL)
    if kill_after is not None:
        time.sleep(kill_after)
        # os.kill, not send_signal: that polls first, and reaps a process that has just
        # finished, so wait4 below found no child (rc 0 here then: it was not killed)
        os.kill(proc.pid, signal.SIGKILL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "rc": proc.returncode,
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "wall_s": round(time.time() - began, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a trained run (default: train a tiny one)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/seq2seq-stream-memory"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the summary here, as a record")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run = args.run
    if run is None:
        run = args.out / "run"
        if not (run / "model.safetensors").is_file():
            train(
                load_config(None, [*TINY, "train.max_steps=60", "train.validate_every=30"]),
                run,
                overwrite=True,
                progress=False,
            )
    sample = (REPO / "data" / "sample" / "train.de").read_text(encoding="utf-8").splitlines()

    results = {}
    for n in args.sizes:
        src, out = args.out / f"in.{n}.txt", args.out / f"out.{n}.txt"
        src.write_text("".join(sample[i % len(sample)] + "\n" for i in range(n)), encoding="utf-8")
        result = translate(run, src, out)
        result["output_lines"] = out.read_text(encoding="utf-8").count("\n")
        results[n] = result
        print(n, json.dumps(result), flush=True)

    n = max(args.sizes)
    full = (args.out / f"out.{n}.txt").read_text(encoding="utf-8").split("\n")[:-1]
    rng = random.Random(0)
    kills = []
    for _ in range(args.kills):
        out = args.out / "killed.txt"
        result = translate(
            run, args.out / f"in.{n}.txt", out, rng.uniform(0.1, 0.9) * results[n]["wall_s"]
        )
        text = out.read_text(encoding="utf-8") if out.is_file() else ""
        whole = text.split("\n")[:-1]
        result.update(
            lines_written=len(whole),
            ends_with_newline=text == "" or text.endswith("\n"),
            lines_match_full_run=whole == full[: len(whole)],
        )
        kills.append(result)
        print("killed", json.dumps(result), flush=True)
    summary = {
        "command": ["python", "experiments/robustness/stream_memory.py", *sys.argv[1:]],
        "environment": machine(),
        "sizes": results,
        "kills": kills,
    }
    for path in filter(None, (args.out / "summary.json", args.json)):
        path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
