"""Helpers shared by the experiment scripts (``experiments/NAME/run.py``).

The scripts are run as ``python experiments/NAME/run.py``, so Python puts their own folder,
not this one, on ``sys.path``; each inserts this folder first and then imports from here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from matplotlib.figure import Figure

from seq2seq import checkpoint
from seq2seq.config import Config, DataConfig, TrainConfig
from seq2seq.corpora import load_corpus
from seq2seq.train import train

DPI = 80
# --quick: tiny data and model; each script adds its own ``train.*`` settings.
QUICK_MODEL = [
    "data.data=sample",
    "data.vocab_size=100",
    "data.max_tokens=256",
    "data.max_len=60",
    "model.d_model=32",
    "model.n_heads=4",
    "model.d_ff=64",
    "model.n_enc_layers=2",
    "model.n_dec_layers=2",
    "model.max_positions=64",
]


def output_dir(p: argparse.ArgumentParser, out: str | None, quick: bool, here: Path) -> Path:
    """The folder an experiment writes into: ``--out``, else its own folder ``here``; with
    ``--quick``, ``--out`` or a fresh temporary folder, never ``here``."""
    if quick:
        path = Path(out or tempfile.mkdtemp(prefix=f"{here.name}-"))
        if path.resolve() == here:
            p.error("--quick must not write into the experiment folder")
        return path
    return Path(out or here)


def train_all(configs: dict[str, Config], runs: Path, reuse: bool, jobs: int) -> None:
    """Train each config into ``runs/NAME``, ``jobs`` at a time in their own processes."""
    todo = {
        name: c
        for name, c in configs.items()
        if not (reuse and (runs / name / checkpoint.BEST_FILE).is_file())
    }
    for name in todo:
        shutil.rmtree(runs / name, ignore_errors=True)  # no stale files from an earlier run
    with ProcessPoolExecutor(
        max(1, min(jobs, len(todo) or 1)), mp_context=get_context("spawn")
    ) as pool:
        futures = [
            pool.submit(train, c, runs / name, overwrite=True, progress=False)
            for name, c in todo.items()
        ]
        for f in futures:
            f.result()


def training_summary(run_dir: Path, best_step: bool = False) -> dict:
    """Steps, minutes, best validation BLEU (and, if asked, its step) and stop reason of a
    finished run."""
    state = checkpoint.read_tensors(run_dir / checkpoint.LAST_FILE)[1]
    summary = {
        "steps": state["step"],
        "minutes": state["elapsed"] / 60,
        "valid_bleu": state["best_bleu"],
    }
    if best_step:
        summary["best_step"] = state["best_step"]
    summary["stop"] = state["stop_reason"]
    return summary


def budget(t: TrainConfig) -> str:
    """The training budget as the READMEs state it: minutes, else steps."""
    return f"{t.max_time} min" if t.max_time else f"{t.max_steps} steps"


def load_pairs(d: DataConfig, split: str = "test") -> list[tuple[str, str]]:
    """(source, reference) pairs of one split of the corpus ``d`` names."""
    return load_corpus(d.data, d.src, d.tgt, d.test_split, d.carve_valid, d.carve_test).splits[
        split
    ]


def minutes_since(started: float) -> float:
    """Wall minutes since ``started`` (a ``time.time()``)."""
    return (time.time() - started) / 60


def command() -> str:
    """The command line this script was run with."""
    return "python " + " ".join(sys.argv)


def save_figure(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)


def write_outputs(
    out: Path,
    results: dict,
    readme: Callable[[dict], str],
    figures: str,
    indent: int | None = None,
) -> None:
    """Write ``results.json`` and ``README.md`` (``readme(results)``) into ``out`` and say so;
    ``figures`` names what else was written ("a figure", "figures")."""
    (out / "results.json").write_text(json.dumps(results, indent=indent) + "\n", encoding="utf-8")
    (out / "README.md").write_text(readme(results), encoding="utf-8")
    print(f"wrote {out}/README.md, results.json and {figures} in {results['wall_min']:.1f} min")
