"""Corpora to sentence pairs: the registry, local folders, TSV files, the Hugging Face Hub.

``--data`` names one of: a registry name (``data/corpora.yaml``; ``multi30k``, the default,
ships with the repository), a folder of line-aligned ``{split}.{lang}[.gz]`` files (the
Multi30k layout), a TSV file or folder of TSV files, a local folder of JSON-lines/Parquet
files with the Hub's schema, or a Hugging Face Hub id (``owner/name``). Every problem with
the data is a one-line ``Seq2SeqError`` or a counted skip. Also here: pairs to subword ids,
and the corpus report of ``seq2seq data``.

Files are read a line at a time, never whole: ``open_corpus`` keeps validation and test as
lists but only counts the training pairs, which ``Corpus.train`` reads again at each
iteration, so a corpus of millions of pairs is never in memory (``load_corpus`` lists them
too, for the small corpora and the commands that want lists).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import itertools
import math
import os
import random
import re
import socket
import urllib.parse
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from seq2seq.batching import TokenBatchSampler
from seq2seq.errors import Seq2SeqError
from seq2seq.tokenizer import Tokenizer
from seq2seq.tsv import LANG_CODE, tsv_layout, tsv_pairs

SPLITS = ("train", "validation", "test")
REPO_ROOT = Path(__file__).resolve().parents[1]
# The folder whose data/ holds the registry and the corpora that ship: the package itself when
# installed from a wheel (pyproject.toml puts data/ in it), else the checkout.
_PACKAGE = Path(__file__).resolve().parent
DATA_ROOT = _PACKAGE if (_PACKAGE / "data" / "corpora.yaml").is_file() else REPO_ROOT
REGISTRY = DATA_ROOT / "data" / "corpora.yaml"
# Where anything a run downloads or prepares goes: data/cache/ (git-ignored) in a checkout.
_CHECKOUT_CACHE = REPO_ROOT / "data" / "cache"
_DEFAULT_CACHE = (
    _CHECKOUT_CACHE if _CHECKOUT_CACHE.parent.is_dir() else Path.home() / ".cache/seq2seq"
)
CACHE_DIR = Path(os.environ.get("SEQ2SEQ_CACHE", _DEFAULT_CACHE))

_VALIDATION_NAMES = ("validation", "valid", "val", "dev")  # in order of preference
_DATASETS_SUFFIXES = (".jsonl", ".json", ".parquet")
_CARVE_SEED = 0  # carving is a property of the corpus, not of a run's seed
_SAMPLE_SEED = 0  # so is a sample of its training pairs
_DATASETS_BATCH = 10_000  # rows of an Arrow table turned into Python strings at once
_HUB_TIMEOUT_S = 3.0
_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


@dataclass(frozen=True)
class SplitReader:
    """One split of a source: ``read()`` gives its raw pairs afresh at every call, one at a
    time; ``files`` are the files they come from."""

    read: Callable[[], Iterator[tuple[str, str]]]
    files: tuple[Path, ...]


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
# Reading sources: each reader returns a description and {split name: reader of pairs}.


def _registry() -> dict[str, dict]:
    if not REGISTRY.is_file():
        return {}
    return yaml.safe_load(REGISTRY.read_text(encoding="utf-8")) or {}


def _is_split_name(name: str) -> bool:
    return name == "train" or name in _VALIDATION_NAMES or name.startswith("test")


def _check_languages(held: list[str], src: str, tgt: str, description: str) -> None:
    for lang in (src, tgt):
        if lang not in held:
            raise Seq2SeqError(
                f"{description} has no '{lang}' side; languages it holds: {', '.join(sorted(held))}"
            )


def _lines(path: Path) -> Iterator[str]:
    """The lines of a plain or gzipped UTF-8 file, one at a time, without their line ends."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            # Binary lines end at "\n" only: a lone "\r" or U+2028 inside a sentence must not
            # break alignment, as universal-newline or splitlines() reading would.
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise Seq2SeqError(f"{path}: invalid UTF-8 on line {number}") from None
                yield line.removesuffix("\n").rstrip("\r")
    except (gzip.BadGzipFile, EOFError, zlib.error):
        raise Seq2SeqError(f"{path} is not a valid gzip file") from None
    except OSError as e:
        raise Seq2SeqError(f"cannot read {path}: {e.strerror or e}") from None


def _head(path: Path) -> tuple[str, ...]:
    """The first line of a file (what ``tsv_layout`` reads), or () when it has none."""
    with contextlib.closing(_lines(path)) as lines:
        return tuple(itertools.islice(lines, 1))


