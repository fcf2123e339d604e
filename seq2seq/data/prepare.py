"""A run's data, assembled in one place: corpus -> tokenizer -> store. The training pairs are
tokenized once into a store of flat arrays in ``RUN/data/`` (``seq2seq.data.store``), the
validation pairs kept as small lists, the tokenizer beside them. ``seq2seq train`` prepares
through it (``seq2seq.training.prepare`` coordinates the ranks of a ``torchrun`` job around it)
and ``seq2seq data`` too, into a scratch directory, and reports from the store
(``seq2seq.data.report``): the two cannot drift apart.

A fresh run reads the corpus, streaming its training split (never all of it in memory),
trains SentencePiece on a sample of it, and encodes it chunk by chunk into the store. The
store's manifest, written last, holds the key it was made for (the corpus files' sizes and
modification times, the tokenizer files' sha256, the filters), the validation pairs and
the data summary. A resumed run whose key still matches reads only the manifest and the
pairs' lengths: no corpus reading, no tokenizer training; one whose corpus changed encodes it
again with the run's tokenizer, and says whether the pairs came out the same (the resume
stays exact) or not. What preparing has to say goes to the caller's ``say``: this folder
imports only the foundation, not the run's log.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2seq.config import Config, DataConfig
from seq2seq.data.corpora import Corpus, corpus_identity, encode_pairs, open_corpus
from seq2seq.data.store import (
    PairStore,
    digest,
    ids_dtype,
    read_manifest,
    write_manifest,
    write_pairs,
)
from seq2seq.data.tokenizer import JOINT_FILE, SIDE_FILES, Tokenizer
from seq2seq.errors import Seq2SeqError

DATA_DIR = "data"  # the store, in the run directory
# SentencePiece learns its pieces from a seeded sample of at most this many training pairs
# (both sides: twice as many sentences with a joint vocabulary). 200,000 pairs of 12-word
# sentences are ~5M words, 600 per piece of the default 8,000 (the vocabulary rule in
# seq2seq.data.tokenizer asks for 30). On 2 busy cores, lines of two joined Multi30k sentences
# trained in 7 s from 200,000 pairs and in 17 s (950 MB peak) from 500,000. All of Multi30k
# (29,000 pairs) or IWSLT (~200,000) is within it: their tokenizers, and so their BLEU, are
# those trained on every pair, as before there was a sample.
TOKENIZER_SAMPLE = 200_000
# Pairs encoded at once: enough for SentencePiece's threads, and their Python lists of ids
# (~50 MB) stay small beside the rest of the process.
_ENCODE_CHUNK = 20_000


@dataclass
class Prepared:
    tokenizer: Tokenizer
    train: PairStore  # the training pairs, read from RUN/data as batches ask
    valid_src: list[list[int]]  # validation stays small lists, truncated to the model's positions
    valid_tgt: list[list[int]]
    valid_refs: list[str]
    valid_sources: list[str]
    summary: dict[str, Any]  # what data_summary.json holds


def open_prepared(run_dir: Path, manifest: dict[str, Any]) -> Prepared:
    """The data of the store in ``RUN/data`` whose ``manifest`` was read, with the run's tokenizer."""
    valid = manifest["valid"]
    return Prepared(
        Tokenizer.load(run_dir),
        PairStore(run_dir / DATA_DIR, manifest["dtype"]),
        valid["src"],
        valid["tgt"],
        valid["refs"],
        valid["sources"],
        manifest["summary"],
    )


def open_run_corpus(d: DataConfig) -> Corpus:
    """The corpus the data settings ``d`` name, its training split streamed."""
    return open_corpus(
        d.data, d.src, d.tgt, d.test_split, d.carve_valid, d.carve_test, columns=d.columns
    )


def prepare_store(
    config: Config, run_dir: Path, resume: bool, say: Callable[[str], None]
) -> dict[str, Any]:
    """Leave ``RUN/data`` holding the store of this run: kept when resuming with its key
    unchanged, else written afresh (after training the tokenizer, unless resuming: the run's
    tokenizer is in ``run_dir`` already); its key. ``say`` is told what changed on a resume."""
    d = config.data
    old = None
    if resume:
        identity = corpus_identity(d.data, d.src, d.tgt, d.test_split, d.columns)
        old = read_manifest(run_dir / DATA_DIR)
        key = _key(config, identity, run_dir)
        if old is not None and old["key"] == key:
            return key
        if old is not None and "sha256" not in old:  # a store from before stores had one
            old["sha256"] = digest(run_dir / DATA_DIR, old)
    started = time.monotonic(), time.process_time()
    corpus = open_run_corpus(d)
    vocab_notes = [] if resume else _train_tokenizer(corpus, d, run_dir)
    new = _write_store(config, run_dir, corpus, vocab_notes, started)
    _return_freed_memory()
    if old is not None:
        say(f"note: {_encoded_again(old, new)}")
    return new["key"]


