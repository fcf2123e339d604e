"""Training on corpora of 100k to 5M pairs: peak memory, preparation, time to the first step.

Writes synthetic TSV corpora into ``--corpora``, a folder outside the repository (5M pairs
are 1.35 GB): each line two Multi30k training pairs joined, drawn with a seeded RNG, under
a header ``de en``. For each size it then trains, each in a fresh process, one after the
other:

    seq2seq train --data CORPUS --src de --tgt en --out RUN --max-steps 20 --set train.threads=2 ...
    seq2seq train --resume --out RUN --max-steps 40 ...

recording per process its peak RSS (``ru_maxrss`` from ``wait4``), the wall seconds from
its start to its first training step (``metrics.jsonl`` polled, with a line every step)
and its steps/s; and the preparation's wall and CPU seconds (``RUN/data/manifest.json``).
Last, random access to batches of 120 pairs of the largest store: the flat arrays
(``seq2seq.data.store``) against the same pairs in a ``datasets`` Arrow file.

    python experiments/scale/run.py --corpora /tmp/scale [--sizes 100000 1000000 5000000]
    python experiments/scale/run.py --quick --out DIR
    python experiments/scale/run.py --readme-only

A full run writes ``results.json`` and ``README.md`` (from ``README.template.md``) into
this folder.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from seq2seq.data.corpora import load_corpus
from seq2seq.data.prepare import DATA_DIR
from seq2seq.data.store import PairStore, read_manifest
from seq2seq.errors import Seq2SeqError
from seq2seq.training.curves import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common
from common import (  # noqa: E402
    QUICK_MODEL,
    add_output_args,
    command,
    minutes_since,
    output_dir,
    write_outputs,
    write_readme,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SEED = 0
GOALS = {"rss_mb_5m": 2048, "rss_growth": 0.25, "resume_first_step_s": 10, "prepare_1m_s": 60}
# A short run: validation only at its end, on a few sentences, with no attention maps or
# averaging, so that what is measured is the data path and the training steps.
TRAIN_SETTINGS = [
    "train.log_every=1",
    "train.valid_bleu_sentences=16",
    "train.attention_sentences=0",
    "train.average_last=0",
    "train.keep_last=1",
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpora", type=Path, help="where the synthetic corpora and runs are written")
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[100_000, 1_000_000, 5_000_000],
        help="pairs per corpus (default: %(default)s)",
    )
    p.add_argument("--steps", type=int, default=20, help="steps of the fresh run (default: 20)")
    p.add_argument("--threads", type=int, default=2, help="train.threads (default: 2)")
    p.add_argument("--rounds", type=int, default=200, help="batches timed in the access test")
    add_output_args(p, "one tiny corpus and a tiny model; seconds")
    args = p.parse_args()
    args.out = output_dir(p, args.out, args.quick, HERE)
    if args.quick:
        args.sizes, args.steps, args.threads, args.rounds = [300], 3, 1, 20
        args.corpora = args.corpora or args.out / "corpora"
    elif args.corpora is None and not args.readme_only:
        p.error("--corpora is required (a folder outside the repository)")
    return args


def write_corpus(path: Path, n: int, seed: int = SEED) -> None:
    """``n`` lines, each two Multi30k training pairs joined, under a header ``de en``."""
    if path.is_file():
        return  # written before with the same size and seed: the same bytes
    pairs = load_corpus("multi30k", "de", "en").splits["train"]
    pairs = [(s.replace("\t", " "), t.replace("\t", " ")) for s, t in pairs]  # one has a tab
    rng = random.Random(seed)
    tmp = path.with_suffix(".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("de\ten\n")
        for _ in range(n):
            (s1, t1), (s2, t2) = rng.choice(pairs), rng.choice(pairs)
            f.write(f"{s1} {s2}\t{t1} {t2}\n")
    tmp.replace(path)


def train_args(quick: bool, threads: int) -> list[str]:
    settings = [*TRAIN_SETTINGS, f"train.threads={threads}"]
    if quick:  # the tiny model; lines of two joined sentences are ~150 subwords of 100
        settings += [s for s in QUICK_MODEL if not s.startswith("data.data=")]
        settings += ["data.max_len=300", "model.max_positions=320", "data.max_tokens=1024"]
    return [arg for s in settings for arg in ("--set", s)]


def _steps_logged(run: Path) -> set[int]:
    """The training steps ``run``'s metrics have a line for so far (a line being written is
    skipped; no file yet, no steps)."""
    try:
        return {r["step"] for r in read_metrics(run).get("train", [])}
    except Seq2SeqError:
        return set()


def _ready_rss(run: Path, step: int) -> float:
    """The peak RSS the trainer logged before its first step, from the segment that started
    at ``step``: corpus, tokenizer, store, model and optimizer, no training step yet."""
    for record in reversed(read_metrics(run).get("start", [])):
        if record["step"] == step:
            return record["peak_rss_mb"]
    raise SystemExit(f"{run}: no start line at step {step} in its metrics")


def _cpu_seconds(pid: int) -> float | None:
    """The CPU seconds (user and system, all threads) process ``pid`` has used (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_train(argv: list[str], run: Path, first_step: int) -> dict:
    """Run ``seq2seq train argv``; its peak RSS, the wall and CPU seconds it took to reach
    step ``first_step``, and its steps/s from there, watching ``run/metrics.jsonl`` every
    20 ms. CPU seconds do not grow with the machine's load, as wall seconds do."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "seq2seq", "train", *argv],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        seen: dict[int, tuple[float, float | None]] = {}  # step -> wall and CPU when logged
        while True:
            cpu = _cpu_seconds(proc.pid)  # before wait4 reaps the process
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            for step in _steps_logged(run):
                seen.setdefault(step, (time.monotonic(), cpu))
            if pid:
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            message = err.read().decode("utf-8", "replace")[-3000:]
            raise SystemExit(f"seq2seq train {' '.join(argv)} failed:\n{message}")
    steps = sorted(s for s in seen if s >= first_step)
    span = seen[steps[-1]][0] - seen[steps[0]][0]
    return {
        "peak_rss_mb": usage.ru_maxrss / 1024,  # kilobytes on Linux
        "ready_rss_mb": _ready_rss(run, first_step - 1),
        "first_step_s": seen[first_step][0] - started,
        "first_step_cpu_s": seen[first_step][1],
        "steps_per_s": (len(steps) - 1) / span if span > 0 else None,
        "wall_s": time.monotonic() - started,
    }


def measure_size(args: argparse.Namespace, n: int) -> dict:
    corpus = args.corpora / f"pairs-{n}-seed{SEED}.tsv"
    write_corpus(corpus, n)
    run = args.corpora / "runs" / str(n)
    common = ["--out", str(run), "--no-progress", *train_args(args.quick, args.threads)]
    shutil.rmtree(run, ignore_errors=True)  # no metrics.jsonl of an earlier run to misread
    load = os.getloadavg()[0]
    fresh = timed_train(
        ["--data", str(corpus), "--src", "de", "--tgt", "en"]
        + ["--max-steps", str(args.steps), *common],
        run,
        1,
    )
    manifest = read_manifest(run / DATA_DIR)
    resumed = timed_train(
        ["--resume", "--max-steps", str(2 * args.steps), *common], run, args.steps + 1
    )
    return {
        "pairs": n,
        "corpus_mb": corpus.stat().st_size / 2**20,
        "train_pairs": manifest["pairs"],
        "store_mb": sum(p.stat().st_size for p in (run / DATA_DIR).iterdir()) / 2**20,
        "prepare_s": manifest["prepare_s"],
        "prepare_cpu_s": manifest["prepare_cpu_s"],
        "load_before": load,
        "fresh": fresh,
        "resume": resumed,
    }


def _arrow_copy(store: PairStore, path: Path, chunk: int = 100_000) -> None:
    """The store's pairs as a ``datasets`` Arrow file (two list<uint> columns)."""
    import pyarrow as pa

    writer = None
    with pa.OSFile(str(path), "wb") as sink:
        for start in range(0, len(store), chunk):
            sides = store.pairs(range(start, min(len(store), start + chunk)))
            columns = []
            for ids in sides:
                offsets = np.concatenate([[0], np.cumsum([len(x) for x in ids])])
                values = np.concatenate(ids).astype(store.dtype)
                columns.append(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)))
            batch = pa.record_batch(columns, names=["src", "tgt"])
            writer = writer or pa.ipc.new_stream(sink, batch.schema)
            writer.write_batch(batch)
        writer.close()


