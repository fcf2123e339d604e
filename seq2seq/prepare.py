"""A run's data, ready to train on: the corpus read, the tokenizer trained (or loaded on
``--resume``), every split encoded to subword ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from seq2seq.config import Config, DataConfig
from seq2seq.corpora import encode_pairs, load_corpus
from seq2seq.runlog import say
from seq2seq.runtime import Runtime
from seq2seq.tokenizer import Tokenizer


@dataclass
class Prepared:
    tokenizer: Tokenizer
    train_src: list[list[int]]
    train_tgt: list[list[int]]
    valid_src: list[list[int]]
    valid_tgt: list[list[int]]
    valid_refs: list[str]
    valid_sources: list[str]
    summary: dict[str, Any]

    @property
    def train(self) -> _ListPairs:  # TEMPORARY (lead): until the memory-mapped PairStore lands
        return _ListPairs(self.train_src, self.train_tgt)


class _ListPairs:  # TEMPORARY (lead): the PairStore interface over lists
    def __init__(self, src: list[list[int]], tgt: list[list[int]]):
        import numpy as np

        self.src, self.tgt = src, tgt
        self.src_lengths = np.array([len(x) for x in src], dtype=np.int64)
        self.tgt_lengths = np.array([len(x) for x in tgt], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.src)

    def pairs(self, indices):
        return [self.src[i] for i in indices], [self.tgt[i] for i in indices]


def prepare_data(config: Config, run_dir: Path, runtime: Runtime, resume: bool) -> Prepared:
    d = config.data
    corpus = load_corpus(
        d.data, d.src, d.tgt, d.test_split, d.carve_valid, d.carve_test, columns=d.columns
    )
    train_pairs, valid_pairs = corpus.splits["train"], corpus.splits["validation"]
    vocab_notes: list[str] = []  # what training the tokenizer said (nothing on resume)
    if not resume and runtime.main:
        vocab_notes = Tokenizer.train(
            [s for s, _ in train_pairs],
            [t for _, t in train_pairs],
            run_dir,
            d.vocab_size,
            d.spm_model_type,
            d.joint_vocab,
            fit_to_corpus=d.vocab_size == DataConfig.vocab_size,  # the size left at its default
        ).notes
    if runtime.world > 1:
        dist.barrier()  # rank 0 has written the tokenizer
    tokenizer = Tokenizer.load(run_dir)
    train_src, train_tgt, n_long = encode_pairs(train_pairs, tokenizer, d.max_len)
    corpus.count_dropped("train", f"longer than {d.max_len} subwords", n_long)
    valid_src, valid_tgt, _ = encode_pairs(valid_pairs, tokenizer, None)
    limit = config.model.max_positions - 1  # room for EOS / BOS
    valid_src, valid_tgt = [s[:limit] for s in valid_src], [t[:limit] for t in valid_tgt]
    summary = {
        "source": corpus.source_description,
        "pairs": {
            "train": len(train_src),
            **{k: len(v) for k, v in corpus.splits.items() if k != "train"},
        },
        "dropped": corpus.dropped,
        "notes": corpus.notes + vocab_notes,
    }
    if runtime.main:
        for note in summary["notes"]:  # e.g. columns left out, the vocabulary sized to the corpus
            say(f"note: {note}", run_dir)
    return Prepared(
        tokenizer,
        train_src,
        train_tgt,
        valid_src,
        valid_tgt,
        [t for _, t in valid_pairs],
        [s for s, _ in valid_pairs],
        summary,
    )
