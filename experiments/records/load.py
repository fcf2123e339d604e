"""Reading the committed records: what training and validation say apart from the test
scores, so that a table can be given the one without the other."""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from experiments.records import BENCHMARK, GOALS, RECORD, RecordError
from seq2seq.config import Config, config_to_dict, merge_values

# record.json fields every record has (``collect`` writes them).
FIELDS = (
    "name",
    "recipe",
    "seed",
    "direction",
    "budget",
    "steps",
    "epochs",
    "minutes",
    "weights",
    "valid_bleu",
    "scores",
)
# Config settings that may differ between the seeds of one recipe: the seed, and how the
# machine ran it (the precision as asked: what it resolved to is environment.json's, in the
# machine column of every table).
NOT_RECIPE = {
    "train": (
        "seed",
        "threads",
        "device",
        "precision",
        "prefetch",
        "log_every",
        "attention_sentences",
    )
}


@dataclass(frozen=True)
class Training:
    """A run as training and validation saw it: everything the tuning table may use."""

    name: str
    recipe: str
    direction: str
    seed: int
    budget: str
    steps: int
    epochs: float | None
    minutes: float
    weights: str  # the scored weights: "step N" or "average of steps A–B"
    valid_bleu: float  # of the scored weights
    valid_loss: float  # at the last validation
    by_epoch: dict[str, float]  # validation BLEU: "1", "2", … (first after each epoch), "end"
    machine: str = ""  # "AMD EPYC (avx512_bf16), bf16 autocast, 2 threads": each segment's
    trainer: str = "unknown"  # the trainer's numerics (numerics.yaml), as collect recorded it
    sha256: str | None = None  # of the scored weights (records before collect hashed: None)


@dataclass(frozen=True)
class Tested:
    """A run with the test scores of its scored weights, by search ("greedy", "beam 5")."""

    training: Training
    test: dict[str, dict[str, Any]]


def plain(description: str) -> str:
    """A corpus description with directories dropped from its paths ('parallel text files
    in /home/x/data/multi30k, de-en' -> '... in multi30k, de-en'): the same corpus on two
    machines reads the same."""
    return re.sub(r"(?<!\S)/(?:[^\s,/]+/)*", "", description)


def read_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path))
    except ValueError as e:
        raise RecordError(f"{path}: not JSON ({e})") from None


def read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(read_text(path))
    except yaml.YAMLError as e:
        raise RecordError(f"{path}: not YAML ({str(e).splitlines()[0]})") from None


def read_text(path: Path) -> str:
    """A committed text file, or its gzipped form ``NAME.gz``."""
    if path.is_file():
        return path.read_text(encoding="utf-8")
    packed = path.with_name(path.name + ".gz")
    if packed.is_file():
        return gzip.decompress(packed.read_bytes()).decode("utf-8")
    raise RecordError(f"{path}: missing")


def record_dirs(results: Path) -> tuple[list[Path], list[Path]]:
    """The run records and the benchmark records under ``results``, by name."""
    runs, benchmarks = [], []
    for folder in sorted(p for p in results.iterdir() if p.is_dir() and p.name[0] != "."):
        if (folder / RECORD).is_file():
            runs.append(folder)
        elif (folder / BENCHMARK).is_file():
            benchmarks.append(folder)
        else:
            raise RecordError(f"{folder}: neither {RECORD} nor {BENCHMARK}")
    return runs, benchmarks


def record_of(folder: Path) -> dict[str, Any]:
    """``record.json``, with every field ``FIELDS`` names."""
    record = read_json(folder / RECORD)
    for field in FIELDS:
        if field not in record:
            raise RecordError(f"{folder / RECORD}: no '{field}' field")
    return record


def load_training(folder: Path) -> Training:
    """A record's training and validation facts; its test scores are not read."""
    r = record_of(folder)
    valid = [row for row in metrics_rows(folder) if row["kind"] == "valid"]
    if not valid:
        raise RecordError(f"{folder}/metrics.jsonl: no validation rows")
    if any(key not in row for row in valid for key in ("epoch", "loss", "bleu")):
        raise RecordError(f"{folder}/metrics.jsonl: a validation row without epoch, loss or bleu")
    by_epoch: dict[str, float] = {}
    for row in valid:
        if row["epoch"] >= 1:
            by_epoch.setdefault(str(row["epoch"]), row["bleu"])
    by_epoch["end"] = valid[-1]["bleu"]
    return Training(
        name=r["name"],
        recipe=r["recipe"],
        direction=r["direction"],
        seed=r["seed"],
        budget=r["budget"],
        steps=r["steps"],
        epochs=r["epochs"],
        minutes=r["minutes"],
        weights=r["weights"],
        valid_bleu=r["valid_bleu"],
        valid_loss=valid[-1]["loss"],
        by_epoch=by_epoch,
        machine=_machine(folder),
        trainer=r.get("trainer", "unknown"),
        sha256=r.get("sha256"),
    )


