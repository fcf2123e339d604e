"""The steps of beam search (``search.beam_search``), each a small function over a batch of
sentences' beams: ``expand`` every open beam by every token to the 2K best continuations,
``finish_at_eos`` those that end, ``prune`` to the K best open ones, ``finish_at_limit`` the
beams that reach max_len, and ``is_done`` for sentences that no open beam can improve; an
``Endings`` keeps each sentence's K best finished hypotheses. They rank by GNMT's length
penalty (``gnmt_length_penalty``).

Letters: ``B`` sentences, ``K`` beams, ``V`` vocabulary, ``M`` endings a sentence holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.vocab import EOS_ID

GNMT_BASE, GNMT_SCALE = 5, 6  # GNMT's constants; the explorer's page re-ranks with them too


def gnmt_length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT's ``((5 + length) / 6) ** alpha``; ``length`` counts output tokens incl. EOS."""
    return ((GNMT_BASE + length) / GNMT_SCALE) ** alpha


@dataclass
class Endings:
    """Hypotheses that ended, per sentence; the last token came from row ``parent`` at
    ``step``. The finished set and each step's new endings are both ``Endings``.

    Shapes: every field (B, M)
    """

    normalized: Tensor  # -inf = empty slot
    score: Tensor
    step: Tensor  # steps decoded = tokens, EOS included
    parent: Tensor  # flat row (b * K + beam) before this step
    token: Tensor  # the last token: EOS or the max_len-th output token

    @classmethod
    def empty(cls, b: int, k: int, device: torch.device) -> Endings:
        none = torch.full((b, k), float("-inf"), device=device)
        zeros = torch.zeros(b, k, dtype=torch.long, device=device)
        return cls(
            normalized=none,
            score=none.clone(),
            step=zeros,
            parent=zeros.clone(),
            token=zeros.clone(),
        )

    def merge(self, other: Endings, k: int) -> Endings:
        """The K best of both by normalized score, best first."""
        normalized = torch.cat([self.normalized, other.normalized], 1)
        best, index = normalized.topk(k, dim=1)  # (B, K)

        def pick(a: Tensor, b: Tensor) -> Tensor:
            return torch.cat([a, b], 1).gather(1, index)

        return Endings(
            normalized=best,
            score=pick(self.score, other.score),
            step=pick(self.step, other.step),
            parent=pick(self.parent, other.parent),
            token=pick(self.token, other.token),
        )


@dataclass
class Candidates:
    """The 2K best continuations of each sentence's beams, best first. Shapes: (B, 2K)."""

    score: Tensor
    parent: Tensor  # flat row (b * K + beam)
    token: Tensor
    step: int


def expand(scores: Tensor, logp: Tensor, first_row: Tensor, step: int) -> Candidates:
    """Every open beam times every token, cut to the 2K best per sentence.

    Shapes: scores (B, K), logp (B, K, V), first_row (B, 1) -> (B, 2K)
    """
    k, v = logp.shape[1], logp.shape[2]
    total = (scores[:, :, None] + logp).view(scores.shape[0], k * v)  # (B, K*V)
    best, index = total.topk(min(2 * k, k * v), dim=1)  # (B, 2K)
    return Candidates(best, first_row + index // v, index % v, step)


def finish_at_eos(c: Candidates, k: int, done: Tensor, alpha: float) -> Endings:
    """EOS continuations among the K best of sentences not yet done, normalized."""
    rank = torch.arange(c.token.shape[1], device=c.token.device)
    ends = (c.token == EOS_ID) & (rank < k) & ~done[:, None]  # (B, 2K)
    normalized = (c.score / gnmt_length_penalty(c.step, alpha)).masked_fill(~ends, float("-inf"))
    step = torch.full_like(c.token, c.step)
    return Endings(normalized=normalized, score=c.score, step=step, parent=c.parent, token=c.token)


def prune(c: Candidates, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The K best continuations that did not end in EOS: scores, parent rows, tokens (B, K).

    Each beam has one EOS continuation, so at least K of the 2K are open."""
    open_scores = c.score.masked_fill(c.token == EOS_ID, float("-inf"))
    scores, index = open_scores.topk(k, dim=1)  # (B, K), best first
    return scores, c.parent.gather(1, index), c.token.gather(1, index)


def finish_at_limit(
    scores: Tensor, parent: Tensor, token: Tensor, at_limit: Tensor, *, alpha: float, step: int
) -> Endings:
    """The open beams of sentences that reached their max_len this step. Shapes: (B, K)."""
    normalized = (scores / gnmt_length_penalty(step, alpha)).masked_fill(
        ~at_limit[:, None], float("-inf")
    )
    steps = torch.full_like(token, step)
    return Endings(normalized=normalized, score=scores, step=steps, parent=parent, token=token)


def is_done(
    done: Tensor, finished: Endings, scores: Tensor, *, alpha: float, step: int, k: int
) -> Tensor:
    """Sentences with K finished hypotheses that the best open beam cannot beat. (B,)"""
    full = torch.isfinite(finished.normalized).sum(1) >= k
    best_open = scores[:, 0] / gnmt_length_penalty(step, alpha)
    return done | (full & (best_open <= finished.normalized[:, -1]))
