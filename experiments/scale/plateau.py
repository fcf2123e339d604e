"""Peak memory over a longer stretch of training: where the scale runs' peak RSS settles.

``run.py`` trains each corpus for 20 steps, an early point on the curve of a training
process's peak RSS, which keeps rising for hundreds of steps as batches of new shapes come
(torch's activations, and what glibc keeps of them). This resumes ``run.py``'s runs (one per
corpus size, in ``--corpora``/runs) for ``--steps`` more steps each, one after the other,
and records the peak RSS the trainer logged at every step (``metrics.jsonl``'s
``peak_rss_mb``) and before its first one (the ``start`` line), with ``run.py``'s settings.

    python experiments/scale/run.py --corpora /tmp/scale --sizes 100000 1000000 5000000
    python experiments/scale/plateau.py --corpora /tmp/scale --sizes 1000000 5000000 --steps 300
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # run.py, the runs' settings

from run import train_args  # noqa: E402

from seq2seq.run.runlog import machine  # noqa: E402
from seq2seq.training.curves import read_metrics  # noqa: E402


def resume(run: Path, steps: int, threads: int) -> dict:
    """Resume ``run`` for ``steps`` more steps with ``run.py``'s settings; the peak RSS before
    its first step and after each step of that segment, as the trainer logged them."""
    start = max(r["step"] for records in read_metrics(run).values() for r in records)
    argv = ["--resume", "--out", str(run), "--max-steps", str(start + steps), "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "seq2seq", "train", *argv, *train_args(False, threads)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{run}: seq2seq train failed:\n{done.stderr[-2000:]}")
    logged = read_metrics(run)
    [ready] = [r["peak_rss_mb"] for r in logged["start"] if r["step"] == start]
    # steps after ``start`` only: the line at ``start`` is the previous process's
    trained = [(r["step"], r["peak_rss_mb"]) for r in logged["train"] if r["step"] > start]
    return {"from_step": start, "ready_rss_mb": ready, "peak_rss_mb_by_step": trained}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpora", type=Path, required=True, help="run.py's --corpora")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("plateau.json"))
    args = parser.parse_args()
    results = {}
    for n in args.sizes:
        run = args.corpora / "runs" / str(n)
        if not (run / "metrics.jsonl").is_file():
            parser.error(f"{run}: no run of run.py to resume (run run.py --sizes {n} first)")
        results[n] = resume(run, args.steps, args.threads)
        by_step = results[n]["peak_rss_mb_by_step"]
        marks = [by_step[i] for i in (0, 19, 99, len(by_step) - 1) if i < len(by_step)]
        print(n, f"before {results[n]['ready_rss_mb']:,.0f} MB;", marks, flush=True)
    record = {"sizes": results, "steps": args.steps, "threads": args.threads}
    record |= {"environment": machine(), "command": [Path(sys.argv[0]).as_posix(), *sys.argv[1:]]}
    args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