def key_differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The fields of two store keys that differ, in words."""
    names = [name for name in new if old.get(name) != new[name]]
    return ", ".join("corpus files" if n == "corpus" else n for n in names) or "key"


def _encoded_again(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What a resume that encoded its corpus again says: what changed, and whether the
    training pairs (and so the batches) are the ones the run began with."""
    said = f"the {key_differences(old['key'], new['key'])} changed since this run's data was prepared; "
    said += "encoded again with the run's tokenizer: "
    if old["sha256"] == new["sha256"]:
        return said + "the same training pairs, so the resume stays exact"
    return said + (
        f"the training pairs differ ({old['pairs']:,} before, {new['pairs']:,} now): "
        "the resume is no longer exact (the batches follow the new corpus)"
    )


def _return_freed_memory() -> None:
    """Hand the heap freed after preparing back to the system, which glibc otherwise keeps
    (~160 MB of 470 at 1M pairs: the sample, SentencePiece's trainer, the encoded chunks),
    so that a run that prepared its data trains in the memory of one that did not."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc's; other C libraries have none to call
    except (AttributeError, OSError, TypeError):
        return
    trim(0)


def _train_tokenizer(corpus: Corpus, d: DataConfig, run_dir: Path) -> list[str]:
    """Train the run's tokenizer on a sample of the training pairs; what training it said."""
    sample = corpus.train.sample(TOKENIZER_SAMPLE)
    return Tokenizer.train(
        [s for s, _ in sample],
        [t for _, t in sample],
        run_dir,
        d.vocab_size,
        d.spm_model_type,
        d.joint_vocab,
        fit_to_corpus=d.vocab_size == DataConfig.vocab_size,  # the size left at its default
    ).notes


def _key(config: Config, identity: list[list], run_dir: Path) -> dict[str, Any]:
    """What the store is a function of: the corpus, the tokenizer, the filters (JSON-ready)."""
    d = config.data
    tokenizer_files = [JOINT_FILE, *SIDE_FILES.values()]
    return {
        "corpus": identity,
        "data": d.data,
        "src": d.src,
        "tgt": d.tgt,
        "columns": d.columns,
        "test_split": d.test_split,
        "carve_valid": d.carve_valid,
        "carve_test": d.carve_test,
        "tokenizer": {
            name: hashlib.sha256((run_dir / name).read_bytes()).hexdigest()
            for name in tokenizer_files
            if (run_dir / name).is_file()
        },
        "max_len": d.max_len,
        "max_positions": config.model.max_positions,
    }


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    it = iter(pairs)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _write_store(
    config: Config,
    run_dir: Path,
    corpus: Corpus,
    vocab_notes: list[str],
    started: tuple[float, float],
) -> dict[str, Any]:
    """Encode the training pairs into a new store, then publish its manifest (returned);
    ``started``: the monotonic and process times when preparing began."""
    d, directory = config.data, run_dir / DATA_DIR
    tokenizer = Tokenizer.load(run_dir)
    vocab_size = max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    n_long = 0
    with write_pairs(directory, ids_dtype(vocab_size)) as writer:
        for chunk in _chunks(corpus.train, _ENCODE_CHUNK):
            src_ids, tgt_ids, n_dropped = encode_pairs(chunk, tokenizer, d.max_len)
            writer.append(src_ids, tgt_ids)
            n_long += n_dropped
        if not writer.n_pairs and n_long:  # no store published: the run trains nothing
            raise Seq2SeqError(
                f"data.max_len {d.max_len} drops every training pair (all {n_long:,}: longer "
                f"than {d.max_len} subwords on a side); raise data.max_len"
            )
    corpus.count_dropped("train", f"longer than {d.max_len} subwords", n_long)
    valid_pairs = corpus.splits["validation"]
    valid_src, valid_tgt, _ = encode_pairs(valid_pairs, tokenizer, None)
    limit = config.model.max_positions - 1  # room for EOS / BOS
    summary = {
        "source": corpus.source_description,
        "pairs": {"train": writer.n_pairs, **{k: len(v) for k, v in corpus.splits.items()}},
        "dropped": corpus.dropped,
        "notes": corpus.notes + vocab_notes,
    }
    valid = {
        "src": [s[:limit] for s in valid_src],
        "tgt": [t[:limit] for t in valid_tgt],
        "refs": [t for _, t in valid_pairs],
        "sources": [s for s, _ in valid_pairs],
    }
    manifest = {
        **writer.description(),
        "key": _key(config, corpus.identity, run_dir),
        "valid": valid,
        "summary": summary,
        # what preparing took, in wall and CPU seconds (all threads) from its start
        "prepare_s": round(time.monotonic() - started[0], 2),
        "prepare_cpu_s": round(time.process_time() - started[1], 2),
    }
    write_manifest(directory, manifest)
    return manifest
