"""Sentence pairs of a corpus: its splits chosen, validation and test carved off the
training pairs where it has none, empty pairs dropped and counted, and pairs to subword ids.

Where the pairs come from is ``seq2seq.data.registry`` (what ``--data`` names), ``seq2seq.data.sources``
(folders of line-aligned files, TSV) and ``seq2seq.data.hub`` (the Hugging Face Hub); every problem
with the data is a one-line ``Seq2SeqError`` or a counted skip.

Files are read a line at a time, never whole: ``open_corpus`` keeps validation and test as
lists but only counts the training pairs, which ``Corpus.train`` reads again at each
iteration, so a corpus of millions of pairs is never in memory (``load_corpus`` lists them
too, for the small corpora and the commands that want lists).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from seq2seq.data.registry import read_source
from seq2seq.data.sources import VALIDATION_NAMES, SplitReader
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import Seq2SeqError

SPLITS = ("train", "validation", "test")
_CARVE_SEED = 0  # carving is a property of the corpus, not of a run's seed
_SAMPLE_SEED = 0  # so is a sample of its training pairs


def _stripped(reader: SplitReader) -> Iterator[tuple[str, str]]:
    return ((s.strip(), t.strip()) for s, t in reader.read())


def _nonempty(reader: SplitReader) -> Iterator[tuple[str, str]]:
    return ((s, t) for s, t in _stripped(reader) if s and t)


class TrainPairs:
    """The training pairs of a corpus, read from its files at every iteration, never held:
    stripped, empty pairs skipped, the pairs carved off for validation and test left out."""

    def __init__(self, reader: SplitReader, n_nonempty: int, carved: frozenset[int]) -> None:
        self.reader = reader
        self.n_nonempty = n_nonempty  # counted by open_corpus; carved positions count among them
        self.carved = carved

    def __len__(self) -> int:
        return self.n_nonempty - len(self.carved)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for k, pair in enumerate(_nonempty(self.reader)):
            if k not in self.carved:
                yield pair

    def sample(self, size: int) -> list[tuple[str, str]]:
        """``size`` pairs chosen uniformly, the same ones every time (seeded reservoir
        sampling, one reading), in corpus order; every pair when there are no more."""
        rng = random.Random(_SAMPLE_SEED)
        chosen: list[tuple[int, tuple[str, str]]] = []
        for k, pair in enumerate(self):
            if k < size:
                chosen.append((k, pair))
            elif (j := rng.randrange(k + 1)) < size:
                chosen[j] = (k, pair)
        return [pair for _, pair in sorted(chosen)]


@dataclass
class Corpus:
    splits: dict[str, list[tuple[str, str]]]  # "train"/"validation"/"test" -> (src, tgt) pairs
    dropped: dict[str, dict[str, int]]  # split -> reason -> count
    source_description: str
    notes: list[str] = field(default_factory=list)
    train: TrainPairs | None = None  # the training pairs, streamed (``splits`` holds them
    # as a list only from ``load_corpus``)
    identity: list[list] = field(default_factory=list)  # see corpus_identity

    def count_dropped(self, split: str, reason: str, n: int) -> None:
        if n:
            reasons = self.dropped.setdefault(split, {})
            reasons[reason] = reasons.get(reason, 0) + n


# ---------------------------------------------------------------------------------------
# Splits: naming, empty pairs, carving.


def _choose_splits(names: list[str], test_split: str | None, description: str) -> dict[str, str]:
    """Canonical split -> the source's split name, for the splits the source has."""
    listed = ", ".join(sorted(names)) or "none"
    if "train" not in names:
        raise Seq2SeqError(
            f"{description} has no train split for this pair; splits it has: {listed}"
        )
    chosen = {"train": "train"}
    validation = [n for n in VALIDATION_NAMES if n in names]
    if validation:
        chosen["validation"] = validation[0]
    if test_split is not None:
        if test_split not in names:
            raise Seq2SeqError(
                f"{description} has no split '{test_split}'; splits it has: {listed}"
            )
        chosen["test"] = test_split
    else:
        tests = sorted(n for n in names if n.startswith("test"))
        if len(tests) > 1:
            raise Seq2SeqError(
                f"{description} has several test splits ({', '.join(tests)}); choose one with --test-split"
            )
        if tests:
            chosen["test"] = tests[0]
    return chosen


