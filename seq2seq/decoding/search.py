"""Greedy and beam search as free functions over ``Seq2Seq.encode`` / ``Seq2Seq.decode``.

Both search a whole batch at once with the decoder's KV cache: the cross-attention K/V
are computed once per source sentence (a sentence's beams share them) and the
self-attention cache follows the beams through ``DecoderCache.reorder``. With
``decode.use_cache = False`` they recompute the whole prefix at every step instead: the
same output, slower. PAD and BOS are never output. Beam search's steps (expand, finish,
prune, when a sentence is done) are small functions of their own in ``seq2seq.decoding.beam``.

Every setting comes from one ``DecodeConfig`` (``seq2seq.config``), checked by its ``check``;
only what a caller wants back (``need_weights``) is a keyword argument. The distributions the
search chose from are read back by teacher-forcing its output (``step_probs``).

Length is decided by decoding. Each hypothesis stops at EOS or at its sentence's
``max_len = a * S + b`` output tokens (``max_output_length``), and says which in
``stop_reason``. ``S`` counts the non-padding positions of that sentence's ``src``: an EOS
the data pipeline appended to the source is counted. A step emits one token, so a
hypothesis that stopped at EOS has at most ``max_len - 1`` tokens plus the EOS, and one
that hit the limit has exactly ``max_len`` tokens.

A caller that must answer in time (``seq2seq serve``) sets a deadline
(``seq2seq.decoding.deadline``), which every search step checks.

Letters: ``B`` sentences, ``K`` beams, ``S`` source length, ``T`` decoding steps, ``V``
vocabulary, ``L`` decoder layers, ``H`` heads, ``N`` returned hypotheses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from seq2seq.config import DecodeConfig
from seq2seq.decoding import beam
from seq2seq.decoding.deadline import check_deadline
from seq2seq.decoding.tree import SearchTree
from seq2seq.model.masks import padding_mask
from seq2seq.model.transformer import Seq2Seq
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without BOS and without the final EOS
    score: float  # sum of log-probs, the EOS step included when it stopped at EOS
    stop_reason: str  # "eos" | "max_len"
    # Cross-attention (L, H, Tq, S_i) of this hypothesis, on the CPU; Tq = len(tokens) + 1
    # when it stopped at EOS (the EOS step included), else len(tokens); S_i = unpadded source.
    attention: Tensor | None = None
    # What the search ranked by: score / gnmt_length_penalty(len(tokens) + EOS) under beam
    # search; greedy search and force_decode apply no penalty, so there it equals score.
    normalized_score: float | None = None


def max_output_length(src_len: int, a: float, b: int, max_positions: int) -> int:
    """``a * src_len + b`` output tokens (floored, at least 1), capped so BOS plus every
    output token fits ``max_positions``: any output can be fed back to the decoder, e.g.
    teacher-forced by ``force_decode``."""
    if max_positions < 2:
        raise ValueError("max_positions must leave room for BOS and one token")
    # capped before flooring: a large finite a (1e308) makes a * src_len inf
    return max(1, math.floor(min(a * src_len + b, max_positions - 1)))


def greedy_search(
    model: Seq2Seq,
    src: Tensor,
    decode: DecodeConfig | None = None,
    *,
    need_weights: bool = False,
) -> list[Hypothesis]:
    """The most likely next token at every step, for a whole batch; one hypothesis each.

    Of ``decode`` (default ``DecodeConfig()``) it reads the length rule, ``use_cache`` and
    ``ban_eos``; ``need_weights`` returns each hypothesis' cross-attention (slower kernel).
    Finished rows keep running (fed PAD) but their outputs no longer change; the loop ends
    when every row has stopped. One host sync per step.

    Shapes:
        src: (B, S), right-padded with PAD_ID -> B hypotheses
    """
    decode = decode or DecodeConfig()
    use_cache = decode.use_cache
    _check(model, decode)
    with torch.inference_mode():
        memory, src_mask, max_lens = _encode(model, src, decode)
        b, device = src.shape[0], src.device
        steps = max(max_lens)
        limit = torch.tensor(max_lens, device=device)  # (B,)
        prefix = torch.full((b, steps + 1), PAD_ID, device=device)  # (B, 1 + T)
        prefix[:, 0] = BOS_ID
        scores = torch.zeros(b, device=device)
        finished = torch.zeros(b, dtype=torch.bool, device=device)
        end_step = torch.zeros(b, dtype=torch.long, device=device)
        cache = model.new_cache() if use_cache else None
        step_weights = []
        for n in range(1, steps + 1):
            check_deadline()
            tgt = prefix[:, n - 1 : n] if use_cache else prefix[:, :n]
            logits, weights = model.decode(
                tgt, memory, src_mask, cache=cache, need_weights=need_weights
            )
            if need_weights:
                step_weights.append(_last_weights(weights))
            best, token = _next_logprobs(logits, decode.ban_eos).max(-1)  # (B,)
            prefix[:, n] = token.masked_fill(finished, PAD_ID)
            scores += best.masked_fill(finished, 0.0)
            stops = ~finished & ((token == EOS_ID) | (limit == n))
            end_step.masked_fill_(stops, n)
            finished |= stops
            if finished.all():
                break

        ends = end_step.tolist()
        rows = prefix[:, 1:].tolist()
        last = [row[n - 1] for row, n in zip(rows, ends, strict=True)]
        attention = torch.stack(step_weights, 1) if need_weights else None  # (B, T, L, H, S)
        return _hypotheses(
            rows,
            steps=ends,
            last=last,
            scores=scores.tolist(),
            normalized=None,
            attention=attention,
            src_mask=src_mask,
        )


def beam_search(
    model: Seq2Seq,
    src: Tensor,
    decode: DecodeConfig,
    *,
    need_weights: bool = False,
    tree: SearchTree | None = None,
) -> list[list[Hypothesis]]:
    """Beam search for a whole batch: ``decode.nbest`` distinct hypotheses per sentence, best
    first, with ``K = decode.beam`` beams and GNMT length penalty ``decode.length_penalty``.

    Each step expands the K open beams of every sentence to their 2K best continuations
    (at the first step only beam 0, the others start at -inf). A continuation ending in EOS
    among the K best moves to its sentence's finished set, ranked by
    ``score / gnmt_length_penalty(len)`` with ``len`` counting the EOS; the K best others stay
    open, so K open beams always remain. The finished set keeps the K best.

    A sentence is done when its open beams reach ``max_len`` (they are finished with
    stop reason "max_len"), or when it holds K finished hypotheses and the best open beam's
    normalized score now, ``score / gnmt_length_penalty(len)`` at its current length, cannot beat
    the worst of them. Log-probs only fall with length, so for ``length_penalty <= 0`` this
    is exact; for ``> 0`` a longer hypothesis could still win through the growing penalty,
    and this is the usual heuristic (fairseq, Hugging Face ``early_stopping=False``). It
    makes ``beam=1`` equal greedy search for every ``length_penalty``.
    ``tree`` (``seq2seq.decoding.tree``) records every step's candidates and their fates, per
    sentence (with ``need_weights``, their cross-attention); it changes nothing decoded.

    Shapes:
        src: (B, S), right-padded with PAD_ID -> B lists of up to ``nbest`` hypotheses
    """
    _check(model, decode)
    alpha, k, use_cache = decode.length_penalty, decode.beam, decode.use_cache
    with torch.inference_mode():
        memory, src_mask, max_lens = _encode(model, src, decode)
        b, device = src.shape[0], src.device
        limit = torch.tensor(max_lens, device=device)  # (B,)
        rows_memory, rows_mask = _beam_memory(memory, src_mask, k, use_cache)
        cache = model.new_cache() if use_cache else None
        prefix = torch.full((b * k, 1), BOS_ID, device=device)  # (B*K, 1 + n)
        scores = torch.zeros(b, k, device=device)
        scores[:, 1:] = float("-inf")  # the K start beams are one and the same
        first_row = torch.arange(b, device=device)[:, None] * k  # (B, 1): beam 0 of each
        finished = beam.Endings.empty(b, k, device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        if tree is not None:
            tree.start(decode, src_mask.view(b, -1).sum(1).tolist())
        tokens, parents, step_weights = [], [], []  # per step (B*K,), (B*K,), (B*K, L, H, S)
        for n in range(1, max(max_lens) + 1):
            check_deadline()
            tgt = prefix[:, -1:] if use_cache else prefix
            logits, weights = model.decode(
                tgt, rows_memory, rows_mask, cache=cache, need_weights=need_weights
            )
            if need_weights:
                step_weights.append(_last_weights(weights))
            logp = _next_logprobs(logits, decode.ban_eos).view(b, k, -1)  # (B, K, V)
            candidates = beam.expand(scores, logp, first_row, n)
            finished = finished.merge(beam.finish_at_eos(candidates, k, done, alpha), k)
            open_scores, was_done = scores, done
            scores, parent, token = beam.prune(candidates, k)
            at_limit = ~done & (limit == n)
            ends = beam.finish_at_limit(scores, parent, token, at_limit, alpha=alpha, step=n)
            finished = finished.merge(ends, k)
            done = beam.is_done(done | at_limit, finished, scores, alpha=alpha, step=n, k=k)
            if tree is not None:
                tree.add_step(n, open_scores, logp, candidates, (scores, parent, token),
                              at_limit, (was_done, done), finished, step_weights, logits)  # fmt: skip
            tokens.append(token.flatten())
            parents.append(parent.flatten())
            if done.all():
                break
            if cache is not None:
                cache.reorder(parent.flatten())
            prefix = torch.cat([prefix.index_select(0, parent.flatten()), token.view(-1, 1)], 1)
        return _collect(finished, decode.nbest, tokens, parents, step_weights, src_mask)


def translate_batch(
    model: Seq2Seq, src: Tensor, decode: DecodeConfig, *, need_weights: bool = False
) -> list[list[Hypothesis]]:
    """Greedy search for ``decode.beam == 1`` (as one-element lists), beam search otherwise."""
    if decode.beam == 1:
        return [[h] for h in greedy_search(model, src, decode, need_weights=need_weights)]
    return beam_search(model, src, decode, need_weights=need_weights)


def force_decode(model: Seq2Seq, src: Tensor, tgt: list[list[int]]) -> list[Hypothesis]:
    """Teacher-force the given targets (ids without BOS/EOS; EOS is appended as the last
    step): their log-prob and cross-attention, e.g. for a reference translation.

    Shapes:
        src: (B, S); tgt: B lists of ids -> B hypotheses, attention (L, H, len + 1, S_i)
    """
    _check(model)
    if len(tgt) != src.shape[0]:
        raise ValueError(f"{len(tgt)} targets for {src.shape[0]} sources")
    with torch.inference_mode():
        src_mask = padding_mask(src)
        memory = model.encode(src, src_mask)
        # padded on the host, copied to the device once: (B, 1 + T)
        sequences = [torch.tensor([BOS_ID, *ids, EOS_ID]) for ids in tgt]
        padded = pad_sequence(sequences, batch_first=True, padding_value=PAD_ID).to(src.device)
        inputs, targets = padded[:, :-1], padded[:, 1:]  # (B, T)
        # The decoder is causal: inputs after a target's end cannot change its steps.
        logits, weights = model.decode(inputs, memory, src_mask, need_weights=True)
        logp = logits.float().log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)  # (B, T)
        scores = logp.masked_fill(targets == PAD_ID, 0.0).sum(1)
        attention = torch.stack(weights, 1).permute(0, 3, 1, 2, 4)  # (B, T, L, H, S)
        ends = [len(ids) + 1 for ids in tgt]
        rows = [[*ids, EOS_ID] for ids in tgt]
        return _hypotheses(
            rows,
            steps=ends,
            last=[EOS_ID] * len(tgt),
            scores=scores.tolist(),
            normalized=None,
            attention=attention,
            src_mask=src_mask,
        )


def step_probs(model: Seq2Seq, src: Tensor, tgt_ids: list[int]) -> Tensor:
    """The next-token distribution at every step of one given output, teacher-forced: the
    decoder is causal, so row n sees exactly the prefix a search saw when it chose
    ``tgt_ids[n]``, and gives the distribution it chose from (up to rounding: one pass, not
    step by step). PAD and BOS, never output, are 0; EOS banned, the search chose from these
    with EOS removed, and ``[:, EOS_ID]`` shows what the ban overrode.

    Shapes:
        src: (1, S); tgt_ids: Tq ids (the final EOS included where it stopped there) -> (Tq, V)
    """
    _check(model)
    with torch.inference_mode():
        src_mask = padding_mask(src)
        memory = model.encode(src, src_mask)
        inputs = torch.tensor([[BOS_ID, *tgt_ids[:-1]]], device=src.device)  # (1, Tq)
        logits, _ = model.decode(inputs, memory, src_mask)
        probs = logits[0].float().softmax(-1).cpu()  # (Tq, V)
        probs[:, [PAD_ID, BOS_ID]] = 0.0  # never output: the search sets them to -inf too
        return probs


def _check(model: Seq2Seq, decode: DecodeConfig | None = None) -> None:
    if model.training:
        raise ValueError("Decoding needs the model in eval mode (dropout off): call model.eval()")
    if decode is not None:
        decode.check()


def _beam_memory(
    memory: Tensor, src_mask: Tensor, k: int, use_cache: bool
) -> tuple[Tensor, Tensor]:
    """The memory and source mask each beam row reads: cached, a sentence's beams share its
    one copy of the cross-attention K/V; uncached, every row has its own. (B or B*K, ...)"""
    if use_cache:
        return memory, src_mask
    return memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)


def _encode(model: Seq2Seq, src: Tensor, decode: DecodeConfig) -> tuple[Tensor, Tensor, list[int]]:
    """Memory (B, S, D), source mask (B, 1, 1, S) and each sentence's max_len."""
    src_mask = padding_mask(src)
    memory = model.encode(src, src_mask)  # checks that every sentence has a real token
    src_lens = src_mask.view(src.shape[0], -1).sum(1).tolist()
    a, b, limit = decode.max_len_a, decode.max_len_b, model.config.max_positions
    max_lens = [max_output_length(s, a, b, limit) for s in src_lens]
    return memory, src_mask, max_lens


