"""Influence by occlusion: what each source position does to each output token, for one
sentence, beside where cross-attention read.

A cross-attention map shows where a query read, not why a token came out. Occlusion
measures the second: teacher-forced on an output, each target token's log-probability
with one source position (or a group of positions, e.g. a word) hidden from
cross-attention in every decoder layer (the key padding mask False there; the encoder
and everything else as they are), against nothing hidden. The drop is the position's
*influence* on the token: positive where hiding it made the token less likely. It is one
measure of influence, with its own caveats: a hidden position is an input the model never
saw in training, and the rest of the source can stand in for it. ``interventions.py``
changes the weights themselves and decodes again.

Letters: ``L`` decoder layers, ``H`` heads, ``T`` target positions (the EOS step included
when scored), ``S`` source positions, ``O`` occlusions (groups of positions hidden), ``V``
vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from seq2seq.decoding.deadline import check_deadline
from seq2seq.model.masks import check_rows, padding_mask
from seq2seq.model.transformer import Seq2Seq
from seq2seq.run.precision import tf32_in_force
from seq2seq.vocab import BOS_ID

# Logits per occlusion pass, (O, T, V) floats: 128 MB in fp32. 40 source by 40 target
# subwords with a vocabulary of 16,000 fit in one pass; longer sentences take a few.
MAX_LOGITS = 2**25
# Two drops closer than this are a tie: rounding, in the map's precision, decides which is larger.
# Each is above the largest move of a row's top-two gap in the records of every machine measured
# (experiments/results/influence_precision_tour*.json, the tour's model, by
# experiments/influence_precision.py; bf16 autocast moves it most where the CPU emulates bf16).
TIE_NATS = 0.15  # a map computed under bf16 autocast
TIE_NATS_FP32 = 1e-5
# Not measured (TF32 is CUDA's alone): TF32 rounds a matrix multiply's inputs to 10 mantissa
# bits where bf16 keeps 7, so bf16's threshold is the wider of the two. fp16 autocast keeps 10
# too, not measured either: it takes bf16's.
TIE_NATS_TF32 = TIE_NATS


def tie_nats(dtype: torch.dtype | None, device: torch.device | None = None) -> float:
    """The tie threshold of a map computed now under autocast to ``dtype`` (None: fp32) on
    ``device``, by the precision in force: TF32 matrix multiplies there take TF32's."""
    if dtype in (torch.bfloat16, torch.float16):
        return TIE_NATS
    return TIE_NATS_TF32 if device is not None and tf32_in_force(device) else TIE_NATS_FP32


def influence_note(scored: str = "this output", tie: float = TIE_NATS) -> str:
    """What the explorer says of its influence map; ``scored``: what was teacher-forced
    (the output the search produced, or a given reference); ``tie``: its tie threshold."""
    return (
        "Influence by occlusion: the drop in each output token's log-probability (nats, signed, "
        f"teacher-forced on {scored}) when a source position is hidden from cross-attention "
        "in every layer. One measure of influence: a hidden position is an input the model "
        "never saw in training, and other positions can stand in for it. Drops within "
        f"{tie} nats of a row's largest are a tie (rounding in the precision the map was "
        "computed in moves a drop by less)."
    )


@dataclass
class Occlusion:
    """Each target token's probability with nothing hidden and with each group hidden.

    Shapes: probs, log_probs (T,); masked_probs, masked_log_probs (O, T); attention: the
    unmasked cross-attention, per layer (H, T, S), where asked for
    """

    probs: Tensor
    log_probs: Tensor
    masked_probs: Tensor
    masked_log_probs: Tensor
    attention: list[Tensor]
    passes: int  # decoder passes it took

    @property
    def influence(self) -> Tensor:
        """The drop in each target token's log-probability when each group is hidden:
        (T, O); positive where hiding it made the token less likely."""
        return (self.log_probs[None, :] - self.masked_log_probs).T


