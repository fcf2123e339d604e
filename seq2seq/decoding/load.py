"""A trained run loaded from its directory alone: config, tokenizer, and the model rebuilt with
its weights. Here, above the model and the data it builds from, rather than beside the run
directory's files (``seq2seq.run.checkpoint``), which import neither.
"""

from __future__ import annotations

from pathlib import Path

import torch

from seq2seq.config import Config
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import Seq2SeqError
from seq2seq.model.transformer import Seq2Seq, build_model
from seq2seq.run.checkpoint import (
    BEST_FILE,
    CONFIG_FILE,
    load_config_file,
    load_model,
    split_run_path,
)


def load_run(
    run_dir: str | Path, device: str | torch.device = "cpu", weights: str = BEST_FILE
) -> tuple[Config, Tokenizer, Seq2Seq]:
    """Rebuild a trained model from its run directory alone: config, tokenizer, best weights.

    ``run_dir`` may also name a weights file inside a run directory (``RUN/averaged.safetensors``,
    ``RUN/checkpoints/step_N.safetensors``): the run is the directory that holds its config.
    Returns ``(config, tokenizer, model)`` with the model in eval mode. Every problem with
    the directory (missing, not a run, corrupt or tampered files) is one ``Seq2SeqError``.
    """
    run_dir, named = split_run_path(run_dir)
    weights_path = named or run_dir / weights
    if not run_dir.is_dir():
        raise Seq2SeqError(f"{run_dir}: no such run directory")
    config = load_config_file(run_dir)
    tokenizer = Tokenizer.load(run_dir)
    if (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) != (
        config.model.src_vocab_size,
        config.model.tgt_vocab_size,
    ):
        raise Seq2SeqError(f"{run_dir}: the tokenizer's vocabulary does not match the model config")
    try:
        model = build_model(config.model)
    except (ValueError, RuntimeError) as e:
        raise Seq2SeqError(f"{run_dir / CONFIG_FILE}: cannot build the model ({e})") from None
    if not weights_path.is_file():
        raise Seq2SeqError(
            f"{run_dir}: {weights_path.name} missing (has training reached its first validation?)"
        )
    load_model(model, weights_path)
    return config, tokenizer, model.to(device).eval()
