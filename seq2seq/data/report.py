"""The corpus report of ``seq2seq data``: what a run would train on, without training.

Pairs, subword tokens and length percentiles per split and side, the pairs dropped and why,
and how the training pairs fall into batches (``seq2seq.data.batching``, the trainer's own rule).
"""

from __future__ import annotations

import math

from seq2seq.data.batching import TokenBatchSampler
from seq2seq.data.corpora import Corpus, encode_pairs
from seq2seq.data.tokenizer import Tokenizer


def _percentiles(lengths: list[int]) -> dict[str, int]:
    """Nearest-rank percentiles."""
    ordered = sorted(lengths) or [0]
    ranks = {f"p{q}": ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] for q in (50, 90, 99)}
    return {**ranks, "max": ordered[-1]}


def data_report(
    corpus: Corpus,
    tokenizer: Tokenizer,
    max_len: int | None,
    max_tokens: int,
    seed: int = 1,
) -> dict:
    """Pairs, subword tokens and length percentiles per split and side, dropped pairs by
    reason, and the padding of the training batches, as a JSON-ready dict."""
    dropped = {split: dict(reasons) for split, reasons in corpus.dropped.items()}
    splits = {}
    train_lengths: tuple[list[int], list[int]] = ([], [])
    for split, pairs in corpus.splits.items():
        src_ids, tgt_ids, n_long = encode_pairs(
            pairs, tokenizer, max_len if split == "train" else None
        )
        if n_long:
            dropped.setdefault(split, {})["too long"] = n_long
        src_lengths, tgt_lengths = [len(x) for x in src_ids], [len(x) for x in tgt_ids]
        splits[split] = {
            "pairs": len(src_ids),
            "src_tokens": sum(src_lengths),
            "tgt_tokens": sum(tgt_lengths),
            "src_lengths": _percentiles(src_lengths),
            "tgt_lengths": _percentiles(tgt_lengths),
        }
        if split == "train":
            train_lengths = (src_lengths, tgt_lengths)
    # +1: the batch tensors hold EOS (source, target output) or BOS (target input).
    sampler = TokenBatchSampler(
        [n + 1 for n in train_lengths[0]], [n + 1 for n in train_lengths[1]], max_tokens, seed
    )
    n_batches = len(sampler.batches(0))
    report = {
        "source": corpus.source_description,
        "notes": corpus.notes + tokenizer.notes,
        "vocab": {
            "joint": tokenizer.joint,
            "src": tokenizer.src_vocab_size,
            "tgt": tokenizer.tgt_vocab_size,
        },
        "max_len": max_len,
        "splits": splits,
        "dropped": dropped,
        "batches": {
            "max_tokens_per_side": max_tokens,
            "train_batches": n_batches,
            "mean_pairs_per_batch": round(len(train_lengths[0]) / max(n_batches, 1), 1),
            "padding_fraction": round(sampler.padding_fraction(0), 4),
        },
    }
    return report