def import_seconds(module: str) -> float:
    """Seconds a fresh interpreter, with torch imported, takes to import ``module``."""
    code = f"import time, torch; t = time.perf_counter(); import {module}; "
    code += "print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout)


def access_times(run: Path, batch: int, rounds: int) -> dict:
    """Median milliseconds to read ``batch`` random pairs: the store (``PairStore``) against a
    ``datasets`` Arrow file of the same pairs (as Python lists, and as numpy arrays)."""
    import datasets

    store = PairStore(run / DATA_DIR, read_manifest(run / DATA_DIR)["dtype"])
    arrow = run / "pairs.arrow"
    _arrow_copy(store, arrow)
    table = datasets.Dataset.from_file(str(arrow))
    as_numpy = table.with_format("numpy")
    rng = np.random.default_rng(SEED)
    picks = [rng.choice(len(store), min(batch, len(store)), replace=False) for _ in range(rounds)]
    readers = {
        "store": lambda idx: store.pairs(idx),
        "arrow": lambda idx: table[idx.tolist()],
        "arrow_numpy": lambda idx: as_numpy[idx.tolist()],
    }
    first = picks[0]
    assert [x.tolist() for x in store.pairs(first)[0]] == table[first.tolist()]["src"]
    times = {name: [] for name in readers}
    for idx in picks:  # interleaved, so that the machine's load hits all alike
        for name, read in readers.items():
            began = time.perf_counter()
            read(idx)
            times[name].append(time.perf_counter() - began)
    result = {f"{name}_ms": 1000 * statistics.median(t) for name, t in times.items()}
    result.update(
        pairs=len(store),
        batch=len(first),
        rounds=rounds,
        store_mb=sum(p.stat().st_size for p in (run / DATA_DIR).glob("*.bin")) / 2**20,
        arrow_mb=arrow.stat().st_size / 2**20,
        import_datasets_s=statistics.median(import_seconds("datasets") for _ in range(3)),
    )
    arrow.unlink()
    return result


