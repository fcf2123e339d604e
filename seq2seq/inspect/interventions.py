"""Interventions on cross-attention, and greedy decoding again under them.

Attention shows where a query read; changing what it reads shows whether the output
depends on it. An intervention replaces one decoder layer's (or every layer's)
cross-attention weights by uniform or row-permuted ones, or keeps them (the control: the
replacement code in place, the weights unchanged); or hides source positions from every
layer's cross-attention, as ``influence.occlude`` hides them. Only the decoding changes:
the encoder reads the whole source.

Layers and positions are numbered from 0 here (``model.decoder_layers[i]``); in a
``KIND[:N]`` spec (``parse_spec``), as the commands take it, from 1.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from seq2seq.config import DecodeConfig
from seq2seq.decoding.search import Hypothesis, greedy_search
from seq2seq.decoding.translate import Translator, one_line
from seq2seq.drawing.words import words_of
from seq2seq.errors import Seq2SeqError, whole_number
from seq2seq.model.attention import MultiHeadAttention
from seq2seq.model.masks import check_rows
from seq2seq.model.transformer import Seq2Seq

REPLACEMENTS = ("uniform", "permuted", "kept")  # what WeightReplacement puts in
KINDS = (*REPLACEMENTS, "mask")


class WeightReplacement:
    """Replaces a cross-attention's weights before the values are read, through the
    attention module's ``edit_weights`` hook: the same projections and cache, other weights.

    ``uniform``: every non-padding source position weighs 1/S_i. ``permuted``: each row of
    each head keeps its weights but moves them to a random order of the non-padding
    positions. ``kept``: the real weights (a control: the replacement itself changes
    nothing). Only for one source per query row (greedy search, teacher forcing),
    right-padded.

    Shapes: weights (B, H, Tq, S), allowed broadcastable to them -> (B, H, Tq, S)
    """

    def __init__(self, mode: str, seed: int = 0) -> None:
        if mode not in REPLACEMENTS:
            raise ValueError(f"unknown replacement '{mode}' (use {', '.join(REPLACEMENTS)})")
        self.mode = mode
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, weights: Tensor, allowed: Tensor | None) -> Tensor:
        keep = (
            torch.ones_like(weights, dtype=torch.bool)
            if allowed is None
            else allowed.expand_as(weights)
        )
        if self.mode == "kept":
            return weights
        if self.mode == "uniform":
            w = keep.float()
            return w / w.sum(-1, keepdim=True)
        s = weights.shape[-1]
        # Padding sorts last and in place (right padding): only real positions are shuffled.
        key = torch.where(
            keep,
            torch.rand(weights.shape, generator=self.generator).to(weights.device),
            2.0 + torch.arange(s, dtype=weights.dtype, device=weights.device),
        )
        return weights.gather(-1, key.argsort(-1))


class HiddenSource(nn.Module):
    """A decoder layer's cross-attention with some source positions hidden (the key mask
    False there), as ``occlude`` hides them; everything else as ``inner`` does it.

    Shapes: keep (1, 1, 1, S), True = may attend; otherwise as ``MultiHeadAttention``
    """

    def __init__(self, inner: MultiHeadAttention, keep: Tensor) -> None:
        super().__init__()
        self.inner, self.keep = inner, keep

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Tensor | None = None,
        need_weights: bool = False,
        cache=None,
    ) -> tuple[Tensor, Tensor | None]:
        allowed = self.keep if allowed is None else allowed & self.keep
        return self.inner(q, k, v, allowed, need_weights=need_weights, cache=cache)


@contextmanager
def _wrapped(
    model: Seq2Seq, layers: Sequence[int], wrap: Callable[[int, nn.Module], nn.Module]
) -> Iterator[None]:
    """The cross-attention of ``layers`` replaced by ``wrap(i, original)``, then restored."""
    saved = {}
    try:
        for i in layers:
            saved[i] = model.decoder_layers[i].cross_attn
            model.decoder_layers[i].cross_attn = wrap(i, saved[i])
        yield
    finally:
        for i, attn in saved.items():
            model.decoder_layers[i].cross_attn = attn


@contextmanager
def replaced(model: Seq2Seq, layers: Sequence[int], mode: str) -> Iterator[None]:
    """A context in which the cross-attention weights of ``layers`` (from 0) are replaced
    (``WeightReplacement`` in each one's ``edit_weights``; layer i draws its permutations
    from seed i)."""
    edits = {i: WeightReplacement(mode, seed=i) for i in layers}  # refuses a bad mode first
    try:
        for i, edit in edits.items():
            model.decoder_layers[i].cross_attn.edit_weights = edit
        yield
    finally:
        for i in edits:
            model.decoder_layers[i].cross_attn.edit_weights = None


def hidden_source(
    model: Seq2Seq, positions: Sequence[int], src_len: int
) -> AbstractContextManager[None]:
    """A context in which source ``positions`` are hidden from every layer's cross-attention
    (``HiddenSource``), for sources of ``src_len`` positions."""
    device = next(model.parameters()).device
    keep = torch.ones(1, 1, 1, src_len, dtype=torch.bool, device=device)
    keep[..., list(positions)] = False
    check_rows(keep)  # something must stay visible
    layers = range(len(model.decoder_layers))
    return _wrapped(model, layers, lambda _, inner: HiddenSource(inner, keep))


@dataclass
class Intervention:
    """Greedy search's output for one sentence, without and with an intervention."""

    original: Hypothesis
    new: Hypothesis


