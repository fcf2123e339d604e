"""Candidate against baseline, as the records say: the trainer numerics a record ran with, and
the comparisons table (mean ± sd per arm, the difference, twice its standard error, a verdict).

A comparison is *paired* only when every run of both arms trained on the same machine with the
same trainer numerics (``numerics.yaml``) and the arms share their seeds; otherwise the table
says "unpaired" and the verdict compares means alone. A lead is called only when the
difference of the means exceeds twice its standard error (sd of each arm over its seeds); one
seed on either side is not judged.
"""

from __future__ import annotations

import math
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.records import REPO, RecordError
from experiments.records.load import Training, read_json, read_yaml

NUMERICS = "numerics.yaml"  # in the results folder


def load_numerics(results: Path) -> list[dict[str, Any]]:
    """``numerics.yaml``: trainer versions, oldest first, each ``since`` a commit (the first
    ``null``), and, for a change that moves one precision's numbers only, that ``precision``
    (as ``environment.json`` names it: "bf16 autocast", "fp32")."""
    path = results / NUMERICS
    entries = read_yaml(path) if path.is_file() else []
    if not isinstance(entries, list) or any(
        "trainer" not in e or "since" not in e or set(e) - {"since", "trainer", "precision"}
        for e in entries
    ):
        raise RecordError(
            f"{path}: a list of {{since: COMMIT, trainer: NAME, precision: (optional)}} entries"
        )
    return entries


def trainer_at(
    commit: str | None,
    numerics: list[dict[str, Any]],
    precision: str | None = None,
    repo: Path = REPO,
) -> str:
    """The trainer numerics of a run trained at ``commit`` in ``precision``: the last entry it
    descends from (git decides) among those of every precision or of its own; "unknown"
    without a commit or a git checkout that has it."""
    if not commit or not numerics:
        return "unknown"
    found = "unknown"
    for entry in numerics:
        if entry.get("precision", precision) != precision:
            continue
        if entry["since"] is None:
            found = entry["trainer"]
            continue
        ancestor = subprocess.run(
            ["git", "merge-base", "--is-ancestor", entry["since"], commit],
            cwd=repo,
            capture_output=True,
        )
        if ancestor.returncode == 0:
            found = entry["trainer"]
        elif ancestor.returncode != 1:  # 128: git does not know a commit
            return "unknown"
    return found


def trainer_of_run(environment: dict[str, Any], numerics: list[dict[str, Any]]) -> str:
    """The trainer of each training segment of a run's ``environment.json`` (its commit and
    precision), once each."""
    segments = environment.get("segments", [])
    trainers = (trainer_at(s.get("git_commit"), numerics, s.get("precision")) for s in segments)
    return " + ".join(dict.fromkeys(trainers)) or "unknown"


def record_trainer(folder: Path, numerics: list[dict[str, Any]]) -> str:
    return trainer_of_run(read_json(folder / "environment.json"), numerics)


@dataclass(frozen=True)
class Arm:
    label: str
    runs: list[Training]

    def values(self) -> list[float]:
        return [r.valid_bleu for r in self.runs]


def verdict(a: list[float], b: list[float]) -> tuple[str, str, str]:
    """(difference b − a, twice its standard error, verdict) of two arms' means."""
    diff = statistics.mean(b) - statistics.mean(a)
    if len(a) < 2 or len(b) < 2:
        return f"{diff:+.2f}", "–", "not judged (1 seed)"
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    word = ("lead" if diff > 0 else "behind") if abs(diff) > 2 * se else "tie"
    return f"{diff:+.2f}", f"{2 * se:.2f}", word


def paired(a: Arm, b: Arm) -> bool:
    runs = a.runs + b.runs
    same = len({(r.machine, r.trainer) for r in runs}) == 1
    return same and sorted(r.seed for r in a.runs) == sorted(r.seed for r in b.runs)


def comparisons_table(specs: list[dict[str, Any]], trainings: list[Training]) -> str:
    """The rendered comparisons: one block of rows per ``goals.yaml`` comparison."""
    if not specs:
        return "No comparisons listed yet (`comparisons:` in goals.yaml)."
    by_name = {t.name: t for t in trainings}
    lines = [
        "| comparison | arm | seeds | validation BLEU | difference | 2 × SE | verdict | machine; trainer |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for i, spec in enumerate(specs, 1):
        arms = []
        for side in ("baseline", "candidate"):
            entry = spec.get(side) or {}
            missing = [n for n in entry.get("records", []) if n not in by_name]
            if missing or not entry.get("records") or "label" not in entry:
                what = f"no record {missing[0]!r}" if missing else "needs a label and records"
                raise RecordError(f"goals.yaml comparison {i} {side}: {what}")
            arms.append(Arm(entry["label"], [by_name[n] for n in entry["records"]]))
        base, cand = arms
        diff, two_se, word = verdict(base.values(), cand.values())
        word += "" if paired(base, cand) else ", unpaired"
        for arm, cells in ((base, ("", "", "")), (cand, (diff, two_se, word))):
            values = arm.values()
            mean = f"{statistics.mean(values):.2f}"
            if len(values) > 1:
                mean += f" ± {statistics.stdev(values):.2f}"
            seeds = ", ".join(str(r.seed) for r in arm.runs)
            where = "; ".join(dict.fromkeys(f"{r.machine}; {r.trainer}" for r in arm.runs))
            lines.append(
                f"| {spec.get('question', '') if arm is base else ''} | {arm.label} | {seeds} | "
                f"{mean} | {' | '.join(cells)} | {where} |"
            )
    return "\n".join(lines)
