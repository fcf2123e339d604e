"""A run's data in a ``torchrun`` job: rank 0 prepares it (``seq2seq.data.prepare``) while the
other ranks wait (``runtime.main_first``), before any collective of the training; every rank
then checks that the store it reads was made for rank 0's key, and opens it.
"""

from __future__ import annotations

from pathlib import Path

from seq2seq.config import Config
from seq2seq.data.prepare import DATA_DIR, Prepared, key_differences, open_prepared, prepare_store
from seq2seq.data.store import read_manifest
from seq2seq.errors import Seq2SeqError
from seq2seq.run.runlog import say
from seq2seq.run.runtime import Runtime, main_first


def prepare_data(config: Config, run_dir: Path, runtime: Runtime, resume: bool) -> Prepared:
    """The run's data; rank 0 writes the tokenizer (unless resuming) and the store first."""
    directory = run_dir / DATA_DIR
    # before the training's first collective, which no rank waits in meanwhile
    key = main_first(
        runtime, lambda: prepare_store(config, run_dir, resume, lambda text: say(text, run_dir))
    )
    manifest = read_manifest(directory)
    if manifest is None and not runtime.main:  # rank 0 wrote it, but not where this rank looks
        raise Seq2SeqError(
            f"rank {runtime.rank} finds no prepared corpus in {directory}: every machine of a "
            "torchrun job must see the same run directory (put --out on a shared filesystem)"
        )
    if manifest is None:
        raise Seq2SeqError(f"{directory} holds no whole prepared corpus")
    if manifest["key"] != key:  # a stale copy of the run directory, on another machine
        raise Seq2SeqError(
            f"rank {runtime.rank} finds in {directory} a corpus prepared for another "
            f"{key_differences(manifest['key'], key)} than rank 0's: every machine of a torchrun "
            "job must see the same run directory (put --out on a shared filesystem)"
        )
    if runtime.main:
        for note in manifest["summary"]["notes"]:  # e.g. columns left out, the vocabulary sized
            say(f"note: {note}", run_dir)
    return open_prepared(run_dir, manifest)