def _machine(folder: Path) -> str:
    """The CPU (or device), precision and threads each segment of training ran with, once
    each: seeds of one recipe may run on different machines, and a time budget trains as many
    steps as the machine affords."""
    segments = read_json(folder / "environment.json").get("segments", [])
    return " + ".join(dict.fromkeys(_segment_machine(s) for s in segments))


def _segment_machine(segment: dict[str, Any]) -> str:
    """``"AMD EPYC (avx512_bf16), bf16 autocast, 2 threads"``: one segment of
    ``environment.json``. A CPU's bf16 flags are part of it: one model name covers hosts
    with AMX, with AVX512-BF16 and with neither, and their bf16 kernels differ."""
    device, threads = segment.get("device"), segment.get("threads")
    where = f"{segment.get('cpu')} ({_bf16_flags(segment)})" if device == "cpu" else device
    return f"{where}, {segment.get('precision')}, {threads} thread{'' if threads == 1 else 's'}"


def _bf16_flags(segment: dict[str, Any]) -> str:
    flags = segment.get("cpu_bf16_flags")
    if flags is None:
        return "bf16 flags not recorded"
    return ", ".join(flags) or "no bf16 flags"


def commit_of(env: dict[str, Any]) -> str:
    """The commit a record names, short, and whether the code had changes it does not hold."""
    commit = (env.get("git_commit") or "unknown")[:10]
    return commit + " with uncommitted changes" * bool(env.get("git_dirty"))


def metrics_rows(folder: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s rows; a step logged twice (a resumed run) counts once, the last."""
    rows: dict[tuple[str, int], dict] = {}
    for n, line in enumerate(read_text(folder / "metrics.jsonl").splitlines(), 1):
        try:
            row = json.loads(line)
            rows[(row["kind"], row["step"])] = row
        except (ValueError, KeyError, TypeError):
            raise RecordError(f"{folder}/metrics.jsonl line {n}: not a metrics row") from None
    return sorted(rows.values(), key=lambda row: row["step"])


def load_tested(folder: Path, training: Training) -> Tested | None:
    """The record's test scores, or None for a record without any (a sweep run)."""
    files = record_of(folder)["scores"].get("test", {})
    if not files:
        return None
    return Tested(training, {label: read_json(folder / f) for label, f in files.items()})


def recipe_config(folder: Path) -> dict[str, Any]:
    """The record's config without the settings seeds of one recipe may differ in, over
    today's defaults: a setting added after the record was made reads as its default, which
    a new setting's default keeps the old behaviour by (``data.pad_to_buckets: false`` is
    what a run before it did)."""
    config = merge_values(config_to_dict(Config()), read_yaml(folder / "config.yaml") or {})
    for section, keys in NOT_RECIPE.items():
        for key in keys:
            config.get(section, {}).pop(key, None)
    return config


def load_goals(results: Path) -> dict[str, Any]:
    """``goals.yaml``: ``min_seeds``, a list of goals (direction, recipe, metric, at_least),
    ``headline``, the recipes the README's table shows (None: every recipe), the
    ``comparisons`` and ``about``, a paragraph on a comparison's question (what it asks and
    why); no goals when the file is absent."""
    path = results / GOALS
    if not path.is_file():
        return {"min_seeds": 1, "goals": [], "headline": None, "comparisons": [], "about": {}}
    goals = read_yaml(path) or {}
    for i, goal in enumerate(goals.get("goals", []), 1):
        for field in ("direction", "recipe", "metric", "at_least"):
            if field not in goal:
                raise RecordError(f"{path}: goal {i} has no '{field}'")
    headline = goals.get("headline")
    if headline is not None and not (
        isinstance(headline, list) and all(isinstance(r, str) for r in headline)
    ):
        raise RecordError(f"{path}: headline must be a list of recipe labels")
    comparisons = goals.get("comparisons", [])
    if not isinstance(comparisons, list):
        raise RecordError(f"{path}: comparisons must be a list")
    about = goals.get("about", {})
    asked = {c.get("question") for c in comparisons}
    if not isinstance(about, dict) or set(about) - asked:
        raise RecordError(f"{path}: about maps a comparison's question to a paragraph on it")
    return {
        "min_seeds": goals.get("min_seeds", 1),
        "goals": goals.get("goals", []),
        "headline": headline,
        "comparisons": comparisons,
        "about": about,
    }
