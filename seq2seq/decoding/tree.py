"""The beam search as a tree: what every step scored, and what it kept, finished or pruned.

``beam_search(..., tree=SearchTree())`` fills one ``BeamTree`` per sentence. At each step,
for each open beam, it records the beam's ``width`` best continuations, ``width = max(K + 1,
MIN_WIDTH)``: they hold every continuation the search kept or finished (one among a sentence's
K best open ones is among its own beam's K best open ones, and a beam has one EOS). Each has its token, log-probability, cumulative score,
normalized score ``score / gnmt_length_penalty(step)`` and its fate:

- ``kept``: among the K best continuations that did not end: a beam of the next step;
- ``eos``: ended in EOS among the K best: finished;
- ``max_len``: kept at the step the sentence reached max_len: finished there;
- ``width``: outside the K best (or an EOS outside them): pruned by the beam width;
- ``eos_ban``: EOS under ``decode.ban_eos``, never scored by the search: its log-probability is
  the model's before the ban.

Past ``MAX_STEPS`` steps it records only what ended (``BeamTree.endings``), not the nodes.
Recording reads the search's tensors and changes nothing it decodes; it copies a step's
candidates to the host, and costs nothing when no tree is given.

Letters: ``B`` sentences, ``K`` beams, ``V`` vocabulary, ``L`` layers, ``H`` heads, ``S``
source positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor

from seq2seq.config import DecodeConfig
from seq2seq.decoding.beam import Candidates, Endings, gnmt_length_penalty
from seq2seq.vocab import BOS_ID, EOS_ID

MIN_WIDTH = 3  # continuations recorded per open beam, at least
MAX_STEPS = 40  # steps whose nodes are recorded; a page draws every node it holds


@dataclass
class Node:
    step: int  # 0: the root, BOS
    parent: int | None  # index in BeamTree.nodes
    token: int
    logp: float  # of this token after its parent's prefix
    score: float  # cumulative: the prefix's log-probability
    normalized: float  # score / gnmt_length_penalty(step, alpha)
    fate: str  # kept | eos | max_len | width | eos_ban (the module's docstring)
    # (L, H, S): the cross-attention row its children were scored with (nodes expanded).
    attention: Tensor | None = None


@dataclass
class Ending:
    tokens: list[int]  # without BOS and the final EOS, as search.Hypothesis
    score: float
    normalized: float
    step: int  # tokens scored, the EOS included
    stop_reason: str  # "eos" | "max_len"
    node: int | None  # None past MAX_STEPS


@dataclass
class BeamTree:
    """One sentence's search: its nodes (0 is the root), every hypothesis that ended, and how
    the search stopped (``end``: step, reason "max_len" or "early", and for "early" the best
    open beam's normalized score against the worst finished one's)."""

    beam: int
    alpha: float
    width: int
    nodes: list[Node] = field(default_factory=list)
    endings: list[Ending] = field(default_factory=list)
    end: dict = field(default_factory=dict)
    truncated: bool = False  # steps past MAX_STEPS were decoded but not recorded


class SearchTree:
    """What ``beam_search`` records into: ``trees``, one ``BeamTree`` per sentence."""

    def __init__(self, max_steps: int = MAX_STEPS) -> None:
        self.max_steps = max_steps
        self.trees: list[BeamTree] = []

    def start(self, decode: DecodeConfig, src_lens: list[int]) -> None:
        """A root per sentence on its beam 0; the other start beams are the same one."""
        k = decode.beam
        self.k, self.alpha, self.src_lens = k, decode.length_penalty, src_lens
        self.ban_eos = decode.ban_eos
        width = max(k + 1, MIN_WIDTH)
        self.trees = [BeamTree(k, self.alpha, width) for _ in src_lens]
        self.row_node: dict[int, int | None] = {}  # flat row (b * K + beam) -> its node
        self.paths: dict[int, list[int]] = {}  # flat row -> its tokens
        for b, tree in enumerate(self.trees):
            tree.nodes.append(Node(0, None, BOS_ID, 0.0, 0.0, 0.0, "kept"))
            self.row_node[b * k], self.paths[b * k] = 0, []

    def add_step(
        self,
        n: int,
        scores: Tensor,
        logp: Tensor,
        candidates: Candidates,
        kept: tuple[Tensor, Tensor, Tensor],
        at_limit: Tensor,
        done: tuple[Tensor, Tensor],
        finished: Endings,
        step_weights: list[Tensor],
        logits: Tensor,
    ) -> None:
        """Step ``n`` of the search: the open beams' ``scores`` before it, the ``logp`` they
        were expanded with, its ``candidates``, the beams ``kept`` (scores, parent rows,
        tokens), the sentences ``at_limit`` and ``done`` before and after it, the ``finished``
        set after it; the cross-attention of every step so far (``step_weights``, empty
        unless the search keeps them) and the decoder's ``logits`` (for EOS where banned).

        Shapes: scores (B, K), logp (B, K, V), kept (B, K) each, at_limit and done (B,),
        step_weights[-1] (B*K, L, H, S), logits (B*K, T, V)
        """
        width = self.trees[0].width if self.trees else 1
        best_logp, best_token = logp.topk(min(width, logp.shape[-1]), dim=-1)  # (B, K, W)
        host = {
            "scores": scores, "best_logp": best_logp, "best_token": best_token,
            "cand_parent": candidates.parent, "cand_token": candidates.token,
            "cand_score": candidates.score, "kept_score": kept[0], "kept_parent": kept[1],
            "kept_token": kept[2], "at_limit": at_limit, "was_done": done[0], "done": done[1],
            "worst_finished": finished.normalized[:, -1],
        }  # fmt: skip
        if self.ban_eos:
            host["eos_logp"] = eos_logprob(logits)
        host = {key: value.tolist() for key, value in host.items()}  # one copy per tensor
        weights = step_weights[-1] if step_weights else None
        paths = {}
        for b, tree in enumerate(self.trees):
            if host["was_done"][b]:
                continue
            record = n <= self.max_steps
            tree.truncated |= not record
            children = self._children(b, n, host, logp) if record else {}
            if record and weights is not None:
                self._attention(b, weights)
            paths.update(self._advance(b, n, tree, host, children))
            self._end(b, n, tree, host)
        self.paths = paths

    def _children(self, b: int, n: int, host: dict, logp: Tensor) -> dict:
        """Record each open beam's best continuations (and any kept one that ties pushed out
        of them, and EOS where banned); returns {(parent row, token): node index}."""
        k, tree = self.k, self.trees[b]
        penalty = gnmt_length_penalty(n, self.alpha)
        kept = set(_zipped(host, b, "kept_parent", "kept_token"))
        ended = {
            (p, t)
            for rank, (p, t) in enumerate(_zipped(host, b, "cand_parent", "cand_token"))
            if t == EOS_ID and rank < k
        }
        fate_kept = "max_len" if host["at_limit"][b] else "kept"
        children = {}
        for j in range(k):
            row, before = b * k + j, host["scores"][b][j]
            if math.isinf(before) or row not in self.row_node:
                continue  # at the first step only beam 0 is open
            shown = dict(zip(host["best_token"][b][j], host["best_logp"][b][j], strict=True))
            for p, t in kept | ended:
                if p == row and t not in shown:
                    shown[t] = float(logp[b, j, t])
            if "eos_logp" in host:
                shown[EOS_ID] = host["eos_logp"][row]
            for token, lp in shown.items():
                if math.isinf(lp):
                    continue  # PAD and BOS are never output
                key = (row, token)
                fate = "eos" if key in ended else fate_kept if key in kept else "width"
                if token == EOS_ID and "eos_logp" in host:
                    fate = "eos_ban"
                score = before + lp
                tree.nodes.append(
                    Node(n, self.row_node[row], token, lp, score, score / penalty, fate)
                )
                children[key] = len(tree.nodes) - 1
        return children

    def _attention(self, b: int, weights: Tensor) -> None:
        """Each open beam's node gets the cross-attention row its children were scored with."""
        tree, s = self.trees[b], self.src_lens[b]
        for j in range(self.k):
            node = self.row_node.get(b * self.k + j)
            if node is not None and tree.nodes[node].attention is None:
                tree.nodes[node].attention = weights[b * self.k + j, ..., :s].float().cpu()

    def _advance(self, b: int, n: int, tree: BeamTree, host: dict, children: dict) -> dict:
        """Record what ended at step ``n`` and move the beams on: the new rows' nodes and
        paths (the paths returned, as {row: tokens})."""
        k, penalty = self.k, gnmt_length_penalty(n, self.alpha)
        cands = _zipped(host, b, "cand_parent", "cand_token", "cand_score")
        for rank, (p, t, score) in enumerate(cands):
            if t == EOS_ID and rank < k and p in self.paths and math.isfinite(score):
                node = children.get((p, t))
                tree.endings.append(Ending(self.paths[p], score, score / penalty, n, "eos", node))
        paths = {}
        beams = _zipped(host, b, "kept_parent", "kept_token", "kept_score")
        for j, (p, t, score) in enumerate(beams):
            path, node = self.paths.get(p, []) + [t], children.get((p, t))  # [] a -inf beam's
            self.row_node[b * k + j] = node
            paths[b * k + j] = path
            if host["at_limit"][b] and math.isfinite(score):
                tree.endings.append(Ending(path, score, score / penalty, n, "max_len", node))
        return paths

    def _end(self, b: int, n: int, tree: BeamTree, host: dict) -> None:
        if not host["done"][b]:
            return
        if host["at_limit"][b]:
            tree.end = {"step": n, "reason": "max_len"}
            return
        best_open = host["kept_score"][b][0] / gnmt_length_penalty(n, self.alpha)
        tree.end = {
            "step": n,
            "reason": "early",
            "best_open": best_open,
            "worst_finished": host["worst_finished"][b],
        }


def _zipped(host: dict, b: int, *keys: str) -> list[tuple]:
    """Sentence ``b``'s entries of the host copies ``keys``: a tuple per candidate or beam."""
    return list(zip(*(host[key][b] for key in keys), strict=True))


def eos_logprob(logits: Tensor) -> Tensor:
    """EOS's log-probability at the last position, before any ban: (rows, T, V) -> (rows,)."""
    return logits[:, -1].float().log_softmax(-1)[:, EOS_ID]
