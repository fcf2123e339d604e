"""seq2seq: a small encoder-decoder Transformer translation toolkit.

The names a user of the Python API needs are here (``docs/python_api.md``); everything else
is reachable by its subpackage path. The folders, bottom to top (a layer imports only the
layers below it; ``pyproject.toml``'s import-linter contract checks it):

    config, config_checks, errors, fileio, vocab, version   the foundation every layer may use
    data/       corpora, tokenizer, store, batches
    model/      attention -> layers -> transformer (Seq2Seq: encode, decode)
    run/        the run directory, device and threads, precision, run records
    decoding/   search, translate, evaluate, export
    drawing/    attention heatmaps, words from subwords
    training/   the trainer, validation, optimiser, curves
    inspect/    a sentence's record, influence, interventions
    explorer/   the attention report, the explorer page, the server, the notebook
    commands/   the command line

The names below are imported when first used, so ``import seq2seq`` stays light (torch,
sentencepiece and matplotlib load with the first name that needs them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seq2seq.version import __version__

if TYPE_CHECKING:
    from seq2seq.config import Config, DecodeConfig
    from seq2seq.decoding.evaluate import score
    from seq2seq.decoding.translate import Translation, Translator
    from seq2seq.drawing.plotting import plot_attention
    from seq2seq.drawing.words import WORDS_NOTE, merge_words, words_of
    from seq2seq.errors import Seq2SeqError
    from seq2seq.explorer.notebook import Inspection, InterventionResult, LoadedRun, load
    from seq2seq.training.entry import train_run as train
    from seq2seq.vocab import EOS_ID

__all__ = [
    "EOS_ID",
    "WORDS_NOTE",
    "Config",
    "DecodeConfig",
    "Inspection",
    "InterventionResult",
    "LoadedRun",
    "Seq2SeqError",
    "Translation",
    "Translator",
    "__version__",
    "load",
    "merge_words",
    "plot_attention",
    "score",
    "train",
    "words_of",
]


def __getattr__(name: str):
    # One explicit import per name, so the layers contract sees each of them.
    if name in ("Config", "DecodeConfig"):
        from seq2seq import config as module
    elif name == "score":
        from seq2seq.decoding import evaluate as module
    elif name in ("Translation", "Translator"):
        from seq2seq.decoding import translate as module
    elif name == "plot_attention":
        from seq2seq.drawing import plotting as module
    elif name in ("WORDS_NOTE", "merge_words", "words_of"):
        from seq2seq.drawing import words as module
    elif name in ("Inspection", "InterventionResult", "LoadedRun", "load"):
        from seq2seq.explorer import notebook as module
    elif name == "train":
        from seq2seq.training.entry import train_run

        return train_run
    elif name == "Seq2SeqError":
        from seq2seq import errors as module
    elif name == "EOS_ID":
        from seq2seq import vocab as module
    else:
        raise AttributeError(f"module 'seq2seq' has no attribute {name!r}")
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted(__all__)
