"""Helpers shared by the experiment scripts (``experiments/NAME/run.py``).

The scripts are run as ``python experiments/NAME/run.py``, so Python puts their own folder,
not this one, on ``sys.path``; each inserts this folder first and then imports from here.

Each experiment's ``README.md`` is its ``README.template.md`` (``str.format`` fields)
filled from its ``results.json`` by the script's ``readme_values``, which computes the
verdicts; a conclusion written by hand for those results lives in ``conclusion.md`` beside
them. ``run.py --readme-only`` rewrites the README from those files without rerunning.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from matplotlib.figure import Figure

from seq2seq.config import Config, DataConfig, TrainConfig
from seq2seq.data.corpora import load_corpus
from seq2seq.run import checkpoint
from seq2seq.run.runtime import usable_cpus
from seq2seq.training.entry import train

DPI = 80
TEMPLATE = "README.template.md"
CONCLUSION = "conclusion.md"
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


def add_output_args(p: argparse.ArgumentParser, quick_help: str) -> None:
    """--quick, --out and --readme-only, which every experiment script takes."""
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", help="output folder (default: this folder; --quick: a temp folder)")
    p.add_argument(
        "--readme-only",
        action="store_true",
        help="rewrite README.md from the results.json (and conclusion.md) in --out; run nothing",
    )


def add_training_args(p: argparse.ArgumentParser, runs: str) -> None:
    """--runs, --reuse, --jobs and --train-threads, for scripts that train their own models."""
    p.add_argument(
        "--runs", default=runs, help="where the models are trained (default: %(default)s)"
    )
    p.add_argument("--reuse", action="store_true", help="keep models already trained in --runs")
    p.add_argument("--jobs", type=int, default=2, help="models trained at once (default: 2)")
    p.add_argument(
        "--train-threads",
        type=int,
        help="torch threads per model in training (default: the usable CPUs, within a CPU quota, divided by --jobs)",
    )


def train_threads(args: argparse.Namespace) -> int:
    """``--train-threads``, else the CPUs shared out among the ``--jobs`` trained at once."""
    return args.train_threads or max(1, usable_cpus() // args.jobs)


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
    """Train each config into ``runs/NAME``, ``jobs`` at a time in their own processes.
    With ``reuse``, a run that finished is kept and one that was killed is resumed exactly
    (``--resume``), so an experiment can span several sessions; without it, every run
    starts afresh."""
    todo: dict[str, tuple[Config, bool]] = {}  # name -> (config, resume)
    for name, c in configs.items():
        last = runs / name / checkpoint.LAST_FILE
        if reuse and last.is_file():
            if not checkpoint.read_tensors(last)[1].get("finished"):
                todo[name] = (c, True)
            continue
        shutil.rmtree(runs / name, ignore_errors=True)  # no stale files from an earlier run
        todo[name] = (c, False)
    with ProcessPoolExecutor(
        max(1, min(jobs, len(todo) or 1)), mp_context=get_context("spawn")
    ) as pool:
        futures = [
            pool.submit(train, c, runs / name, resume=resume, overwrite=not resume, progress=False)
            for name, (c, resume) in todo.items()
        ]
        for f in futures:
            f.result()


def last_state(run_dir: Path) -> Path:
    """The weights a finished run ended on: its newest kept state
    (``checkpoints/step_N.safetensors``; a run validates and keeps the state its budget ends
    on). What the experiments that compare models score, one rule for every model: no
    choice by validation, no averaging."""
    kept = checkpoint.kept_checkpoints(run_dir)
    if not kept:
        raise SystemExit(f"{run_dir}: no kept states in {checkpoint.KEPT_DIR}/ to score")
    return kept[-1]


def scoring_note(results: dict) -> str:
    """How a results file's models were scored, for its README: one rule for all (results
    with ``"scoring": "last state"``), or, in results from before that rule, whatever each
    run's training chose."""
    if results.get("scoring") == "last state":
        return (
            f"Every model is scored on its last state, the weights after exactly "
            f"{results['budget']} (`{checkpoint.KEPT_DIR}/step_N.safetensors`): one rule for "
            "all, no choice by validation, no averaging."
        )
    return (
        "**These results predate one scoring rule for all**: each model was scored on the "
        "weights its own training kept as best (a single state for some, an average for "
        "others: see the weights column), so seed noise and averaging are mixed; rerun pending."
    )


