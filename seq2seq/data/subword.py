"""Subword regularisation: each epoch's training pairs segmented afresh by BPE-dropout
(Provilkov et al. 2020), a function of the run's seed and the epoch alone.

SentencePiece samples segmentations itself (``encode(..., enable_sampling=True)``), but not
reproducibly: 0.2.3 draws from an ``absl::BitGen``, which salts the seed given to
``set_random_generator_seed`` with a per-process secret, so the same seed gives other
segmentations in another process (measured: a run and its ``--resume`` would train on
different pairs). ``BpeDropout`` is SentencePiece's BPE merge loop (``bpe_model.cc``) over
the model's own pieces and scores, its coin drawn from Python's seeded ``random.Random``:
at ``alpha = 0`` it gives SentencePiece's ids exactly (tested on every training pair).

The source of an epoch is the store's deterministic ids, not the corpus: the pieces of a
pair spell the normalised text SentencePiece segmented, so an epoch is sampled from the
store alone, chunk by chunk, into a store of its own (``write_sampled_epoch``), in a worker
process while the epoch before it trains (``EpochSampler``): the merge loop is Python, and
on a thread it would hold the GIL against the training step. Under torchrun rank 0 alone
samples (``EpochSampler.sample``) and every rank reads its stores (``EpochSampler.read``).
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import sentencepiece as spm

from seq2seq.config import Config, subword_alpha_at
from seq2seq.data.store import (
    SIDES,
    PairStore,
    read_manifest,
    remove_store,
    write_manifest,
    write_pairs,
)
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import Seq2SeqError

SAMPLED_DIR = "subword"  # RUN/subword/epoch_N: the sampled stores, the current and the next
_CHUNK = 5_000  # pairs read, sampled and written at once
_POLL_S = 0.2  # how often the trainer, waiting for a worker, looks whether it should stop


class BpeDropout:
    """BPE-dropout over one SentencePiece BPE model: ``sample(ids, alpha, rng)`` segments the
    text of ``ids`` again, each merge skipped with probability ``alpha``."""

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        n = processor.get_piece_size()
        # Merges may only make normal pieces (not control, unknown, unused or byte ones), as
        # SentencePiece's PieceToIdNoReserved allows; BPE scores rank the merges.
        self.pieces = {
            processor.id_to_piece(i): (processor.get_score(i), i)
            for i in range(n)
            if not (
                processor.is_control(i)
                or processor.is_unknown(i)
                or processor.is_unused(i)
                or processor.is_byte(i)
            )
        }
        self.text_bytes = [self._bytes(processor, i) for i in range(n)]
        self.byte_ids = [processor.piece_to_id(f"<0x{b:02X}>") for b in range(256)]

    @staticmethod
    def _bytes(processor: spm.SentencePieceProcessor, i: int) -> bytes:
        """What piece ``i`` spells in the normalised text (U+2581 marking spaces)."""
        if processor.is_byte(i):
            return bytes([int(processor.id_to_piece(i)[3:5], 16)])
        if processor.is_control(i) or processor.is_unknown(i):
            return b""
        return processor.id_to_piece(i).encode("utf-8")

    def text(self, ids: np.ndarray) -> str:
        """The normalised text that SentencePiece segmented into ``ids``."""
        return b"".join(self.text_bytes[i] for i in ids.tolist()).decode("utf-8")

    def sample(self, text: str, alpha: float, rng: random.Random) -> list[int]:
        """``text`` (normalised) in pieces, by SentencePiece's merge loop with each merge
        dropped with probability ``alpha``; characters outside the vocabulary as bytes."""
        symbols = list(text)  # "" once merged into its left neighbour
        nexts = list(range(1, len(symbols))) + [-1]
        prevs = list(range(-1, len(symbols) - 1))
        agenda: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)

        def push(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                merged = self.pieces.get(symbols[left] + symbols[right])
                if merged is not None:
                    size = len(symbols[left]) + len(symbols[right])
                    heapq.heappush(agenda, (-merged[0], left, right, size))

        for left in range(len(symbols) - 1):
            push(left, left + 1)
        while agenda:
            _, left, right, size = heapq.heappop(agenda)
            a, b = symbols[left], symbols[right]
            if not a or not b or len(a) + len(b) != size:
                continue  # stale: one side was merged since
            if alpha and rng.random() < alpha:
                continue
            symbols[left], symbols[right] = a + b, ""
            nexts[left] = nexts[right]
            if nexts[right] >= 0:
                prevs[nexts[right]] = left
            push(prevs[left], left)
            push(left, nexts[left])
        ids: list[int] = []
        for piece in symbols:
            if piece:
                found = self.pieces.get(piece)
                if found is not None:
                    ids.append(found[1])
                else:  # byte fallback, as SentencePiece's
                    ids.extend(self.byte_ids[b] for b in piece.encode("utf-8"))
        return ids


def subword_rng(seed: int, epoch: int, side: str) -> random.Random:
    """The coin of one side of one epoch: the same on every machine, process and rank (the
    ranks of a torchrun job build one batch order from the sampled lengths)."""
    return random.Random(f"subword {seed} {epoch} {side}")


def write_sampled_epoch(
    store: PairStore,
    models: dict[str, Path],
    alpha: float,
    seed: int,
    epoch: int,
    max_len: int,
    directory: Path,
) -> str:
    """Sample every pair of ``store`` into a new store in ``directory``; its dtype. A side
    sampled longer than ``max_len`` keeps its deterministic ids (the model's positions)."""
    droppers = {
        side: BpeDropout(spm.SentencePieceProcessor(model_file=str(models[side]))) for side in SIDES
    }
    rngs = {side: subword_rng(seed, epoch, side) for side in SIDES}
    with write_pairs(directory, store.dtype) as writer:
        for start in range(0, len(store), _CHUNK):
            sides = store.pairs(range(start, min(start + _CHUNK, len(store))))
            sampled = []
            for side, pairs in zip(SIDES, sides, strict=True):
                dropper, rng = droppers[side], rngs[side]
                drawn = [dropper.sample(dropper.text(ids), alpha, rng) for ids in pairs]
                kept = zip(drawn, pairs, strict=True)
                sampled.append([d if len(d) <= max_len else ids.tolist() for d, ids in kept])
            writer.append(*sampled)
    write_manifest(directory, writer.description())


class EpochSampler:
    """The training pairs of each epoch: the store itself while ``alpha_at(epoch)`` is 0,
    else the store sampled for that epoch, in ``directory``/epoch_N. ``sample(N)`` has epoch
    N ready (waiting for its worker) and starts epoch N + 1's sampling in a worker process (at
    low priority), so that by the time the trainer asks for it, it is there; ``read(N)`` opens
    it, in this process or in another that shares ``directory`` (the ranks of a torchrun job).
    A resumed run samples its first epoch again (the same pairs: a function of the seed and
    the epoch) before its first step."""

    def __init__(
        self,
        store: PairStore,
        models: dict[str, Path],
        alpha_at: Callable[[int], float],
        seed: int,
        max_len: int,
        directory: Path,
    ) -> None:
        self.store, self.models, self.alpha_at = store, models, alpha_at
        self.seed, self.max_len, self.directory = seed, max_len, Path(directory)
        self.workers: dict[int, subprocess.Popen] = {}

    @classmethod
    def of_run(cls, config: Config, store: PairStore, run_dir: Path) -> EpochSampler | None:
        """A run's sampler of ``store``, when ``data.subword_alpha`` is set: rank 0 samples
        into RUN/subword, every rank reads it."""
        if not config.data.subword_alpha:
            return None
        return cls(
            store,
            Tokenizer.model_files(run_dir),
            lambda epoch: subword_alpha_at(config, epoch),
            config.train.seed,
            config.data.max_len,
            run_dir / SAMPLED_DIR,
        )

    def sample(self, epoch: int, stopping: Callable[[], bool] = lambda: False) -> bool:
        """Have epoch ``epoch``'s pairs ready for ``read``, waiting for their sampling if it has
        not finished, and start the next epoch's. False, the sampling stopped and its files
        removed, when ``stopping()`` (a signal to the trainer) turns true while it waits."""
        alpha = self.alpha_at(epoch)
        if alpha:
            self._start(epoch, alpha)
            if not self._wait(epoch, stopping):
                return False
        for old in [e for e in self.workers if e < epoch]:
            self._stop(old)
        self._remove_all_but(epoch, epoch + 1)
        if self.alpha_at(epoch + 1):
            self._start(epoch + 1, self.alpha_at(epoch + 1))
        return True

    def read(self, epoch: int) -> PairStore:
        """Epoch ``epoch``'s pairs, once ``sample(epoch)`` has returned True (here or in the
        process that samples)."""
        if not self.alpha_at(epoch):
            return self.store
        manifest = read_manifest(self._epoch_dir(epoch))
        if manifest is None:
            raise Seq2SeqError(
                f"no sampled subwords of epoch {epoch} in {self._epoch_dir(epoch)}: every "
                "machine of a torchrun job must see the same run directory (put --out on a "
                "shared filesystem)"
            )
        return PairStore(self._epoch_dir(epoch), manifest["dtype"])

    def _epoch_dir(self, epoch: int) -> Path:
        return self.directory / f"epoch_{epoch}"

    def _start(self, epoch: int, alpha: float) -> None:
        if epoch in self.workers:
            return
        args = [str(self.store.directory), self.store.dtype.name, str(self.models["src"])]
        args += [str(self.models["tgt"]), repr(alpha), str(self.seed), str(epoch)]
        args += [str(self.max_len), str(self._epoch_dir(epoch))]
        self.workers[epoch] = subprocess.Popen(
            [sys.executable, "-m", "seq2seq.data.subword", *args],
            env=worker_env(os.environ),
            stderr=subprocess.PIPE,
            text=True,
            # Not in the terminal's process group: a Ctrl-C reaches the trainer alone, which
            # stops the worker itself (_wait, __exit__). No preexec_fn: forking a process
            # whose threads run (the batch prefetcher, torch's) may not run Python code.
            start_new_session=True,
        )

    def _wait(self, epoch: int, stopping: Callable[[], bool]) -> bool:
        """Wait for epoch ``epoch``'s worker, asking ``stopping()`` every ``_POLL_S``: False
        when it said to stop first (the worker stopped)."""
        worker = self.workers[epoch]
        while True:
            if stopping():
                self._stop(epoch)
                return False
            try:
                _, err = worker.communicate(timeout=_POLL_S)
                break
            except subprocess.TimeoutExpired:
                continue
        del self.workers[epoch]
        if worker.returncode != 0 or read_manifest(self._epoch_dir(epoch)) is None:
            last = (err or "").strip().splitlines()[-1:] or [f"exit status {worker.returncode}"]
            raise Seq2SeqError(f"sampling the subwords of epoch {epoch} failed: {last[0]}")
        return True

    def _stop(self, epoch: int) -> None:
        """Stop epoch ``epoch``'s worker; what it had written goes too (it is sampled again
        when asked for)."""
        worker = self.workers.pop(epoch)
        worker.kill()
        worker.communicate()
        remove_store(self._epoch_dir(epoch))

    def _remove_all_but(self, *epochs: int) -> None:
        keep = {self._epoch_dir(e).name for e in epochs}
        for path in self.directory.glob("epoch_*"):
            if path.name not in keep:
                remove_store(path)

    def __enter__(self) -> EpochSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop any sampling still running: a run that has stopped needs no next epoch, and
        what a stopped worker had written of it goes too (a resumed run samples it again)."""
        for epoch in list(self.workers):
            self._stop(epoch)


def worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment: ``environ`` with this copy of seq2seq first on its
    PYTHONPATH, and no empty entry (which would put the worker's working directory there)."""
    package_root = str(Path(__file__).resolve().parents[2])
    entries = [package_root, *environ.get("PYTHONPATH", "").split(os.pathsep)]
    return {**environ, "PYTHONPATH": os.pathsep.join(entry for entry in entries if entry)}


def _main() -> None:
    """The worker: ``python -m seq2seq.data.subword STORE DTYPE SRC_MODEL TGT_MODEL ALPHA SEED
    EPOCH MAX_LEN OUT`` samples one epoch (``EpochSampler`` runs it)."""
    parser = argparse.ArgumentParser(description=_main.__doc__)
    for name, kind in [("store", Path), ("dtype", str), ("src", Path), ("tgt", Path)]:
        parser.add_argument(name, type=kind)
    for name, kind in [("alpha", float), ("seed", int), ("epoch", int), ("max_len", int)]:
        parser.add_argument(name, type=kind)
    parser.add_argument("out", type=Path)
    a = parser.parse_args()
    if hasattr(os, "nice"):  # low priority: the training step comes first
        os.nice(10)
    store = PairStore(a.store, a.dtype)
    models = {"src": a.src, "tgt": a.tgt}
    write_sampled_epoch(store, models, a.alpha, a.seed, a.epoch, a.max_len, a.out)


if __name__ == "__main__":
    _main()
