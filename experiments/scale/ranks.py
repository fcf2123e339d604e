"""Memory of several processes: one process against ``torchrun --nproc_per_node=2`` on the
same corpus, each a fresh run (rank 0 prepares the corpus) trained for a few steps. The two
processes run twice: each with the default 2,048 tokens per step (``data.max_tokens`` is per
process: twice the batch of one process) and each with 1,024 (the same batch as one process,
as the loss equality tests compare them).

The memory of a process tree is sampled every 50 ms from /proc: the sum of the processes'
RSS (shared pages counted once per process that maps them) and of their PSS (a shared page
split between the processes that map it: the memory the tree really holds). The corpus
store is read through the shared page cache; the model, its optimizer state and
activations are each process's own.

Given several corpora (``multi30k`` is the shipped one), it measures each: what the two ranks
hold beyond what they hold on Multi30k is what the corpus costs them.

    python experiments/scale/run.py --sizes 1000000        # writes the 1M-pair corpus
    python experiments/scale/ranks.py --corpus multi30k /tmp/scale/pairs-1000000-seed0.tsv
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from seq2seq.run.runlog import machine  # noqa: E402

MAX_TOKENS = 2048  # data.max_tokens of the default recipe: tokens per process and step
ONE = "1 process"
TWICE = "torchrun, 2 processes, 2048 tokens each (twice the batch)"
SAME = "torchrun, 2 processes, 1024 tokens each (the same batch)"
SHIPPED = "multi30k"


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def memory_mb(pid: int, launcher: bool) -> tuple[float, float]:
    """Summed RSS and PSS of ``pid``'s tree, in MB; without ``pid`` itself when it is only
    the launcher (torchrun) of the processes that train."""
    rss = pss = 0
    for p in tree(pid)[1:] if launcher else tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024


def peak_memory(command: list[str], launcher: bool) -> dict:
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak_rss = peak_pss = 0.0
    began = time.monotonic()
    while proc.poll() is None:
        rss, pss = memory_mb(proc.pid, launcher)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.05)
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr.read().decode()[-3000:]}")
    return {"peak_rss_mb": peak_rss, "peak_pss_mb": peak_pss, "wall_s": time.monotonic() - began}


def measure(corpus: str, steps: int) -> dict:
    """Peak memory of one process and of the two torchrun set-ups on ``corpus``."""
    data = [] if corpus == SHIPPED else ["--data", corpus]
    train = ["train", *data, "--src", "de", "--tgt", "en", "--no-progress"]
    train += ["--max-steps", str(steps), "--set", "train.threads=1"]
    train += ["--set", "train.valid_bleu_sentences=20", "--set", "train.attention_sentences=0"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        one = [sys.executable, "-m", "seq2seq", *train, "--out", f"{tmp}/one"]
        two = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        two += ["--nproc_per_node=2", "-m", "seq2seq", *train]
        half = ["--set", f"data.max_tokens={MAX_TOKENS // 2}"]
        runs = {
            ONE: one,
            TWICE: [*two, "--out", f"{tmp}/two"],  # each rank a whole batch: twice the batch
            SAME: [*two, *half, "--out", f"{tmp}/half"],  # half each: the same batch
        }
        for name, command in runs.items():
            results[name] = peak_memory(command, launcher=command is not one)
            print(corpus, name, {k: round(v) for k, v in results[name].items()}, flush=True)
    ratio = {
        name: {k: results[name][k] / results[ONE][k] for k in ("peak_rss_mb", "peak_pss_mb")}
        for name in (TWICE, SAME)
    }
    for name, r in ratio.items():
        print(f"{name} / 1 process: RSS {r['peak_rss_mb']:.2f}x, PSS {r['peak_pss_mb']:.2f}x")
    return {"results": results, "ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus",
        nargs="+",
        required=True,
        help=f"TSVs with header de, en, or {SHIPPED} for the shipped corpus",
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("ranks.json"))
    args = parser.parse_args()
    corpora = {corpus: measure(corpus, args.steps) for corpus in args.corpus}
    record = {"steps": args.steps, "corpora": corpora}
    record |= {"environment": machine(), "command": sys.argv}
    args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