def model_used(run_dir: Path, weights: Path | None = None) -> dict:
    """Which model a result comes from, for the results file that quotes it: the run, the
    weights file in it (default its best, ``model.safetensors``), what those weights are (a
    step or an average), their validation BLEU and sha256, and how far the run trained
    (steps, epochs, minutes), its best validation BLEU, why it stopped and whether it
    finished (a run killed to be resumed has not)."""
    weights = weights or run_dir / checkpoint.BEST_FILE
    state = checkpoint.read_tensors(run_dir / checkpoint.LAST_FILE)[1]
    metadata = checkpoint.read_tensors(weights)[1]
    return {
        "run": str(run_dir),
        **checkpoint.weights_identity(run_dir, weights),  # weights_file, weights, sha256
        "valid_bleu": metadata.get("bleu"),
        "steps": state["step"],
        "epochs": epochs_trained(state, batches_per_step(run_dir)),
        "minutes": state["elapsed"] / 60,
        "best_valid_bleu": state["best_bleu"],
        "best_step": state["best_step"],
        "stop": state["stop_reason"],
        "finished": bool(state.get("finished")),
    }


def batches_per_step(run_dir: Path) -> int:
    """Batches a step of this run took: ``accum_steps`` per process, its last segment's
    processes (``environment.json``)."""
    accum = checkpoint.load_config_file(run_dir).train.accum_steps
    try:
        segments = json.loads((run_dir / "environment.json").read_text(encoding="utf-8"))
        processes = segments["segments"][-1]["processes"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        processes = 1
    return accum * processes


def epochs_trained(state: dict, per_step: int) -> float | None:
    """Epochs, fractions included, from a training state's counters: the epochs completed
    and the batches into the next one, measured in the completed epochs' steps (None
    before the first epoch ends, when an epoch's length is not known yet)."""
    if not state["epoch"]:
        return None
    completed_steps = state["step"] - state["batch"] / per_step
    return state["epoch"] * state["step"] / completed_steps


def budget(t: TrainConfig) -> str:
    """The training budget as the READMEs state it: minutes or steps, whichever ends the
    run first (else epochs)."""
    limits = []
    if t.max_time:
        limits.append(f"{t.max_time} min")
    if t.max_steps:
        limits.append(f"{t.max_steps} steps")
    return " or ".join(limits) or f"{t.max_epochs} epochs"


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
    here: Path,
    out: Path,
    results: dict,
    readme_values: Callable[[dict], Mapping[str, object]],
    figures: str,
    indent: int | None = None,
) -> None:
    """Write ``results.json`` and ``README.md`` into ``out`` and say so; ``figures`` names what
    else was written ("a figure", "figures"). A ``conclusion.md`` there was written for the
    results these replace, so it goes."""
    (out / "results.json").write_text(json.dumps(results, indent=indent) + "\n", encoding="utf-8")
    (out / CONCLUSION).unlink(missing_ok=True)
    write_readme(here, out, readme_values)
    print(f"wrote {out}/README.md, results.json and {figures} in {results['wall_min']:.1f} min")


def write_readme(
    here: Path, out: Path, readme_values: Callable[[dict], Mapping[str, object]]
) -> None:
    """Write ``out/README.md``: see ``readme``."""
    (out / "README.md").write_text(readme(here, out, readme_values), encoding="utf-8")


def readme(here: Path, out: Path, readme_values: Callable[[dict], Mapping[str, object]]) -> str:
    """The experiment in ``here``'s README for the results in ``out``: its template filled
    with the fields of ``out/results.json``, the values ``readme_values`` computes from them
    (tables, verdicts), and the conclusion: ``out/conclusion.md`` if someone wrote one for
    these results, else a note that it is still to be written. A conclusion may quote the
    computed values as ``{field}``s too, so that its figures come from the results.

    The results are read back from the file, so a README written after a run and one
    rewritten later from ``results.json`` alone are the same bytes."""
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    computed = readme_values(results)
    values = {**results, **computed}
    written = out / CONCLUSION
    if written.is_file():
        conclusion = {
            "conclusion_note": "written by hand from this run's numbers; a rerun resets this section",
            "conclusion": written.read_text(encoding="utf-8").strip().format_map(values),
        }
    else:
        conclusion = {
            "conclusion_note": f"to be written by hand from the numbers above, in {CONCLUSION}",
            "conclusion": "_To be completed after the full run._",
        }
    template = (here / TEMPLATE).read_text(encoding="utf-8")
    return template.format_map({**results, **conclusion, **computed})
