"""Candidate against baseline, as the records say: the trainer numerics a record ran with, and
the comparisons (mean ± sd per arm, the difference, its 95% confidence interval, a verdict),
one table per question of ``goals.yaml``.

A comparison is *paired* only when every run of both arms trained on the same machine (its bf16
flags included) with the same known trainer numerics (``numerics.yaml``) and the arms share their
seeds: its interval is the paired t's, over the per-seed differences. A run whose code is not
a commit (uncommitted changes: ``git_dirty``) or whose commit git does not know has an
"unknown" trainer and is never paired. Otherwise the table says
"unpaired" and the interval is Welch's t, from each arm's spread over its seeds. A lead is
called only when the difference lies outside its 95% interval (two-sided, t at the arms' degrees
of freedom, not 2 × SE: with 2 or 3 seeds an arm, twice the standard error is a 10-20% test);
one seed on either side is not judged. Two arms that scored the same weights (one sha256)
cannot differ: such a comparison is refused.
"""

from __future__ import annotations

import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.records import REPO, RecordError
from experiments.records.load import Training, read_json, read_yaml
from experiments.records.stats import Interval, paired_t, welch_t
from seq2seq.run.precision import PRECISIONS

NUMERICS = "numerics.yaml"  # in the results folder
UNKNOWN = "unknown"  # the trainer of code no commit names: never paired


def load_numerics(results: Path) -> list[dict[str, Any]]:
    """``numerics.yaml``: trainer versions, oldest first, each ``since`` a commit (the first
    ``null``), and, for a change that moves one precision's numbers only, that ``precision``
    (as ``environment.json`` names it: one of ``PRECISIONS``)."""
    path = results / NUMERICS
    entries = read_yaml(path) if path.is_file() else []
    if not isinstance(entries, list) or any(
        "trainer" not in e
        or "since" not in e
        or set(e) - {"since", "trainer", "precision"}
        or e.get("precision", PRECISIONS[0]) not in PRECISIONS
        for e in entries
    ):
        raise RecordError(
            f"{path}: a list of {{since: COMMIT, trainer: NAME, precision: (optional, one of "
            f"{', '.join(PRECISIONS)})}} entries"
        )
    return entries


def trainer_at(
    commit: str | None,
    numerics: list[dict[str, Any]],
    precision: str | None = None,
    repo: Path = REPO,
    dirty: bool | None = None,
) -> str:
    """The trainer numerics of a run trained at ``commit`` in ``precision``: the last entry it
    descends from (git decides) among those of every precision or of its own; "unknown"
    without a commit or a git checkout that has it, and for code ``dirty`` with changes no
    commit holds. (Records written before the flag have none: their commit decides.)"""
    if not commit or not numerics or dirty:
        return UNKNOWN
    found = UNKNOWN
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
            return UNKNOWN
    return found


def trainer_of_run(environment: dict[str, Any], numerics: list[dict[str, Any]]) -> str:
    """The trainer of each training segment of a run's ``environment.json`` (its commit,
    precision and dirty flag), once each."""
    segments = environment.get("segments", [])
    trainers = (
        trainer_at(s.get("git_commit"), numerics, s.get("precision"), dirty=s.get("git_dirty"))
        for s in segments
    )
    return " + ".join(dict.fromkeys(trainers)) or UNKNOWN


def known(trainer: str) -> bool:
    """Whether every segment's trainer is known: a run with one unknown is never paired."""
    return UNKNOWN not in trainer.split(" + ")


def record_trainer(folder: Path, numerics: list[dict[str, Any]]) -> str:
    return trainer_of_run(read_json(folder / "environment.json"), numerics)


@dataclass(frozen=True)
class Arm:
    label: str
    runs: list[Training]

    def values(self) -> list[float]:
        return [r.valid_bleu for r in self.runs]


def verdict(a: Arm, b: Arm) -> tuple[Interval | None, str]:
    """The interval of ``b`` − ``a`` (None with one seed on either side) and its verdict."""
    if paired(a, b):
        if len(a.runs) < 2:
            return None, "not judged (1 seed)"
        seeds = sorted(r.seed for r in a.runs)
        found = paired_t(*([_by_seed(arm)[s] for s in seeds] for arm in (a, b)))
    elif len(a.runs) < 2 or len(b.runs) < 2:
        return None, "not judged (1 seed), unpaired"
    else:
        found = welch_t(a.values(), b.values())
    word = ("lead" if found.diff > 0 else "behind") if abs(found.diff) > found.half_width else "tie"
    return found, word + ("" if paired(a, b) else ", unpaired")


def _by_seed(arm: Arm) -> dict[int, float]:
    return {r.seed: r.valid_bleu for r in arm.runs}


def paired(a: Arm, b: Arm) -> bool:
    runs = a.runs + b.runs
    same = len({(r.machine, r.trainer) for r in runs}) == 1 and known(runs[0].trainer)
    return same and sorted(r.seed for r in a.runs) == sorted(r.seed for r in b.runs)


