"""How long a notebook waits for its first inline explorer, and how large the output is.

In a fresh Python process (``--threads`` torch threads): the time from ``import seq2seq`` to
the ``_repr_html_`` of ``seq2seq.load(RUN).inspect(SENTENCE)`` (cold: imports, loading and the
first decoding, influence and page interventions), then the same inspect and ``_repr_html_``
again in that process (warm). Medians of ``--repeats`` processes. Size: the bytes of one
sentence's ``_repr_html_``, which do not depend on the machine.

With no ``--run`` given, a run of the default config (``seq2seq.config.Config()``: the default
shape and corpus) trained for one step is made under ``--make-in``: its weights are untrained,
which changes what it translates (it runs to max_len) but not the shape of the work per step.

    python experiments/notebook_latency.py --json experiments/notebook/latency.json
    python experiments/notebook_latency.py --run runs/tour --repeats 1   # proves it runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SENTENCE = "Ein Mann in einem blauen Hemd fährt mit dem Fahrrad eine Straße entlang."
# What one process measures; it prints one JSON line.
PROBE = """
import json, sys, time
start = time.perf_counter()
import seq2seq
run = seq2seq.load(sys.argv[1], device="cpu")
loaded = time.perf_counter()
shown = run.inspect(sys.argv[2])._repr_html_()
first = time.perf_counter()
again = run.inspect(sys.argv[2])._repr_html_()
warm = time.perf_counter() - first
print(json.dumps({"cold_s": first - start, "load_s": loaded - start, "warm_s": warm,
                  "bytes": len(shown.encode()), "same": shown == again,
                  "stop_reason": run.inspect(sys.argv[2]).stop_reason}))
"""


def make_run(folder: Path, threads: int) -> Path:
    """The default config trained one step: the default shape with untrained weights."""
    sys.path.insert(0, str(REPO_ROOT))
    import seq2seq

    run = folder / "default-1step"
    seq2seq.train(
        run,
        overrides=[
            "train.max_steps=1",
            "train.validate_every=1",
            "train.valid_bleu_sentences=2",
            "train.attention_sentences=0",
            f"train.threads={threads}",
            "train.device=cpu",
        ],
        progress=False,
    )
    return run


def probe(run: Path, sentence: str, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(run), sentence],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, help="a run directory (default: make a 1-step default run)")
    p.add_argument("--make-in", type=Path, default=Path("runs/experiments/notebook"))
    p.add_argument("--sentence", default=SENTENCE)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the record here")
    args = p.parse_args()
    run = args.run or make_run(args.make_in, args.threads)
    load_before = os.getloadavg()
    found = [probe(run, args.sentence, args.threads) for _ in range(args.repeats)]
    record = {
        "command": " ".join(["python", *sys.argv]),
        "run": str(run),
        "weights": "untrained (the default config, 1 step)" if args.run is None else "the run's",
        "sentence": args.sentence,
        "stop_reason": found[0]["stop_reason"],
        "threads": args.threads,
        "repeats": args.repeats,
        "cold_s": round(statistics.median(f["cold_s"] for f in found), 2),
        "load_s": round(statistics.median(f["load_s"] for f in found), 2),
        "warm_s": round(statistics.median(f["warm_s"] for f in found), 2),
        "each_cold_s": [round(f["cold_s"], 2) for f in found],
        "each_warm_s": [round(f["warm_s"], 2) for f in found],
        "html_bytes": found[0]["bytes"],
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs",
        "load_average": [round(x, 1) for x in (*load_before, *os.getloadavg())],
        "note": "timed on a machine shared with other jobs (load average: 1, 5, 15 minutes, "
        "before then after): not an idle machine",
    }
    text = json.dumps(record, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
