"""The results, goals and tuning tables, from loaded records.

The tuning table is given ``Training`` facts only (validation, steps, time): it cannot
show a test score, so recipes are compared on validation alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from experiments.records import RecordError
from experiments.records.load import Tested, Training


@dataclass(frozen=True)
class Metric:
    label: str
    digits: int
    value: Callable[[Tested], float | None]


def _score(search: str, key: str) -> Callable[[Tested], float | None]:
    return lambda t: t.test[search].get(key) if search in t.test else None


METRICS = {
    "bleu_greedy": Metric("test BLEU greedy", 2, _score("greedy", "bleu")),
    "bleu_beam5": Metric("test BLEU beam 5", 2, _score("beam 5", "bleu")),
    "bleu_lit_beam5": Metric(
        "test BLEU, literature scale, beam 5", 2, _score("beam 5", "bleu_lc_norm_tok")
    ),
    "chrf_greedy": Metric("test chrF2 greedy", 2, _score("greedy", "chrf")),
    "chrf_beam5": Metric("test chrF2 beam 5", 2, _score("beam 5", "chrf")),
    "epochs": Metric("epochs", 1, lambda t: t.training.epochs),
    "steps": Metric("steps", 0, lambda t: t.training.steps),
    "minutes": Metric("minutes", 1, lambda t: t.training.minutes),
}
# the README's columns; steps, because a time budget trains as many as the CPU affords
COMPACT = ("steps", "bleu_greedy", "bleu_beam5", "bleu_lit_beam5")


def arrow(direction: str) -> str:
    return direction.replace("-", "→")


def mean_sd(values: list[float], digits: int) -> str:
    """'39.10 ± 0.14' over several values, '39.22' for one, '–' for none."""
    if not values:
        return "–"
    mean = f"{statistics.mean(values):,.{digits}f}"
    return mean if len(values) == 1 else f"{mean} ± {statistics.stdev(values):,.{digits}f}"


def spread(values: list[float], digits: int, each: bool = True) -> str:
    """``mean_sd`` labelled: '39.22 (1 seed)', or with each seed's value when ``each``."""
    text = mean_sd(values, digits)
    if len(values) == 1:
        return f"{text} (1 seed)"
    if each and values:
        return f"{text} ({', '.join(f'{v:,.{digits}f}' for v in values)})"
    return text


def groups(items: Iterable, key: Callable) -> dict[tuple[str, str], list]:
    """Items by (direction, recipe), each group in seed order; a seed twice is an error."""
    found: dict[tuple[str, str], list] = {}
    for item in items:
        found.setdefault(key(item), []).append(item)
    for (direction, recipe), members in found.items():
        seeds = [_training(m).seed for m in members]
        if len(set(seeds)) < len(seeds):
            names = ", ".join(_training(m).name for m in members)
            raise RecordError(f"recipe {recipe} ({direction}) has a seed twice among {names}")
        members.sort(key=lambda m: _training(m).seed)
    return dict(sorted(found.items()))


def _training(item: Tested | Training) -> Training:
    return item.training if isinstance(item, Tested) else item


def by_recipe(item: Tested | Training) -> tuple[str, str]:
    t = _training(item)
    return t.direction, t.recipe


def values(runs: list[Tested], metric: str) -> list[float]:
    return [v for v in (METRICS[metric].value(t) for t in runs) if v is not None]


def results_table(runs: list[Tested], heads: list[str] | None = None) -> str:
    """Results: a row per figure (test scores, training, the scored weights, validation BLEU
    after each epoch and at the end), a column per run (``heads``, or "seed N": the seeds of
    one recipe, with their mean ± sd before them where there are several)."""
    several = len(runs) > 1 and heads is None
    rows = [_figure_row(m.label, m.digits, [m.value(t) for t in runs]) for m in METRICS.values()]
    rows.append(["trained on", "", *(t.training.machine for t in runs)])
    rows.append(["trainer", "", *(t.training.trainer for t in runs)])
    rows.append(["scored weights", "", *(t.training.weights for t in runs)])
    rows.append(["test scores tied to them", "", *(_tied(t) for t in runs)])
    scored = [t.training.valid_bleu for t in runs]
    rows.append(_figure_row("validation BLEU of the scored weights", 2, scored))
    rows += [
        _figure_row(f"validation BLEU, {'end' if c == 'end' else f'epoch {c}'}", 2, by_epoch)
        for c, by_epoch in _epochs(runs)
    ]
    heads = heads or [f"seed {t.training.seed}" for t in runs]
    head = ["", f"mean ± sd, {len(runs)} seeds", *heads]
    table = [head, ["---", *["---:"] * (len(head) - 1)], *rows]
    if not several:  # each column is a figure of its own: no mean beside them
        table = [[cells[0], *cells[2:]] for cells in table]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in table)


def _tied(run: Tested) -> str:
    """Whether every test scores file names the sha256 of the weights it scored (which the
    suite checks against the record's); scores an older ``seq2seq evaluate`` wrote do not."""
    if all("sha256" in scores for scores in run.test.values()):
        return "by sha256"
    return "no: scored before scores named their weights"


def _figure_row(label: str, digits: int, found: list[float | None]) -> list[str]:
    """A label, the mean ± sd of the values present (how many, when some are not), and
    each value ('–' where missing)."""
    present = [v for v in found if v is not None]
    mean = mean_sd(present, digits)
    if 0 < len(present) < len(found):
        mean += f" (n = {len(present)})"
    return [label, mean, *("–" if v is None else f"{v:,.{digits}f}" for v in found)]


