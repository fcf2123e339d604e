"""Token batching: pairs of similar length, bounded in tokens per side, padded into tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from seq2seq.errors import Seq2SeqError
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID


class TokenBatchSampler:
    """Batches of similar-length pairs holding at most ``max_tokens`` per side, padding included.

    A batch of ``B`` pairs obeys ``max(B * S_max, B * T_max) <= max_tokens``; a single pair
    longer than that gets a batch of its own. Each epoch every pair appears exactly once;
    ties in length and the batch order are shuffled from ``(seed, epoch)``, so a resumed
    run can rebuild an epoch and skip the batches it has done.
    """

    def __init__(
        self,
        src_lengths: list[int],
        tgt_lengths: list[int],
        max_tokens: int,
        seed: int,
        shuffle: bool = True,
    ):
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError(
                f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths"
            )
        if max_tokens < 1:
            raise Seq2SeqError(f"max_tokens must be positive, got {max_tokens}")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle

    def batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        order = (
            rng.permutation(len(self.src_lengths))
            if self.shuffle
            else np.arange(len(self.src_lengths))
        )
        # Stable sort by the longer side (what the bound is on), then source, then target
        # length: the shuffle above only breaks ties. Padding on Multi30k: 4%.
        src, tgt = self.src_lengths[order], self.tgt_lengths[order]
        order = order[np.lexsort((tgt, src, np.maximum(src, tgt)))]
        batches: list[list[int]] = []
        batch: list[int] = []
        s_max = t_max = 0
        for i in order.tolist():
            s, t = max(s_max, self.src_lengths[i]), max(t_max, self.tgt_lengths[i])
            if batch and (len(batch) + 1) * max(s, t) > self.max_tokens:
                batches.append(batch)
                batch, s, t = [], self.src_lengths[i], self.tgt_lengths[i]
            batch.append(i)
            s_max, t_max = s, t
        if batch:
            batches.append(batch)
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


def _pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD_ID, dtype=torch.long)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def collate(src_ids: list[list[int]], tgt_ids: list[list[int]] | None) -> Batch:
    src = _pad([ids + [EOS_ID] for ids in src_ids])  # (B, S)
    if tgt_ids is None:
        return Batch(src)
    tgt_in = _pad([[BOS_ID] + ids for ids in tgt_ids])  # (B, T)
    tgt_out = _pad([ids + [EOS_ID] for ids in tgt_ids])  # (B, T)
    return Batch(src, tgt_in, tgt_out, int((tgt_out != PAD_ID).sum()))
