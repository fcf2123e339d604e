"""A run's budgets, each rule stated once: why a run is spent (patience, steps, time, epochs),
the share of its budget used (the learning rate's cool-down reads it), the time left (the
progress bar's), and what a resume may change: the recipe its ``config.yaml`` holds (model,
data, seed, optimizer, schedule, loss) stays, and of what is given now the budgets alone count.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from seq2seq.config import Config, TrainConfig, budget_rule, config_from_dict, config_to_dict
from seq2seq.run import checkpoint
from seq2seq.training.state import TrainState

# What a resumed run may take from its command line (budgets, stopping, logging, hardware);
# the recipe (model, data, seed, optimizer, schedule, loss) comes from its config.yaml.
RESUME_BUDGETS = (
    "max_epochs",
    "max_time",
    "max_steps",
    "patience",
    "max_bad_steps",
    "validate_every",
    "cooldown_validate_every",
    "save_every",
    "cuda_graphs",
    "valid_bleu_sentences",
    "log_every",
    "attention_sentences",
    "threads",
    "device",
)


def spent(s: TrainState, t: TrainConfig, elapsed: float | None) -> str | None:
    """Why the budgets ``t`` say a run with the counters ``s`` is spent, or None: patience,
    then steps, then time (when ``elapsed``, the seconds trained, is given), then epochs,
    which count once an epoch has ended."""
    if s.bad_validations >= t.patience:
        return f"no BLEU improvement in {t.patience} validations"
    if t.max_steps is not None and s.step >= t.max_steps:
        return f"max_steps {t.max_steps}"
    if elapsed is not None and time_left(t, elapsed) == 0:
        return f"max_time {t.max_time:g} min"
    if s.epoch >= t.max_epochs:
        return f"max_epochs {t.max_epochs}"
    return None


def time_left(t: TrainConfig, elapsed: float) -> float | None:
    """Seconds left of the time budget after ``elapsed`` seconds trained; None without one."""
    return max(0.0, t.max_time * 60 - elapsed) if t.max_time else None


def used(s: TrainState, t: TrainConfig, elapsed: float) -> float:
    """The share of the budget spent (0 to 1): of ``max_time`` where there is one, else of
    ``max_steps``; 0 where neither is set (an epoch budget or patience alone)."""
    if t.max_time:
        return elapsed / (t.max_time * 60)
    return s.step / t.max_steps if t.max_steps else 0.0


class Clock:
    """Seconds trained, earlier segments of a resumed run included, on a monotonic clock: a
    suspended laptop or a clock step does not count as training. ``agreed``: rank 0's reading
    as the ranks last exchanged it, which the time budget and the cool-down read."""

    def __init__(self, trained: float) -> None:
        self.started = time.monotonic() - trained
        self.agreed = trained

    def elapsed(self) -> float:
        """This rank's reading."""
        return time.monotonic() - self.started


# ---------------------------------------------------------------------------------------
# A resume.


def resume_config(run_dir: Path, given: dict[str, Any]) -> tuple[Config, list[str]]:
    """The saved config of the run in ``run_dir`` with the budgets the user gave on top.

    ``given`` holds only the values set (nested by section, as in YAML): the command line's,
    or ``budgets_of`` a config. Returns the config and the ``section.key`` names of the recipe
    values given, which a resumed run ignores.
    """
    saved = config_to_dict(checkpoint.load_config_file(run_dir))
    ignored = []
    for section, values in budget_rule(given).items():
        for key, value in (values or {}).items() if isinstance(values, dict) else ():
            if section == "train" and key in RESUME_BUDGETS:
                saved["train"][key] = value
            elif saved.get(section, {}).get(key, object()) != value:
                ignored.append(f"{section}.{key}")
    return config_from_dict(saved), ignored


def budgets_of(config: Config) -> dict[str, Any]:
    """Every budget of ``config``, nested as ``resume_config`` takes what is given."""
    return {"train": {name: getattr(config.train, name) for name in RESUME_BUDGETS}}


def nothing_to_train(run_dir: Path, t: TrainConfig) -> TrainState | None:
    """The saved state of a finished run that the budgets ``t`` end where it is, its stop
    reason set; None when there is training left. Read from ``last.safetensors`` alone."""
    s = TrainState.from_saved(checkpoint.read_tensors(run_dir / checkpoint.LAST_FILE)[1])
    if not s.finished:
        return None
    s.stop_reason = spent(s, t, s.elapsed)
    return s if s.stop_reason else None


def already_finished(run_dir: Path, reason: str) -> str:
    return (
        f"the run in {run_dir} is already finished ({reason}); nothing to do "
        "(a larger budget on the command line trains it further)"
    )
