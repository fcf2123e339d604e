"""The corpus report of ``seq2seq data``: what a run would train on, without training.

Read from what ``seq2seq.data.prepare`` left in a run directory, as a run prepares it: the
training pairs' subword tokens and length percentiles from the store, validation and test
encoded with the run's tokenizer, the pairs dropped and why (the store's summary), and how the
training pairs fall into batches (``seq2seq.data.batching``, the trainer's own rule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seq2seq.config import Config
from seq2seq.data.batching import TokenBatchSampler
from seq2seq.data.corpora import encode_pairs
from seq2seq.data.prepare import DATA_DIR, open_run_corpus
from seq2seq.data.store import PairStore, read_manifest
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import Seq2SeqError


def _percentiles(lengths: Sequence[int]) -> dict[str, int]:
    """Nearest-rank percentiles."""
    ordered = np.sort(np.asarray(lengths, dtype=np.int64)) if len(lengths) else np.zeros(1, int)
    ranks = {
        f"p{q}": int(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]) for q in (50, 90, 99)
    }
    return {**ranks, "max": int(ordered[-1])}


def _split(src_lengths: Sequence[int], tgt_lengths: Sequence[int]) -> dict:
    return {
        "pairs": len(src_lengths),
        "src_tokens": int(np.sum(src_lengths, dtype=np.int64)),
        "tgt_tokens": int(np.sum(tgt_lengths, dtype=np.int64)),
        "src_lengths": _percentiles(src_lengths),
        "tgt_lengths": _percentiles(tgt_lengths),
    }


def data_report(config: Config, run_dir: Path) -> dict:
    """What a run with ``config`` trains on, from the data prepared in ``run_dir``
    (``prepare_store``): pairs, subword tokens and length percentiles per split and side,
    dropped pairs by reason, and the padding of the training batches, as a JSON-ready dict."""
    d = config.data
    manifest = read_manifest(run_dir / DATA_DIR)
    if manifest is None:
        raise Seq2SeqError(f"{run_dir / DATA_DIR} holds no whole prepared corpus")
    tokenizer = Tokenizer.load(run_dir)
    train = PairStore(run_dir / DATA_DIR, manifest["dtype"])
    splits = {"train": _split(train.src_lengths, train.tgt_lengths)}
    for split, pairs in open_run_corpus(d).splits.items():  # validation and test: never dropped
        src_ids, tgt_ids, _ = encode_pairs(pairs, tokenizer, None)
        splits[split] = _split([len(x) for x in src_ids], [len(x) for x in tgt_ids])
    # +1: the batch tensors hold EOS (source, target output) or BOS (target input).
    sampler = TokenBatchSampler(
        train.src_lengths + 1, train.tgt_lengths + 1, d.max_tokens, config.train.seed
    )
    n_batches = len(sampler.batches(0))
    summary = manifest["summary"]
    return {
        "source": summary["source"],
        "notes": summary["notes"],
        "vocab": {
            "joint": tokenizer.joint,
            "src": tokenizer.src_vocab_size,
            "tgt": tokenizer.tgt_vocab_size,
        },
        "max_len": d.max_len,
        "splits": splits,
        "dropped": summary["dropped"],
        "batches": {
            "max_tokens_per_side": d.max_tokens,
            "train_batches": n_batches,
            "mean_pairs_per_batch": round(len(train) / max(n_batches, 1), 1),
            "padding_fraction": round(sampler.padding_fraction(0), 4),
        },
    }