def intervene(
    model: Seq2Seq,
    src: Tensor,
    decode: DecodeConfig,
    *,
    kind: str,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] = (),
    original: Hypothesis | None = None,
) -> Intervention:
    """Greedy search on ``src`` as is and under one intervention: ``kind`` in
    ``REPLACEMENTS`` replaces the cross-attention weights of ``layers`` (from 0; None:
    every layer); ``mask`` hides source ``positions`` from every layer's cross-attention.
    Of ``decode`` it reads what greedy search reads (the length rule, ``ban_eos``).
    ``original``: greedy search's output without it, where already decoded.

    Shapes: src (1, S)
    """
    if src.shape[0] != 1:
        raise ValueError(f"intervene takes one sentence, got a batch of {src.shape[0]}")
    n_layers = len(model.decoder_layers)
    layers = list(range(n_layers)) if layers is None else list(layers)
    if any(not 0 <= i < n_layers for i in layers):
        raise ValueError(f"layers {layers}: the decoder has layers 0..{n_layers - 1}")
    if kind in REPLACEMENTS:
        context = replaced(model, layers, kind)
    elif kind == "mask":
        context = hidden_source(model, positions, src.shape[1])
    else:
        raise ValueError(f"unknown intervention '{kind}' (use {', '.join(KINDS)})")
    if original is None:
        original = greedy_search(model, src, decode)[0]
    with context:
        new = greedy_search(model, src, decode)[0]
    return Intervention(original, new)


def changed_tokens(a: Sequence, b: Sequence) -> tuple[list[bool], list[bool]]:
    """Which items of ``a`` and of ``b`` lie outside the matching blocks of the two.

    >>> changed_tokens("a dog runs".split(), "a cat runs fast".split())
    ([False, True, False], [False, True, False, True])
    """
    in_a, in_b = [True] * len(a), [True] * len(b)
    for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks():
        in_a[block.a : block.a + block.size] = [False] * block.size
        in_b[block.b : block.b + block.size] = [False] * block.size
    return in_a, in_b


# --- as the commands take and show them ------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One intervention as ``KIND[:N]`` names it: ``layer`` (from 1; None = every layer)
    for a replacement, ``position`` (a source column, from 1) for ``mask``."""

    text: str = field(compare=False)  # "uniform" and "uniform:all" are one intervention
    kind: str
    layer: int | None = None
    position: int | None = None


def parse_spec(text: str, n_layers: int) -> Spec:
    """``KIND[:LAYER]`` for a replacement (uniform, permuted, kept; LAYER from 1, or "all",
    the default) or ``mask:N`` (source column N, from 1; checked against each sentence by
    ``intervention_records``). Bad input raises ``Seq2SeqError``."""
    kind, _, where = text.partition(":")
    if kind not in KINDS:
        raise Seq2SeqError(f"--intervene {text}: unknown kind '{kind}' (use {', '.join(KINDS)})")
    number = whole_number(where)
    if kind == "mask":
        if number is None or number < 1:
            raise Seq2SeqError(f"--intervene {text}: name the source position to hide: mask:N")
        return Spec(text, kind, position=number)
    if where in ("", "all"):
        return Spec(text, kind)
    if number is None or not 1 <= number <= n_layers:
        raise Seq2SeqError(f"--intervene {text}: the decoder has layers 1..{n_layers} (or 'all')")
    return Spec(text, kind, layer=number)


def intervention_records(
    translator: Translator,
    src: Tensor,
    decode: DecodeConfig,
    specs: Sequence[Spec],
    columns: list[list[int]],
    src_units: list[str],
) -> list[dict]:
    """Each of ``specs`` applied to one sentence, for JSON: both greedy outputs as words,
    each word flagged where the two differ (``changed_tokens``), with their lengths
    (subwords) and stop reasons; the output without any is decoded once. ``columns[n]`` are
    the source positions that column n + 1 of ``src_units`` (subwords or words) stands for.
    Shapes: src (1, S)"""
    for spec in specs:
        if spec.position is not None and spec.position > len(columns):
            n = len(columns)
            raise Seq2SeqError(f"--intervene {spec.text}: the source has {n} positions (1..{n})")
    greedy = decode.with_overrides(beam=1, nbest=1)
    original = greedy_search(translator.model, src, greedy)[0] if specs else None
    records = []
    for spec in specs:
        done = intervene(
            translator.model,
            src,
            greedy,
            kind=spec.kind,
            layers=None if spec.layer is None else [spec.layer - 1],
            positions=columns[spec.position - 1] if spec.position is not None else (),
            original=original,
        )
        records.append(_record(translator, spec, done, src_units))
    return records


def _record(translator: Translator, spec: Spec, done: Intervention, src_units: list[str]) -> dict:
    tok = translator.tokenizer
    original, new = (
        words_of(tok.pieces(h.tokens, "tgt"), tok.special_pieces) for h in (done.original, done.new)
    )
    removed, added = changed_tokens(original, new)
    return {
        "spec": spec.text,
        "kind": spec.kind,
        "layer": spec.layer if spec.position is None else None,  # None: every layer, or mask
        "masked": spec.position,
        "masked_token": None if spec.position is None else src_units[spec.position - 1],
        "decoding": "greedy search",
        "original": one_line(tok.decode(done.original.tokens, "tgt")),
        "original_words": original,
        "removed": removed,
        "original_length": len(done.original.tokens),
        "original_stop_reason": done.original.stop_reason,
        "translation": one_line(tok.decode(done.new.tokens, "tgt")),
        "words": new,
        "changed": added,
        "length": len(done.new.tokens),
        "stop_reason": done.new.stop_reason,
    }