def _next_logprobs(logits: Tensor, ban_eos: bool) -> Tensor:
    """Log-probs of the next token from the last position: (rows, T, V) -> (rows, V).

    PAD and BOS are never outputs: fed back they would derail the decoder, and the
    detokenizer would drop them silently. As in fairseq they are set to -inf after the
    softmax, so a hypothesis' score stays the model's log-prob of its tokens (what
    ``force_decode`` computes)."""
    last = logits[:, -1].float()
    if ban_eos:  # on a copy: the logits stay the model's, which the search's tree reads
        last = last.clone()
        last[:, EOS_ID] = float("-inf")
    logp = last.log_softmax(-1)
    for never_output in (PAD_ID, BOS_ID):  # integer indices: no list copied to the device
        logp[:, never_output] = float("-inf")
    return logp


def _last_weights(weights: list[Tensor]) -> Tensor:
    """The newest query's cross-attention of every layer: L x (rows, H, T, S) -> (rows, L, H, S)."""
    return torch.stack([w[:, :, -1] for w in weights], 1)


def _collect(
    finished: beam.Endings,
    nbest: int,
    tokens: list[Tensor],
    parents: list[Tensor],
    step_weights: list[Tensor],
    src_mask: Tensor,
) -> list[list[Hypothesis]]:
    """Follow the back-pointers of the ``nbest`` best finished hypotheses per sentence,
    gathering their tokens and (when recorded) the attention of each of their steps."""
    b = finished.normalized.shape[0]
    steps = finished.step[:, :nbest].flatten()  # (N,)
    row = finished.parent[:, :nbest].flatten()  # each hypothesis' row before its last step
    last = finished.token[:, :nbest].flatten()
    n_max = int(steps.max())
    out = torch.full((steps.shape[0], n_max), PAD_ID, device=steps.device)  # (N, T)
    out.scatter_(1, steps[:, None].clamp(min=1) - 1, last[:, None])  # empty slots: step 0
    attention = []
    for s in range(n_max - 1, -1, -1):  # ``row`` is the hypothesis' row after s steps
        alive = s < steps
        if step_weights:
            attention.append(step_weights[s][row])  # (N, L, H, S)
        if s > 0:
            out[:, s - 1] = torch.where(alive, tokens[s - 1][row], out[:, s - 1])
            row = torch.where(alive, parents[s - 1][row], row)
    attention = torch.stack(attention[::-1], 1) if step_weights else None  # (N, T, L, H, S)

    valid = torch.isfinite(finished.normalized[:, :nbest]).flatten().tolist()
    hyps = _hypotheses(
        out.tolist(),
        steps=steps.tolist(),
        last=last.tolist(),
        scores=finished.score[:, :nbest].flatten().tolist(),
        normalized=finished.normalized[:, :nbest].flatten().tolist(),
        attention=attention,
        src_mask=src_mask.repeat_interleave(nbest, 0),
    )
    kept = [h if ok else None for h, ok in zip(hyps, valid, strict=True)]  # None: empty slot
    return [[h for h in kept[i * nbest : (i + 1) * nbest] if h is not None] for i in range(b)]


def _hypotheses(
    rows: list[list[int]],
    *,
    steps: list[int],
    last: list[int],
    scores: list[float],
    normalized: list[float] | None,
    attention: Tensor | None,
    src_mask: Tensor,
) -> list[Hypothesis]:
    """Hypothesis objects from padded outputs: ``rows[i][:steps[i]]`` are the tokens of
    hypothesis i, ending in EOS iff ``last[i]`` is EOS.

    Shapes: attention (N, T, L, H, S) or None; src_mask (N, 1, 1, S)
    """
    if attention is not None:
        attention = attention.float().cpu()
        keep = src_mask.view(src_mask.shape[0], -1).cpu()  # (N, S)
    hyps = []
    for i, (row, n, end) in enumerate(zip(rows, steps, last, strict=True)):
        eos = end == EOS_ID
        att = attention[i, :n].permute(1, 2, 0, 3)[..., keep[i]] if attention is not None else None
        hyps.append(
            Hypothesis(
                tokens=row[: n - 1] if eos else row[:n],
                score=scores[i],
                stop_reason="eos" if eos else "max_len",
                attention=att,  # (L, H, Tq, S_i)
                normalized_score=scores[i] if normalized is None else normalized[i],
            )
        )
    return hyps
