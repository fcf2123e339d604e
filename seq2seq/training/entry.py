"""Training from a config file and ``--set`` overrides: what ``seq2seq train`` runs once it has
parsed its flags, and what a notebook cell calls (``seq2seq.train``); and ``train``, which
makes a run directory ready for a ``Config`` (locked, cleared, or resumed) and hands it to
the ``Trainer``.

In a notebook, ``resume=None`` (the default) resumes a run that has a checkpoint and starts
one that has none, so the cell that started a run also continues it. The kernel's stop button
sends SIGINT, which the trainer takes as ``seq2seq train`` takes Ctrl-C: it finishes the step,
saves ``last.safetensors`` and returns; running the cell again resumes from there, to the
weights an uninterrupted run reaches (``tests/test_train_entry.py``); one stopped before its
first checkpoint (while its data was prepared) starts afresh. The progress bar is
``tqdm.auto``'s: a widget where ipywidgets is installed, text otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2seq.config import Config, config_from_dict, given_values
from seq2seq.run import checkpoint, rundir
from seq2seq.run.runlog import say
from seq2seq.run.runtime import barrier, setup_runtime
from seq2seq.training.budget import already_finished, budgets_of, nothing_to_train, resume_config
from seq2seq.training.trainer import Trainer


def train_run(
    out: str | Path,
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    flags: dict[str, Any] | None = None,
    resume: bool | None = None,
    overwrite: bool = False,
    tensorboard: bool = False,
    progress: bool = True,
    words: rundir.Words = rundir.ARGUMENTS,
) -> dict[str, Any]:
    """Train the YAML ``config`` (None: the defaults) with ``overrides`` such as
    ``"train.lr=5e-4"`` (``--set``'s) over ``flags`` (values by dotted key, such as
    ``{"train.seed": 5}`` from ``seq2seq train``'s flags) into ``out``; returns the final
    counters (best BLEU, step, stop reason). ``resume``: True continues the run in ``out`` (its recipe, the
    budgets given here), False starts one, None resumes where ``out`` holds a checkpoint
    (and ``overwrite`` is not asked). Bad input raises ``Seq2SeqError``, whose message
    names these arguments, or the command line's flags when ``words`` says so."""
    out = Path(out)
    if resume is None:
        resume = not overwrite and (out / checkpoint.LAST_FILE).is_file()
    given = given_values(config, list(overrides), flags)
    return train(
        config_from_dict(given),  # checks every value given, on resume too
        out,
        resume=resume,
        overwrite=overwrite,
        tensorboard=tensorboard,
        progress=progress,
        words=words,
        given=given,
    )


def train(
    config: Config,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    tensorboard: bool = False,
    progress: bool = True,
    words: rundir.Words = rundir.ARGUMENTS,
    given: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``config`` into ``run_dir``; returns the final counters (best BLEU, step, reason).

    With ``resume``, the recipe comes from the run's saved config and only the budgets
    (``budget.RESUME_BUDGETS``) from ``given``, the values set (``train_run``'s, whose
    recipe values a note names as ignored), or, without it, from ``config``. A finished run
    that they leave nothing to train is not written at all; one that trains further loses
    ``seq2seq evaluate``'s scores when it first replaces the weights they scored
    (``Validation.replacing_weights``).
    """
    run_dir = Path(run_dir)
    if resume and (run_dir / checkpoint.LAST_FILE).is_file():  # merged once, before the
        # runtime, whose device and threads are budgets: the saved ones unless given
        config, ignored = resume_config(run_dir, budgets_of(config) if given is None else given)
        if ignored:
            say(f"note: {words.resume} keeps the run's recipe; ignored: {', '.join(ignored)}")
    runtime = setup_runtime(
        config.train.device, config.train.threads, config.train.attention_kernels
    )
    # rank 0 holds the directory; a run of ours stopped before its first checkpoint has
    # nothing to resume, and starts afresh
    held = rundir.claimed(run_dir, resume, overwrite, words) if runtime.main else None
    with held or contextlib.nullcontext(False) as afresh:
        barrier(runtime)
        if afresh:
            say(f"note: {run_dir} stopped before its first checkpoint; starting it afresh", run_dir)
        if resume:
            finished = nothing_to_train(run_dir, config.train)
            if finished:  # said before anything is written: the run stays as it was
                if runtime.main:
                    say(already_finished(run_dir, finished.stop_reason))
                return dataclasses.asdict(finished)
        state = Trainer(config, run_dir, runtime, resume, tensorboard, progress).run()
        if runtime.main and state.stop_reason.startswith("signal"):
            say(f"to continue it, {words.again} with {words.resume}", run_dir)
        return dataclasses.asdict(state)
