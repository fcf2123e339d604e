"""Token batching: pairs of similar length, bounded in tokens per side, padded into tensors;
optionally padded further to a few fixed shapes (``Buckets``), so that a step captured for
one shape could be replayed for every batch of that shape."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from seq2seq.config import Config
from seq2seq.config_checks import setting_of
from seq2seq.errors import Seq2SeqError
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID

Item, Made = TypeVar("Item"), TypeVar("Made")

N_BUCKETS = 12  # padded lengths: few shapes, so that a captured step per shape is cheap
BUCKET_MULTIPLE = 8  # each a multiple of 8, the width tensor cores work in
# Device types where a record showed padding to buckets pays: none yet. It serves a captured
# step (train.cuda_graphs, which turns it on under auto); an eager step only computes the
# padding for nothing.
BUCKETS_WIN: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Buckets:
    """The shapes a training batch is padded to, both sides alike: the batch's longer side
    (EOS or BOS included) rounded up to one of ``lengths``, and as many rows as a batch of
    that length holds (``max_tokens // length``), so that each length has one shape.

    ``lengths``: ``N_BUCKETS`` lengths spaced evenly up to ``max_len + 1`` (the longest a
    training side is), each rounded up to a multiple of ``BUCKET_MULTIPLE``, at most
    ``max_positions`` and ``max_tokens``: 16, 24, ..., 104 for max_len 100. A batch bounded
    by its bucket's length (``TokenBatchSampler(buckets=...)``) fits its shape in tokens."""

    lengths: tuple[int, ...]
    max_tokens: int

    @classmethod
    def covering(cls, max_len: int, max_tokens: int, max_positions: int) -> Buckets:
        longest, m, cap = max_len + 1, BUCKET_MULTIPLE, min(max_positions, max_tokens)
        evenly = (-(-i * longest // N_BUCKETS) for i in range(1, N_BUCKETS + 1))
        return cls(tuple(sorted({min(-(-n // m) * m, cap) for n in evenly})), max_tokens)

    @classmethod
    def of_run(cls, config: Config, device: torch.device, needed: bool = False) -> Buckets | None:
        """A run's buckets on ``device``, when its ``data.pad_to_buckets`` (auto, true or
        false) says so there, or under auto when a captured step is ``needed``; else None."""
        d, setting = config.data, setting_of(config.data.pad_to_buckets)
        if setting == "true" or (setting == "auto" and (needed or device.type in BUCKETS_WIN)):
            return cls.covering(d.max_len, d.max_tokens, config.model.max_positions)
        return None

    def length(self, longer: np.ndarray) -> np.ndarray:
        """The padded length of sides ``longer`` long (an array). No training side is longer
        than the last bucket (data.max_len drops such pairs); one that were keeps its own."""
        edges = np.asarray(self.lengths)
        at = np.searchsorted(edges, longer)
        return np.where(at < len(edges), edges[np.minimum(at, len(edges) - 1)], longer)

    def shape(self, batch: Batch) -> tuple[int, int]:
        """The (rows, length) ``batch`` is padded to."""
        length = int(self.length(np.asarray(max(batch.src.shape[1], batch.tgt_in.shape[1]))))
        return max(batch.src.shape[0], self.max_tokens // length), length


class TokenBatchSampler:
    """Batches of similar-length pairs holding at most ``max_tokens`` per side, padding included.

    A batch of ``B`` pairs obeys ``max(B * S_max, B * T_max) <= max_tokens``; a single pair
    longer than that gets a batch of its own. Each epoch every pair appears exactly once;
    ties in length and the batch order are shuffled from ``(seed, epoch)``, so a resumed
    run can rebuild an epoch and skip the batches it has done. With ``buckets``, the bound
    takes each pair's padded length (``Buckets.length``): every batch fits its bucket's shape.
    """

    def __init__(
        self,
        src_lengths: list[int],
        tgt_lengths: list[int],
        max_tokens: int,
        seed: int,
        shuffle: bool = True,
        buckets: Buckets | None = None,
    ):
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError(
                f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths"
            )
        if max_tokens < 1:
            raise Seq2SeqError(f"max_tokens must be positive, got {max_tokens}")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int32)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int32)
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.buckets = buckets

    def batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's batches, each an array of pair indices (int32 views of one index
        array: at millions of pairs, lists of Python ints would take several times the
        memory, int64 twice)."""
        rng = np.random.default_rng([self.seed, epoch])
        order = np.arange(len(self.src_lengths), dtype=np.int32)
        if self.shuffle:
            rng.shuffle(order)  # in place: the same permutation as rng.permutation(n)
        # Stable sort by the longer side (what the bound is on), then source, then target
        # length: the shuffle above only breaks ties. Padding on Multi30k: 4%.
        order, longer = _by_length(order, self.src_lengths, self.tgt_lengths)
        if self.buckets is not None:  # still ascending: the bound on the padded length
            longer = self.buckets.length(longer)
        batches = np.split(order, _batch_bounds(longer, self.max_tokens)) if len(order) else []
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def padding_fraction(self, epoch: int = 0) -> float:
        """Padding slots over all slots of the batch tensors, both sides together."""
        slots = real = 0
        for batch in self.batches(epoch):
            s, t = self.src_lengths[batch], self.tgt_lengths[batch]
            slots += len(batch) * (int(s.max()) + int(t.max()))
            real += int(s.sum()) + int(t.sum())
        return 1.0 - real / slots if slots else 0.0


def _by_length(
    order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``order`` stably sorted by (longer side, source, target length), and the longer
    side's length of each pair in that order.

    ``np.lexsort`` does this, with an int64 index and copies of its three keys: 44 bytes a
    pair. Packing the three lengths and each pair's position into one uint64 and sorting
    that in place takes about half, and gives the same order (the position makes every key
    distinct, so ties keep their order). Lengths too long to pack fall back to lexsort.
    """
    src, tgt = src_lengths[order], tgt_lengths[order]
    bits = max(int(src.max(initial=0)), int(tgt.max(initial=0))).bit_length()
    places = max(len(order) - 1, 0).bit_length()
    if 3 * bits + places > 64:
        sort = np.lexsort((tgt, src, np.maximum(src, tgt)))
        order = order[sort]
        return order, np.maximum(src_lengths[order], tgt_lengths[order])
    key = np.maximum(src, tgt).astype(np.uint64)
    for length in (src, tgt):
        key <<= np.uint64(bits)
        key |= length.astype(np.uint64)
    del src, tgt
    key <<= np.uint64(places)
    key |= np.arange(len(order), dtype=np.uint64)
    key.sort()
    longer = (key >> np.uint64(2 * bits + places)).astype(np.int32)
    key &= np.uint64((1 << places) - 1)
    return order[key], longer


def _batch_bounds(longer: np.ndarray, max_tokens: int) -> list[int]:
    """Where batches end in pairs sorted by their longer side (``longer``, ascending): a
    batch grows while ``(size + 1) * longer <= max_tokens``, the newest pair being the
    longest so far; a pair longer than ``max_tokens`` gets a batch of its own. One pass
    over the distinct lengths, not over the pairs."""
    bounds, size, end = [], 0, 0
    starts = np.flatnonzero(np.diff(longer, prepend=-1))  # where each distinct length begins
    counts = np.diff(starts, append=len(longer))
    for length, count in zip(longer[starts].tolist(), counts.tolist(), strict=True):
        room = max(1, max_tokens // length)  # pairs of this length a batch holds
        while count:
            if size >= room:  # the open batch is full at this length: close it
                bounds.append(end)
                size = 0
            take = min(count, room - size)
            size, end, count = size + take, end + take, count - take
    return bounds


def batches_of(
    src: list[list[int]], tgt: list[list[int]] | None, max_tokens: int
) -> list[list[int]]:
    lengths = [len(s) + 1 for s in src]
    tgt_lengths = [len(t) + 1 for t in tgt] if tgt is not None else lengths
    return TokenBatchSampler(lengths, tgt_lengths, max_tokens, seed=0, shuffle=False).batches(0)


@dataclass
class Batch:
    """Padded id tensors of one batch.

    Shapes:
        src: (B, S), ids + EOS; tgt_in: (B, T), BOS + ids; tgt_out: (B, T), ids + EOS.
        All right-padded with PAD; the target tensors are None when there is no target.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor | None = None
    tgt_out: torch.Tensor | None = None
    n_tgt_tokens: int = 0  # non-pad positions of tgt_out: what the loss is averaged over

    def to(self, device: torch.device | str) -> Batch:
        def move(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.to(device, non_blocking=True)

        return Batch(move(self.src), move(self.tgt_in), move(self.tgt_out), self.n_tgt_tokens)

    def pinned(self, pin: bool = True) -> Batch:
        """In page-locked memory (when ``pin``), so that ``to(cuda)`` copies asynchronously."""
        if not pin:
            return self

        def page_locked(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.pin_memory()

        src, tgt_in, tgt_out = map(page_locked, (self.src, self.tgt_in, self.tgt_out))
        return Batch(src, tgt_in, tgt_out, self.n_tgt_tokens)

    def padded_to(self, rows: int, length: int) -> Batch:
        """This batch as ``(rows, length)`` on both sides: PAD after each row, and rows that
        add nothing to the loss or its gradient: a source of EOS alone (attention over a row
        of PAD alone would have nothing to read: NaN), a target of BOS in and PAD out."""

        def grown(x: torch.Tensor, first: int) -> torch.Tensor:
            out = x.new_full((rows, length), PAD_ID)
            out[: x.shape[0], : x.shape[1]] = x
            out[x.shape[0] :, 0] = first
            return out

        return Batch(
            grown(self.src, EOS_ID),
            grown(self.tgt_in, BOS_ID),
            grown(self.tgt_out, PAD_ID),
            self.n_tgt_tokens,
        )


def _pad(rows: Sequence[Sequence[int]], first: int | None, last: int | None) -> torch.Tensor:
    """``rows`` of ids (lists or numpy arrays) as one right-padded (B, T) tensor, each row
    with ``first`` before it and ``last`` after it where they are given."""
    start, extra = int(first is not None), int(first is not None) + int(last is not None)
    out = np.full((len(rows), max(len(r) for r in rows) + extra), PAD_ID, dtype=np.int64)
    if first is not None:
        out[:, 0] = first
    for b, row in enumerate(rows):
        out[b, start : start + len(row)] = row
        if last is not None:
            out[b, start + len(row)] = last
    return torch.from_numpy(out)


def collate(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]] | None,
    buckets: Buckets | None = None,
) -> Batch:
    """The pairs as one padded batch; with ``buckets`` (and targets), at its bucket's shape."""
    src = _pad(src_ids, None, EOS_ID)  # (B, S): ids + EOS
    if tgt_ids is None:
        return Batch(src)
    tgt_in = _pad(tgt_ids, BOS_ID, None)  # (B, T): BOS + ids
    tgt_out = _pad(tgt_ids, None, EOS_ID)  # (B, T): ids + EOS
    n_tokens = sum(len(ids) + 1 for ids in tgt_ids)  # non-pad positions of tgt_out
    batch = Batch(src, tgt_in, tgt_out, n_tokens)
    return batch if buckets is None else batch.padded_to(*buckets.shape(batch))


class Prefetcher:
    """``make(item)`` for each of ``items``, computed ``ahead`` items in advance on a
    background thread, so that a training step never waits for its batches to be gathered
    and padded (0 = in the caller's thread, when asked). Iterate inside ``with``: leaving
    early stops the thread."""

    def __init__(self, make: Callable[[Item], Made], items: Sequence[Item], ahead: int):
        self.make, self.items, self.ahead = make, items, ahead
        self.queue: queue.Queue = queue.Queue(maxsize=max(ahead, 1))
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> Iterator[Made]:
        if self.ahead <= 0:
            return (self.make(item) for item in self.items)
        self.thread = threading.Thread(target=self._fill, daemon=True)
        self.thread.start()
        return self._drain()

    def _fill(self) -> None:
        for item in self.items:
            try:
                made = (self.make(item), None)
            except BaseException as e:  # raised again in the training thread
                made = (None, e)
            while not self.stop.is_set():
                try:
                    self.queue.put(made, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self.stop.is_set() or made[1] is not None:
                return

    def _drain(self) -> Iterator[Made]:
        for _ in self.items:
            made, error = self.queue.get()
            if error is not None:
                raise error
            yield made

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