def _aligned(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """The pairs of two line-aligned files; a one-line error when their lengths differ."""
    pairs = itertools.zip_longest(_lines(src_path), _lines(tgt_path))
    for n, (s, t) in enumerate(pairs):
        if s is None or t is None:  # one file ended after n lines: count the rest of the other
            rest = 1 + sum(1 for _ in pairs)
            n_src, n_tgt = (n + rest, n) if t is None else (n, n + rest)
            raise Seq2SeqError(f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}")
        yield s, t


def _parallel_files(folder: Path) -> dict[str, dict[str, Path]]:
    """``{split}.{lang}`` / ``{split}.{lang}.gz`` files of a folder: split -> lang -> path."""
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        name = path.name.removesuffix(".gz")
        split, _, lang = name.rpartition(".")
        if path.is_file() and _is_split_name(split) and LANG_CODE.fullmatch(lang):
            found.setdefault(split, {}).setdefault(lang, path)
    return found


def _read_parallel_folder(folder: Path, src: str, tgt: str) -> tuple[str, dict[str, SplitReader]]:
    description = f"parallel text files in {folder}"
    files = _parallel_files(folder)
    _check_languages(
        sorted({lang for langs in files.values() for lang in langs}), src, tgt, description
    )

    readers = {
        split: SplitReader(
            functools.partial(_aligned, langs[src], langs[tgt]), (langs[src], langs[tgt])
        )
        for split, langs in files.items()
        if src in langs and tgt in langs
    }
    return description, readers


def _tsv_reader(path: Path, src: str, tgt: str, columns: str | None) -> SplitReader:
    def read() -> Iterator[tuple[str, str]]:
        return tsv_pairs(_lines(path), path, tsv_layout(_head(path), path, src, tgt, columns))

    return SplitReader(read, (path,))


def _read_tsv_source(
    path: Path, src: str, tgt: str, columns: str | None, notes: list[str]
) -> tuple[str, dict[str, SplitReader]]:
    if path.is_file():
        files = {"train": path}
        description = f"TSV file {path}"
    else:
        files = {
            p.name.removesuffix(".tsv"): p
            for p in sorted(path.glob("*.tsv"))
            if _is_split_name(p.name.removesuffix(".tsv"))
        }
        description = f"TSV files in {path}"
    if "train" in files:  # its columns checked now, before any reading of the other splits
        layout = tsv_layout(_head(files["train"]), files["train"], src, tgt, columns)
        note = layout.note(files["train"], src, tgt)
        if note:
            notes.append(note)
    return description, {split: _tsv_reader(p, src, tgt, columns) for split, p in files.items()}


def _tsv_path(data: str) -> Path:
    """The TSV file or folder ``data`` names (a path, or a registry name), for ``columns``."""
    entry = _registry().get(data, {})
    path = DATA_ROOT / entry["path"] if "path" in entry else Path(data).expanduser()
    if path.suffix == ".tsv" and path.is_file() or path.is_dir() and any(path.glob("*.tsv")):
        return path
    raise Seq2SeqError(
        f"--columns applies to TSV corpora; --data {data} is not a .tsv file or a folder of them"
    )


def _local_alternatives(name: str) -> list[str]:
    """Registry corpora on disk to suggest when the Hub cannot be reached, ``name``'s own first."""
    own_first = sorted(
        _registry().items(), key=lambda item: name not in (item[0], item[1].get("hub_id"))
    )
    return [
        f"--data {key}"
        for key, entry in own_first
        if "path" in entry and (DATA_ROOT / entry["path"]).is_dir()
    ]


def _hub_unreachable() -> str | None:
    """Why the Hub cannot be reached, or None; a quick probe instead of datasets' retries."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    proxied = any(
        os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    )
    if offline or proxied:
        return None  # cache-only or behind a proxy: datasets decides, and fails fast offline
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=_HUB_TIMEOUT_S).close()
    except OSError as e:
        return str(e) or type(e).__name__
    return None


def _read_datasets(
    name: str, src: str, tgt: str, local: bool, config: str | None = None
) -> tuple[str, dict[str, SplitReader]]:
    """A Hub dataset (or a local folder in its layout) through Hugging Face ``datasets``.

    Languages are either columns named by code (``bentrevett/multi30k``) or keys of a
    ``translation`` column (the WMT datasets). ``config`` names one configuration of a
    dataset that has several (``wmt/wmt14`` with ``de-en``).
    """
    description = f"local dataset folder {name}" if local else f"Hub dataset {name}"
    description += f", configuration {config}" if config else ""
    copies = [] if local else _local_alternatives(name)
    alternatives = "; try a local copy: " + " or ".join(copies) if copies else ""
    if not local and (reason := _hub_unreachable()):
        raise Seq2SeqError(
            f"cannot reach the Hugging Face Hub for '{name}' ({reason}){alternatives}"
        )
    import datasets  # slow to import; only this source needs it

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        loaded = datasets.load_dataset(name, config, cache_dir=str(CACHE_DIR / "huggingface"))
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "Config name is missing" in message:
            names = ", ".join(datasets.get_dataset_config_names(name))
            message += f" Name one as --data {name}:CONFIG (configurations: {names})"
        raise Seq2SeqError(f"could not load {description}: {message}{alternatives}") from None
    first = next(iter(loaded.values()))
    nested = "translation" in first.column_names
    held = list(first[0]["translation"]) if nested and len(first) else first.column_names
    _check_languages(held, src, tgt, description)

    def reader(split: str) -> SplitReader:
        table = loaded[split]

        def read() -> Iterator[tuple[str, str]]:
            for batch in table.iter(batch_size=_DATASETS_BATCH):
                if nested:
                    rows = ((row[src], row[tgt]) for row in batch["translation"])
                else:
                    rows = zip(batch[src], batch[tgt], strict=True)
                yield from ((s or "", t or "") for s, t in rows)

        # The Arrow files datasets keeps the split in: they change when the data does.
        return SplitReader(read, tuple(Path(f["filename"]) for f in table.cache_files))

    return description, {split: reader(split) for split in loaded}


def _split_configuration(data: str) -> tuple[str, str | None]:
    """``owner/name:config`` or ``folder:config`` -> (dataset, configuration); else (data, None)."""
    match = re.fullmatch(r"(.+):([\w.-]+)", data)
    if match is None or Path(data).expanduser().exists():
        return data, None
    name, config = match.groups()
    if _HUB_ID.fullmatch(name) or Path(name).expanduser().is_dir():
        return name, config
    return data, None


def _read_source(
    data: str, src: str, tgt: str, columns: str | None, notes: list[str]
) -> tuple[str, dict[str, SplitReader]]:
    if columns is not None:
        return _read_tsv_source(_tsv_path(data), src, tgt, columns, notes)
    data, config = _split_configuration(data)
    if config is not None:
        local = Path(data).expanduser().is_dir()
        return _read_datasets(
            str(Path(data).expanduser()) if local else data, src, tgt, local, config
        )
    registry = _registry()
    if data in registry:
        entry = registry[data]
        if "path" in entry:
            folder = DATA_ROOT / entry["path"]
            if not folder.is_dir():
                raise Seq2SeqError(
                    f"corpus '{data}' should be in {folder}, which is missing; "
                    "point --data at a copy of its folder"
                )
            data = str(folder)
        else:
            description, readers = _read_datasets(entry["hub_id"], src, tgt, local=False)
            return f"{description} ('{data}' in the registry)", readers
    path = Path(data).expanduser()
    if path.is_file():
        if path.suffix != ".tsv":
            raise Seq2SeqError(f"{path}: a data file must be .tsv (a folder holds other formats)")
        return _read_tsv_source(path, src, tgt, None, notes)
    if path.is_dir():
        if any(path.glob("*.tsv")):
            return _read_tsv_source(path, src, tgt, None, notes)
        if _parallel_files(path):
            return _read_parallel_folder(path, src, tgt)
        if any(p.suffix in _DATASETS_SUFFIXES or p.name == "README.md" for p in path.iterdir()):
            return _read_datasets(str(path), src, tgt, local=True)
        raise Seq2SeqError(
            f"{path} holds no corpus: expected {{split}}.{{lang}}[.gz] files, *.tsv, or *.jsonl/*.parquet"
        )
    if path.parent.is_dir() and str(path.parent) != ".":
        raise Seq2SeqError(f"--data {data}: no such file or folder")
    if _HUB_ID.fullmatch(data):
        return _read_datasets(data, src, tgt, local=False)
    if not registry:  # installed without the repository, whose data/ holds the corpora
        raise Seq2SeqError(
            f"--data '{data}': this install has no corpus registry (data/corpora.yaml ships with "
            "the repository, beside its corpora); point --data at a corpus folder, e.g. "
            "--data path/to/seq2seq/data/multi30k"
        )
    names = ", ".join(sorted(registry))
    raise Seq2SeqError(
        f"--data '{data}' is not a file, a folder, a Hub id (owner/name) or a known corpus ({names})"
    )


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
    validation = [n for n in _VALIDATION_NAMES if n in names]
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
    description, readers = _read_source(data, src, tgt, columns, [])
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
    (``seq2seq.tsv``)."""
    if src == tgt:
        raise Seq2SeqError(f"--src and --tgt are both '{src}'; choose two languages")
    notes: list[str] = []
    description, readers = _read_source(data, src, tgt, columns, notes)
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


# ---------------------------------------------------------------------------------------
# The corpus report of ``seq2seq data``.


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