def _epochs(runs: list[Tested]) -> list[tuple[str, list[float | None]]]:
    """Validation BLEU per epoch column ("1", "2", …, "end"), one value or None per seed."""
    n = max(len(t.training.by_epoch) - 1 for t in runs)
    columns = [str(i) for i in range(1, n + 1)] + ["end"]
    return [(c, [t.training.by_epoch.get(c) for t in runs]) for c in columns]


def goal_lines(
    goals: dict, tested: dict[tuple[str, str], list[Tested]], direction: str | None = None
) -> list[str]:
    """'goal met' or not for each goal (of ``direction``, if given), from the mean over the
    recipe's seeds."""
    lines = []
    for g in goals["goals"]:
        if direction not in (None, g["direction"]):
            continue
        if g["metric"] not in METRICS:
            raise RecordError(f"goal metric {g['metric']!r}: one of {', '.join(METRICS)}")
        what = f"{arrow(g['direction'])}, {g['recipe']}, {METRICS[g['metric']].label} ≥ {g['at_least']}"
        found = values(tested.get((g["direction"], g["recipe"]), []), g["metric"])
        lines.append(f"- {what}: {_goal_verdict(found, g['at_least'], goals['min_seeds'])}")
    return lines


def _goal_verdict(found: list[float], goal: float, min_seeds: int) -> str:
    if not found:
        return "no record yet"
    mean = statistics.mean(found)
    seeds = f"{len(found)} seed{'s' * (len(found) > 1)}"
    if len(found) < min_seeds:
        return f"not decided: mean {mean:.2f} over {seeds}; the goal counts ≥ {min_seeds} seeds"
    verdict = "**met**" if mean >= goal else "not met"
    return f"{verdict} (mean {mean:.2f} over {seeds})"


def tuning_table(trainings: list[Training]) -> str:
    """Every recipe tried, by direction and then validation BLEU (best first): validation
    BLEU of the scored weights and loss at the end (mean ± sd over seeds), epochs, steps,
    minutes, the machines. Given ``Training`` facts only: no test score can reach it."""
    if not trainings:
        return "No run records yet."
    rows = []
    for (direction, recipe), runs in groups(trainings, by_recipe).items():
        bleu = [t.valid_bleu for t in runs]
        rows.append((direction, -statistics.mean(bleu), recipe, runs, bleu))
    lines = [
        "| direction | recipe | seeds | budget | validation BLEU | validation loss at the end "
        "| epochs | steps | minutes | trained on |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for direction, _, recipe, runs, bleu in sorted(rows, key=lambda r: r[:3]):
        epochs = [t.epochs for t in runs if t.epochs is not None]
        cells = [
            spread(bleu, 2),
            mean_sd([t.valid_loss for t in runs], 3),
            mean_sd(epochs, 1),
            mean_sd([t.steps for t in runs], 0),
            mean_sd([t.minutes for t in runs], 1),
            "; ".join(dict.fromkeys(t.machine for t in runs)),
        ]
        seeds = ", ".join(str(t.seed) for t in runs)
        budgets = ", ".join(sorted({t.budget for t in runs}))
        lines.append(
            f"| {arrow(direction)} | {recipe} | {seeds} | {budgets} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def compact_table(tested: dict[tuple[str, str], list[Tested]]) -> str:
    """The README's table: per direction and budget, the seeds and the test BLEU columns,
    mean ± sd, and what trained each seed: a letter per machine and trainer, named below the
    table (a row may pool several). Recipes that share a name before their budget
    (``name; budget``) are named once, above the table."""
    if not tested:
        return "No test results recorded yet."
    names = {recipe.rpartition("; ")[0] for _, recipe in tested}
    shared = names.pop() if len(names) == 1 and "" not in names else None
    lines = [f"Recipe: {shared}.", ""] if shared else []
    column = "budget" if shared else "recipe"
    lines += [
        f"| direction | {column} | seeds | "
        + " | ".join(METRICS[k].label for k in COMPACT)
        + " | trained on |",
        "|---|---|---|" + "---:|" * len(COMPACT) + "---|",
    ]
    letters: dict[str, str] = {}
    for (direction, recipe), runs in tested.items():
        cells = [spread(values(runs, k), METRICS[k].digits, each=False) for k in COMPACT]
        shown = recipe.rpartition("; ")[2] if shared else recipe
        lines.append(
            f"| {arrow(direction)} | {shown} | {len(runs)} | "
            + " | ".join(cells)
            + f" | {_trained_on(runs, letters)} |"
        )
    legend = " ".join(f"{letter}: {where}." for where, letter in letters.items())
    return "\n".join([*lines, "", legend])


def _trained_on(runs: list[Tested], letters: dict[str, str]) -> str:
    """'A (seeds 1, 2), B (seed 3)': each machine and trainer's letter (given in ``letters``
    the first time one is seen) and the seeds it trained."""
    seeds: dict[str, list[int]] = {}
    for t in runs:
        where = f"{t.training.machine}; {t.training.trainer}"
        letter = letters.setdefault(where, chr(ord("A") + len(letters)))
        seeds.setdefault(letter, []).append(t.training.seed)
    return ", ".join(
        f"{letter} (seed{'s' * (len(s) > 1)} {', '.join(map(str, s))})"
        for letter, s in seeds.items()
    )