def occlude(
    model: Seq2Seq,
    src: Tensor,
    tgt_ids: Sequence[int],
    groups: Sequence[Sequence[int]] | None = None,
    *,
    max_logits: int | None = MAX_LOGITS,
    need_weights: bool = False,
) -> Occlusion:
    """Teacher-force ``tgt_ids`` once as is and once per group of source positions hidden
    from cross-attention in every layer, batched: the unmasked row and the ``O`` occlusions
    in one pass, or in a few of the same batch size and at most ``max_logits`` logits each
    (None: one), so that the drop compares rows the decoder computed alike.

    ``tgt_ids`` are the tokens scored, BOS excluded: an output that stopped at EOS ends
    with it. ``groups`` default to every position alone (``O = S``); a group may hold the
    subwords of a word; none at all leaves the unmasked row alone. The encoder sees the
    whole source in every pass. ``need_weights``: one more pass, alone, for the unmasked
    cross-attention (``Occlusion.attention``; else an empty list).

    Shapes:
        src: (1, S); tgt_ids: T ids; groups: O lists of positions -> ``Occlusion``
    """
    if src.shape[0] != 1:
        raise ValueError(f"occlude takes one sentence, got a batch of {src.shape[0]}")
    if not tgt_ids:
        raise ValueError("occlude needs at least one target token to score")
    if model.training:
        raise ValueError("Occlusion needs the model in eval mode (dropout off): call model.eval()")
    s, device = src.shape[1], src.device
    groups = [[j] for j in range(s)] if groups is None else groups
    hidden = torch.zeros(1 + len(groups), s, dtype=torch.bool)  # (1 + O, S), filled on the host
    for row, positions in enumerate(groups, start=1):  # row 0 hides nothing
        hidden[row, list(positions)] = True
    hidden = hidden.to(device)  # one copy, not one a group
    with torch.inference_mode():
        src_mask = padding_mask(src)  # (1, 1, 1, S)
        allowed = src_mask & ~hidden[:, None, None, :]  # (1 + O, 1, 1, S)
        check_rows(allowed)  # a group may not hide every real position
        memory = model.encode(src, src_mask)  # (1, S, D)
        tgt_in = torch.tensor([[BOS_ID, *tgt_ids[:-1]]], device=device)  # (1, T)
        target = torch.tensor(list(tgt_ids), device=device)  # (T,)
        rows = allowed.shape[0]
        n = rows
        if max_logits is not None:
            n = max(1, min(n, max_logits // (len(tgt_ids) * model.config.tgt_vocab_size)))
        # The last pass filled up with unmasked rows (dropped after), to the others' size.
        filled = torch.cat([allowed, src_mask.expand(-rows % n, -1, -1, -1)])  # (n * passes, ...)
        scored = []
        for part in filled.split(n):  # (n, 1, 1, S)
            check_deadline()
            part_logits, _ = model.decode(tgt_in.expand(n, -1), memory.expand(n, -1, -1), part)
            scored.append(_target_probs(part_logits, target))  # (n, T) twice
        probs = torch.cat([p for p, _ in scored])[:rows]  # (1 + O, T)
        log_probs = torch.cat([lp for _, lp in scored])[:rows]
        attention = []
        if need_weights:
            _, weights = model.decode(tgt_in, memory, src_mask, need_weights=True)
            attention = [w[0] for w in weights]
    return Occlusion(
        probs=probs[0],
        log_probs=log_probs[0],
        masked_probs=probs[1:],
        masked_log_probs=log_probs[1:],
        attention=attention,
        passes=len(scored) + need_weights,
    )


def _target_probs(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Probability and log-probability of each target token, in fp32 or wider (bf16 logits
    are widened, float64 ones kept): (B, T, V) -> (B, T) twice."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    steps = torch.arange(target.shape[0], device=target.device)
    return (
        logits.softmax(-1)[:, steps, target],
        logits.log_softmax(-1)[:, steps, target],
    )


def tied_columns(influence: np.ndarray | Tensor, tie: float = TIE_NATS) -> list[list[int]]:
    """Per target row, the source columns whose drop is within ``tie`` nats of the row's
    largest, in column order: one column where the row's most influential is decided, more
    where it is a tie. Shapes: influence (T, S) -> T lists"""
    drops = np.asarray(influence, dtype=np.float64)
    near = drops >= drops.max(-1, keepdims=True) - tie  # (T, S)
    return [np.flatnonzero(row).tolist() for row in near]


def agreement(
    attention: np.ndarray | Tensor, influence: np.ndarray | Tensor, tie: float = TIE_NATS
) -> dict[str, list]:
    """Per target row: the most-attended source column of ``attention`` (e.g. the mean over
    layers and heads), the most influential one (the largest drop), the columns tied with it
    (``tied_columns``), and whether the first two are the same: None where the row is a tie,
    which rounding decides; lists, for JSON.

    Shapes: attention, influence (T, S) -> four lists of T
    """
    attended = np.asarray(attention).argmax(-1).tolist()
    influential = np.asarray(influence).argmax(-1).tolist()
    tied = tied_columns(influence, tie)
    return {
        "most_attended": attended,
        "most_influential": influential,
        "tied": tied,
        "agree": [
            a == b if len(t) == 1 else None
            for a, b, t in zip(attended, influential, tied, strict=True)
        ],
    }