COLUMNS = (
    "| case | arm | seeds | validation BLEU | difference | 95% interval | verdict "
    "| machine; trainer |\n|---|---|---|---:|---:|---|---|---|"
)


def comparisons_section(
    specs: list[dict[str, Any]], trainings: list[Training], about: dict[str, str] | None = None
) -> str:
    """The rendered comparisons: a table per question, in the order ``goals.yaml`` first
    asks each (under its ``about`` paragraph, where it has one), a block of two rows
    (baseline, candidate) per comparison."""
    about = about or {}
    if not specs:
        return "No comparisons listed yet (`comparisons:` in goals.yaml)."
    by_name = {t.name: t for t in trainings}
    tables: dict[str, list[str]] = {}
    for i, spec in enumerate(specs, 1):
        if not spec.get("question") or not spec.get("case"):
            raise RecordError(f"goals.yaml comparison {i}: needs a question and a case")
        base, cand = (_arm(spec, side, i, by_name) for side in ("baseline", "candidate"))
        _check_can_differ(base, cand, i)
        tables.setdefault(spec["question"], []).extend(_rows(spec["case"], base, cand))
    parts = [
        "\n\n".join(filter(None, [f"### {q}", about.get(q), COLUMNS + "\n" + "\n".join(rows)]))
        for q, rows in tables.items()
    ]
    return "\n\n".join([*parts, _baseline_spread(specs, by_name, trainings)])


def _baseline_spread(
    specs: list[dict[str, Any]], by_name: dict[str, Training], trainings: list[Training]
) -> str:
    """Each baseline recipe's own spread over every seed recorded of it: what a one-seed
    difference is to be read against."""
    recipes = {}
    for spec in specs:
        for name in spec["baseline"]["records"]:
            t = by_name[name]
            recipes.setdefault((t.direction, t.recipe), None)
    lines = [
        "### The baselines' own seed spread",
        "",
        "Validation BLEU of every seed recorded of each baseline recipe, on whichever machine "
        "and trainer: what a one-seed difference above is to be read against.",
        "",
        "| direction | recipe | seeds | validation BLEU | sd | max − min |",
        "|---|---|---|---:|---:|---:|",
    ]
    for direction, recipe in sorted(recipes):
        runs = sorted(
            (t for t in trainings if (t.direction, t.recipe) == (direction, recipe)),
            key=lambda t: t.seed,
        )
        values = [t.valid_bleu for t in runs]
        several = len(values) > 1
        sd = f"{statistics.stdev(values):.2f}" if several else "–"
        width = f"{max(values) - min(values):.2f}" if several else "–"
        seeds = ", ".join(str(t.seed) for t in runs)
        shown = ", ".join(f"{v:.2f}" for v in values)
        lines.append(
            f"| {direction.replace('-', '→')} | {recipe} | {seeds} | {shown} | {sd} | {width} |"
        )
    return "\n".join(lines)


def _arm(spec: dict[str, Any], side: str, i: int, by_name: dict[str, Training]) -> Arm:
    entry = spec.get(side) or {}
    missing = [n for n in entry.get("records", []) if n not in by_name]
    if missing or not entry.get("records") or "label" not in entry:
        what = f"no record {missing[0]!r}" if missing else "needs a label and records"
        raise RecordError(f"goals.yaml comparison {i} {side}: {what}")
    return Arm(entry["label"], [by_name[n] for n in entry["records"]])


def _check_can_differ(base: Arm, cand: Arm, i: int) -> None:
    """Refuse a comparison whose arms scored the same weights: it cannot differ by
    construction (a candidate that changes nothing before the weights both arms scored)."""
    shared = {r.sha256 for r in base.runs} & {r.sha256 for r in cand.runs} - {None}
    if shared:
        raise RecordError(
            f"goals.yaml comparison {i}: both arms scored the same weights (sha256 "
            f"{min(shared)[:12]}…), so they cannot differ; compare where the recipes part"
        )


def _rows(case: str, base: Arm, cand: Arm) -> list[str]:
    found, word = verdict(base, cand)
    if found is None:
        diff = statistics.mean(cand.values()) - statistics.mean(base.values())
        cells = (f"{diff:+.2f}", "–", word)
    else:
        interval = f"±{found.half_width:.2f} ({found.test}, df {found.df:.3g})"
        cells = (f"{found.diff:+.2f}", interval, word)
    rows = []
    for arm, shown in ((base, ("", "", "")), (cand, cells)):
        values = arm.values()
        mean = f"{statistics.mean(values):.2f}"
        if len(values) > 1:
            mean += f" ± {statistics.stdev(values):.2f}"
        seeds = ", ".join(str(r.seed) for r in arm.runs)
        where = "; ".join(dict.fromkeys(f"{r.machine}; {r.trainer}" for r in arm.runs))
        rows.append(
            f"| {case if arm is base else ''} | {arm.label} | {seeds} | {mean} | "
            f"{' | '.join(shown)} | {where} |"
        )
    return rows