def _mb(x: float) -> str:
    return f"{x:,.0f}"


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def _first_step(run: dict) -> str:
    return f"{_s(run['first_step_s'])} ({_s(run['first_step_cpu_s'])})"


def _verdict(wall: float, cpu: float | None, goal: float) -> str:
    """Met or not in wall seconds; when not, whether the CPU seconds were within it."""
    if wall <= goal:
        return "met"
    if cpu is not None and cpu <= goal:
        return "met in CPU seconds; **not met** in wall seconds on this loaded machine"
    return "**not met**"


def readme_values(r: dict) -> dict[str, object]:
    """The tables and verdicts of ``README.template.md``, computed from the results ``r``."""
    rows = r["sizes"]
    table = "\n".join(
        f"| {x['pairs']:,} | {_mb(x['corpus_mb'])} | {_mb(x['store_mb'])} "
        f"| {_s(x['prepare_s'])} | {_s(x['prepare_cpu_s'])} "
        f"| {_mb(x['fresh']['ready_rss_mb'])} | {_mb(x['fresh']['peak_rss_mb'])} "
        f"| {_first_step(x['fresh'])} "
        f"| {_mb(x['resume']['ready_rss_mb'])} | {_mb(x['resume']['peak_rss_mb'])} "
        f"| {_first_step(x['resume'])} "
        f"| {x['fresh']['steps_per_s'] or 0:.2f} | {x['load_before']:.1f} |"
        for x in rows
    )
    by_size = {x["pairs"]: x for x in rows}
    verdicts = []
    one_m, five_m = by_size.get(1_000_000), by_size.get(5_000_000)
    if one_m:
        resume, goal = one_m["resume"], GOALS["resume_first_step_s"]
        verdicts.append(
            f"- a resume's first step at 1M pairs: {resume['first_step_s']:.1f} s wall, "
            f"{_s(resume['first_step_cpu_s'])} s CPU, load average {one_m['load_before']:.1f} "
            f"({_verdict(resume['first_step_s'], resume['first_step_cpu_s'], goal)}: ≤ {goal} s)"
        )
        prep_s, prep_cpu, goal = one_m["prepare_s"], one_m["prepare_cpu_s"], GOALS["prepare_1m_s"]
        verdicts.append(
            f"- preparation of 1M pairs: {prep_s:.0f} s wall, {prep_cpu:.0f} s CPU "
            f"({_verdict(prep_s, prep_cpu, goal)}: ≤ {goal} s on 2 cores)"
        )
    if five_m:
        peak = max(five_m["fresh"]["peak_rss_mb"], five_m["resume"]["peak_rss_mb"])
        verdicts.append(
            f"- peak RSS at 5M pairs: {peak:,.0f} MB "
            f"({'met' if peak <= GOALS['rss_mb_5m'] else '**not met**'}: "
            f"≤ {GOALS['rss_mb_5m']:,} MB)"
        )
    if one_m and five_m:
        for start in ("fresh", "resume"):
            growth = five_m[start]["peak_rss_mb"] / one_m[start]["peak_rss_mb"] - 1
            ready = five_m[start]["ready_rss_mb"] / one_m[start]["ready_rss_mb"] - 1
            verdicts.append(
                f"- peak RSS growth from 1M to 5M pairs, {start} start: {growth:+.0%} "
                f"({'met' if growth < GOALS['rss_growth'] else '**not met**'}: "
                f"< {GOALS['rss_growth']:.0%}); before the first step: {ready:+.0%}"
            )
    if not verdicts:
        verdicts.append("- no goal applies to these sizes (1M and 5M pairs were not measured)")
    a = r["access"]
    ratio = a["arrow_ms"] / a["store_ms"]
    if 0.8 <= ratio <= 1.25:
        access_verdict = "The two read a batch in about the same time."
    elif ratio > 1.25:
        access_verdict = f"The arrays read a batch {ratio:.1f}× faster than Arrow's lists."
    else:
        access_verdict = f"Arrow's lists read a batch {1 / ratio:.1f}× faster than the arrays."
    return {
        "access_verdict": access_verdict,
        "table": table,
        "verdicts": "\n".join(verdicts),
        "access_pairs": f"{a['pairs']:,}",
        "store_ms": f"{a['store_ms']:.2f}",
        "arrow_ms": f"{a['arrow_ms']:.2f}",
        "arrow_numpy_ms": f"{a['arrow_numpy_ms']:.2f}",
        "access_store_mb": _mb(a["store_mb"]),
        "access_arrow_mb": _mb(a["arrow_mb"]),
        "import_datasets_s": f"{a['import_datasets_s']:.1f}",
        "settings": " ".join(r["train_args"]),
    }


def main() -> int:
    args = parse_args()
    if args.readme_only:
        write_readme(HERE, args.out, readme_values)
        return 0
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    args.corpora.mkdir(parents=True, exist_ok=True)
    sizes = []
    for n in args.sizes:
        sizes.append(measure_size(args, n))
        print(json.dumps(sizes[-1]), flush=True)
    largest = args.corpora / "runs" / str(max(args.sizes))
    results = {
        "sizes": sizes,
        "access": access_times(largest, 120, args.rounds),
        "steps": args.steps,
        "threads": args.threads,
        "train_args": train_args(args.quick, args.threads),
        "cpus": os.cpu_count(),
        "command": command(),
        "wall_min": minutes_since(started),
    }
    write_outputs(HERE, args.out, results, readme_values, "no figure", indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
