"""The trainer's counters, ``TrainState``, saved with every checkpoint (budget.py reads them
against the budgets), and the one-line descriptions of a run's end and of its dropout and
subword schedules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from seq2seq.config import Config


@dataclass
class TrainState:
    """The loop's counters: saved with every checkpoint, restored by ``--resume``."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0
    batch: int = 0  # batches of the current epoch already trained
    best_bleu: float = -1.0  # best validation BLEU so far, and the step it was reached
    best_step: int = 0
    patience_best: float = -1.0  # best BLEU of the scheduled validations: what patience counts from
    bad_validations: int = 0  # scheduled validations since patience_best improved
    bad_steps: int = 0  # steps skipped for a NaN/Inf loss or gradient
    scaler_skips: int = 0  # fp16 steps the loss scaler skipped: their gradients overflowed
    valid_step: int = -1  # the step last validated
    elapsed: float = 0.0  # seconds of training time, carried across resumes
    finished: bool = False  # the end-of-run scoring and averaging are done
    stop_reason: str | None = None

    @classmethod
    def from_saved(cls, counters: dict[str, Any]) -> TrainState:
        known = {f.name for f in dataclasses.fields(cls)}
        state = cls(**{k: v for k, v in counters.items() if k in known})
        if "patience_best" not in counters:  # saved before patience had its own reference
            state.patience_best = state.best_bleu
        state.stop_reason = None
        return state


# ---------------------------------------------------------------------------------------
# The end of a run, in words.


def describe_end(s: TrainState, minutes: float) -> str:
    """The end of a run in a few words: its best score (none before a validation), its length."""
    best = f"best validation BLEU {s.best_bleu:.2f} at step {s.best_step}"
    return f"{best if s.best_bleu >= 0 else 'not validated yet'}; {s.step} steps, {minutes:.1f} min"


# ---------------------------------------------------------------------------------------
# The schedules, one line each.


def describe_dropout(config: Config) -> str:
    """The dropout schedule in force, in one line: among a run's first lines."""
    full, early, (start, end) = (
        config.model.dropout,
        config.train.early_dropout,
        config.train.dropout_epochs,
    )
    if early is None or early == full:
        return f"dropout: {full:g} throughout"
    return f"dropout: {early:g} until epoch {start:g}, then rising to {full:g} at epoch {end:g}"


def describe_subwords(config: Config) -> str | None:
    """Subword regularisation in one line, when it is on."""
    alpha, (start, end) = config.data.subword_alpha, config.data.subword_epochs
    if not alpha:
        return None
    if start == end:
        return f"subwords: BPE-dropout {alpha:g} from epoch {start:g} (training pairs only)"
    return (
        f"subwords: the store's segmentation until epoch {start:g}, then BPE-dropout rising "
        f"to {alpha:g} at epoch {end:g} (training pairs only)"
    )
