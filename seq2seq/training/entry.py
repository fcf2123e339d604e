"""Training from a config file and ``--set`` overrides: what ``seq2seq train`` runs once it has
parsed its flags, and what a notebook cell calls (``seq2seq.train``).

In a notebook, ``resume=None`` (the default) resumes a run that has a checkpoint and starts
one that has none, so the cell that started a run also continues it. The kernel's stop button
sends SIGINT, which the trainer takes as ``seq2seq train`` takes Ctrl-C: it finishes the step,
saves ``last.safetensors`` and returns; running the cell again resumes from there, to the
weights an uninterrupted run reaches (``tests/test_train_entry.py``); one stopped before its
first checkpoint (while its data was prepared) starts afresh. The progress bar is
``tqdm.auto``'s: a widget where ipywidgets is installed, text otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2seq.config import config_from_dict, given_values
from seq2seq.run import checkpoint
from seq2seq.run.runlog import say
from seq2seq.training import trainer
from seq2seq.training.resume import resume_config


def train_run(
    out: str | Path,
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    resume: bool | None = None,
    overwrite: bool = False,
    tensorboard: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Train the YAML ``config`` (None: the defaults) with ``overrides`` such as
    ``"train.lr=5e-4"`` (``--set``'s) into ``out``; returns the final counters (best BLEU,
    step, stop reason). ``resume``: True continues the run in ``out`` (its recipe, the
    budgets given here), False starts one, None resumes where ``out`` holds a checkpoint
    (and ``overwrite`` is not asked). Bad input raises ``Seq2SeqError``."""
    out = Path(out)
    if resume is None:
        resume = not overwrite and (out / checkpoint.LAST_FILE).is_file()
    given = given_values(config, list(overrides))
    cfg = config_from_dict(given)  # checks every value given, on resume too
    if resume and (out / checkpoint.CONFIG_FILE).is_file():
        cfg, ignored = resume_config(out, given)
        if ignored:
            say(f"note: --resume keeps the run's recipe; ignored: {', '.join(ignored)}")
    return trainer.train(
        cfg, out, resume=resume, overwrite=overwrite, tensorboard=tensorboard, progress=progress
    )