def _carve(corpus: Corpus, n: int, carve_valid: int, carve_test: int) -> dict[str, list[int]]:
    """Which of the ``n`` training pairs make the missing validation/test splits, the same
    pairs every time: split -> their positions among the non-empty training pairs."""
    wanted = {
        s: k
        for s, k in (("validation", carve_valid), ("test", carve_test))
        if s not in corpus.splits
    }
    if not wanted:
        return {}
    order = array("q", range(n))  # 8 bytes a pair, where a list of ints takes 36
    random.Random(_CARVE_SEED).shuffle(order)
    carved, taken = {}, 0
    for split, k in wanted.items():
        n_taken = min(k, n // 10)  # train keeps at least 80% of a small corpus
        carved[split] = order[taken : taken + n_taken].tolist()
        taken += n_taken
        cap = f" ({k} asked; train had {n} pairs)" if n_taken < k else ""
        corpus.notes.append(f"carved {n_taken} {split} pairs off train{cap}")
    return carved


def _count(reader: SplitReader) -> tuple[int, int]:
    """The non-empty and the empty pairs of a split, counted in one reading."""
    n = n_empty = 0
    for s, t in _stripped(reader):
        if s and t:
            n += 1
        else:
            n_empty += 1
    return n, n_empty


def _carved_pairs(reader: SplitReader, carved: dict[str, list[int]]) -> dict[str, list]:
    """The pairs at the ``carved`` positions of the training split, in their carved order."""
    wanted = {k for positions in carved.values() for k in positions}
    found = {}
    for k, pair in enumerate(_nonempty(reader)):
        if k in wanted:
            found[k] = pair
            if len(found) == len(wanted):
                break
    return {split: [found[k] for k in positions] for split, positions in carved.items()}


def _identity(readers: Iterable[SplitReader]) -> list[list]:
    files = sorted({path.resolve() for reader in readers for path in reader.files})
    stats = {path: path.stat() for path in files}
    return [[str(path), stat.st_size, stat.st_mtime_ns] for path, stat in stats.items()]


def corpus_identity(
    data: str, src: str, tgt: str, test_split: str | None = None, columns: str | None = None
) -> list[list]:
    """The files the corpus is read from, each as [path, size, mtime_ns], without reading
    them (a TSV's first line aside): while they are unchanged, so is the corpus.

    For Hub data the files are the Arrow files ``datasets`` keeps the splits in."""
    description, readers = read_source(data, src, tgt, columns, [])
    chosen = _choose_splits(list(readers), test_split, description)
    return _identity(readers[name] for name in chosen.values())


def open_corpus(
    data: str,
    src: str,
    tgt: str,
    test_split: str | None = None,
    carve_valid: int = 1000,
    carve_test: int = 1000,
    columns: str | None = None,
) -> Corpus:
    """The ``src``-``tgt`` pairs of validation and test as lists, and the training pairs as
    ``Corpus.train``, which streams them; empty pairs dropped and counted.

    The training split is read once here, to count its pairs (and find any error in its
    files before anything is trained), and once more to carve validation/test off it when
    the source has none. ``columns``: which columns of a TSV corpus hold ``src`` and ``tgt``
    (``seq2seq.data.tsv``)."""
    if src == tgt:
        raise Seq2SeqError(f"--src and --tgt are both '{src}'; choose two languages")
    notes: list[str] = []
    description, readers = read_source(data, src, tgt, columns, notes)
    chosen = _choose_splits(list(readers), test_split, description)
    identity = _identity(readers[name] for name in chosen.values())
    corpus = Corpus({}, {}, f"{description}, {src}-{tgt}", notes, identity=identity)
    n_train = 0
    for split, name in chosen.items():
        if split == "train":
            n_train, n_empty = _count(readers[name])
        else:
            read = list(_stripped(readers[name]))
            corpus.splits[split] = [(s, t) for s, t in read if s and t]
            n_empty = len(read) - len(corpus.splits[split])
        corpus.count_dropped(split, "empty", n_empty)
        if name != split:
            corpus.notes.append(f"{split} split is '{name}'")
    carved = _carve(corpus, n_train, carve_valid, carve_test)
    if carved:
        corpus.splits.update(_carved_pairs(readers["train"], carved))
    taken = frozenset(k for positions in carved.values() for k in positions)
    corpus.train = TrainPairs(readers["train"], n_train, taken)
    return corpus


def load_corpus(
    data: str,
    src: str,
    tgt: str,
    test_split: str | None = None,
    carve_valid: int = 1000,
    carve_test: int = 1000,
    columns: str | None = None,
) -> Corpus:
    """``open_corpus`` with the training pairs read into ``splits["train"]`` too: every
    split a list, for a corpus that fits in memory."""
    corpus = open_corpus(data, src, tgt, test_split, carve_valid, carve_test, columns)
    corpus.splits = {"train": list(corpus.train), **corpus.splits}
    return corpus


def encode_pairs(
    pairs: list[tuple[str, str]], tokenizer: Tokenizer, max_len: int | None
) -> tuple[list[list[int]], list[list[int]], int]:
    """Subword ids of both sides; pairs with either side over ``max_len`` subwords are dropped.

    Returns the source ids, the target ids and the number of pairs dropped for length.
    """
    src_ids = tokenizer.encode_batch([s for s, _ in pairs], "src")
    tgt_ids = tokenizer.encode_batch([t for _, t in pairs], "tgt")
    if max_len is None:
        return src_ids, tgt_ids, 0
    kept = [
        i for i in range(len(pairs)) if len(src_ids[i]) <= max_len and len(tgt_ids[i]) <= max_len
    ]
    return [src_ids[i] for i in kept], [tgt_ids[i] for i in kept], len(pairs) - len(kept)
