"""Attention: the function that moves information between positions, the multi-head module
(MHA / GQA / MQA in one), and the cache that incremental decoding keeps. Masks are boolean,
True = may attend (``masks.py``: the shapes, and when a check reads the host).

The output always comes from the fused kernel; weights, when asked for, are computed beside
it. Under bf16 a last-bit difference in one attention output can flip a rounding downstream
and with it a decoded token, so asking for the weights must not change the output at all.

Letters: ``B`` batch, ``Tq`` queries, ``Tk`` keys, ``D`` d_model, ``H`` query heads, ``G``
key/value heads, ``Dh = D / H`` head width; ``K`` beams and ``Bk = B / K`` sentences where a
sentence's beams share one static cache (``Bk = B`` otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.model.masks import check_mask, check_rows

# torch >= 2.5 lets SDPA broadcast G key/value heads over H query heads without a copy.
_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None = None,
    dropout: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention over split heads: ``softmax(Q Kᵀ / √Dh) V``, a key that
    ``allowed`` forbids scoring -inf before the softmax.

    With G < H key/value heads (GQA, MQA), query head ``h`` reads key/value head
    ``h // (H / G)``: consecutive query heads share one. The output is the fused kernel's,
    with or without weights; ``need_weights`` adds the weights (before dropout), so
    ``weights @ V`` is the output up to rounding. Under bf16 on a CPU attention computes in
    fp32 and returns ``out`` in bf16, weights in fp32.

    Shapes:
        q: (B, H, Tq, Dh); k, v: (B, G, Tk, Dh); allowed: broadcastable to (B, 1, Tq, Tk)
        returns out (B, H, Tq, Dh) and weights (B, H, Tq, Tk) or None
    """
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # The CPU's bf16 kernel trains many times slower than its fp32 one (its backward
        # above all), and attention is a small share of the FLOPs: under bf16 autocast it
        # runs in fp32 and only the projections around it in bf16.
        with torch.autocast("cpu", enabled=False):
            out, weights = attend(q.float(), k.float(), v.float(), allowed, dropout, need_weights)
        return out.to(q.dtype), weights
    out = _fused(q, k, v, allowed, dropout)  # softmax(Q Kᵀ / √Dh) V in one kernel
    if not need_weights:
        return out, None
    scores = _scores(q, k)  # Q Kᵀ / √Dh: (B, H, Tq, Tk)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return out, scores.softmax(dim=-1)


def _fused(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, dropout: float) -> Tensor:
    """``F.scaled_dot_product_attention``. Shapes as ``attend``."""
    h, g = q.shape[1], k.shape[1]
    if g != h and not _SDPA_HAS_GQA:
        k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    kwargs = {"enable_gqa": True} if g != h and _SDPA_HAS_GQA else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout, **kwargs)


def _scores(q: Tensor, k: Tensor) -> Tensor:
    """``Q Kᵀ / √Dh`` with each key head read by its H / G query heads, (B, H, Tq, Tk)."""
    b, h, tq, dh = q.shape
    g, tk = k.shape[1], k.shape[2]
    # Group query heads by the key/value head they share: a broadcast, not a copy of K.
    qg = q.view(b, g, h // g, tq, dh)  # (B, G, H/G, Tq, Dh)
    scores = qg @ k.unsqueeze(2).transpose(-2, -1) / math.sqrt(dh)  # (B, G, H/G, Tq, Tk)
    return scores.view(b, h, tq, tk)


def fold_beams(qh: Tensor, beams: int) -> Tensor:
    """Each sentence's ``beams`` consecutive rows as extra query rows of one sentence, so that
    they read its one copy of the cached K/V: (Bk K, H, Tq, Dh) -> (Bk, H, K Tq, Dh)."""
    if beams == 1:
        return qh
    b, h, tq, dh = qh.shape
    qh = qh.view(b // beams, beams, h, tq, dh).transpose(1, 2)  # (Bk, H, K, Tq, Dh)
    return qh.reshape(b // beams, h, beams * tq, dh)


def unfold_beams(x: Tensor | None, beams: int) -> Tensor | None:
    """``fold_beams`` undone on what attention returns, the output or the weights (None
    passes): (Bk, H, K Tq, Dh or Tk) -> (Bk K, H, Tq, Dh or Tk)."""
    if x is None or beams == 1:
        return x
    bk, h, rows, last = x.shape
    x = x.view(bk, h, beams, rows // beams, last).transpose(1, 2)  # (Bk, K, H, Tq, ...)
    return x.reshape(bk * beams, h, rows // beams, last)


# The interventions' hook: (weights (B, H, Tq, Tk), allowed) -> the weights to read V with.
WeightEdit = Callable[[Tensor, "Tensor | None"], Tensor]


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with ``n_heads`` query heads and ``n_kv_heads`` key/value
    heads: MHA where they are equal (the default), MQA with one, GQA with any number that
    divides ``n_heads``. The keys and values are only ``n_kv_heads * Dh`` wide each, so the
    cache is really smaller. Q, K and V come from one packed matrix, ``in_proj`` (rows
    Q | K | V, as ``nn.MultiheadAttention``'s ``in_proj_weight``).

    ``check_rows``: refuse a mask with a query row that allows no key (``masks.py``);
    ``edit_weights``: None, or a ``WeightEdit`` whose weights the output is read with instead.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        check_rows: bool = True,
    ) -> None:
        super().__init__()
        if d_model < 1 or n_heads < 1 or d_model % n_heads:
            raise ValueError("d_model must be divisible by n_heads")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if not 1 <= n_kv_heads <= n_heads or n_heads % n_kv_heads:
            raise ValueError("n_kv_heads must be between 1 and n_heads and divide n_heads")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.d_kv = n_kv_heads * self.d_head  # the width of K, and of V
        self.dropout = dropout
        self._add_projections()
        self.check_rows = check_rows
        self.edit_weights: WeightEdit | None = None

    def _add_projections(self) -> None:
        """A method so that a variant (``LatentAttention``) builds its own in the same
        order: the order decides a seed's initial weights."""
        self.in_proj = nn.Linear(self.d_model, self.d_model + 2 * self.d_kv)  # Q | K | V
        self.out_proj = nn.Linear(self.d_model, self.d_model)

    def packed_rows(self) -> dict[nn.Parameter, list[int]]:
        """The blocks of rows each packed weight stacks (here Q | K | V): a model initialises
        each block as the matrix it stands for."""
        return {self.in_proj.weight: [self.d_model, self.d_kv, self.d_kv]}

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Tensor | None = None,
        need_weights: bool = False,
        cache: AttentionCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Each query's read of the values, weighted by how well it matches each key, merged
        over the heads; with ``need_weights``, the weights too (else None).

        ``allowed`` is a mask (``masks.py``). With a ``cache`` (incremental decoding), K and
        V are kept between calls: a growing cache appends this call's, a static one
        (cross-attention) computes them at its first call and reuses them, and may hold one
        sentence for each ``K = B / Bk`` consecutive query rows (a sentence's beams); its
        mask is then key padding, (Bk, 1, 1, Tk).

        Shapes:
            q: (B, Tq, D); k, v: (B, Tk, D); allowed: (Tq, Tk), (B, 1, Tq, Tk) or (B, 1, 1, Tk)
            returns (B, Tq, D) and, with ``need_weights``, weights (B, H, Tq, Tk)
        """
        self._check_inputs(q, k, v, shared_kv=cache is not None and cache.static)
        b, tq, _ = q.shape
        # 1. Project: Q into H heads, K and V into G heads (from the cache, or into it).
        qh, kh, vh = self.project(q, k, v, cache)  # (B, H, Tq, Dh), (Bk, G, Tk, Dh) x 2
        beams = b // kh.shape[0]  # K: the query rows that share one sentence's cached keys
        self._check_mask(allowed, beams, tq, kh.shape[0], kh.shape[2])
        # 2. Attend: softmax(Q Kᵀ / √Dh) V per head, a sentence's beams as more query rows.
        out, weights = self._attend(fold_beams(qh, beams), kh, vh, allowed, need_weights)
        out, weights = unfold_beams(out, beams), unfold_beams(weights, beams)  # (B, H, Tq, Dh)
        # 3. Merge the heads: each position's side by side, then the output projection.
        out = out.transpose(1, 2)  # (B, Tq, H, Dh): heads back beside each position
        out = out.reshape(b, tq, self.d_model)  # (B, Tq, D)
        return self.out_proj(out), weights if need_weights else None

    def project(
        self, q: Tensor, k: Tensor, v: Tensor, cache: AttentionCache | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values split into heads, reading and updating ``cache``:
        (B, H, Tq, Dh) and twice (Bk, G, Tk, Dh). Self-attention projects its input in one
        matrix multiply; cross-attention its queries with the Q rows of ``in_proj`` and the
        encoder memory with the K | V rows, which a filled static cache skips."""
        w, bias, d = self.in_proj.weight, self.in_proj.bias, self.d_model
        reuse = cache is not None and cache.static and cache.length > 0
        if q is k and k is v and not reuse:  # self-attention: one matrix multiply
            q_part, kv_part = self.in_proj(q).split([d, w.shape[0] - d], dim=-1)
        else:
            q_part = F.linear(q, w[:d], bias[:d])
            kv_part = None if reuse else self._kv_input(k, v)
        kh, vh = self._keys_values(kv_part, cache)
        b, tq = q.shape[:2]
        qh = q_part.view(b, tq, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, Tq, Dh)
        return qh, kh, vh

    def _kv_input(self, k: Tensor, v: Tensor) -> Tensor:
        """The features ``in_proj`` packs after Q (here K | V: (B, Tk, 2 G Dh)) of the keys'
        and values' inputs."""
        w, bias, d = self.in_proj.weight, self.in_proj.bias, self.d_model
        if k is v:  # cross-attention reads one memory
            return F.linear(k, w[d:], bias[d:])
        d_kv = self.d_kv
        key = F.linear(k, w[d : d + d_kv], bias[d : d + d_kv])
        value = F.linear(v, w[d + d_kv :], bias[d + d_kv :])
        return torch.cat([key, value], dim=-1)

    def _keys_values(
        self, kv: Tensor | None, cache: AttentionCache | None
    ) -> tuple[Tensor, Tensor]:
        """K and V from the K | V features, after what ``cache`` holds; ``kv`` None: a static
        cache's, reused."""
        if kv is None:
            return cache.k, cache.v
        kh, vh = self._heads(kv)
        if cache is not None:
            if cache.k is not None:
                kh = torch.cat([cache.k, kh], dim=2)  # (B, G, P + Tk, Dh)
                vh = torch.cat([cache.v, vh], dim=2)
            cache.k, cache.v = kh, vh
        return kh, vh

    def _heads(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """(B, Tk, 2 G Dh) K | V features -> K and V, each (B, G, Tk, Dh)."""
        b = kv.shape[0]
        kv = kv.view(b, -1, 2, self.n_kv_heads, self.d_head).permute(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    def _attend(
        self, qh: Tensor, kh: Tensor, vh: Tensor, allowed: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``attend``; with ``edit_weights`` set, V read with the weights it returns."""
        if self.edit_weights is None:
            dropout = self.dropout if self.training else 0.0
            return attend(qh, kh, vh, allowed, dropout, need_weights)
        _, weights = attend(qh, kh, vh, allowed, need_weights=True)  # (B, H, Tq, Tk)
        weights = self.edit_weights(weights, allowed)
        vh = vh.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)  # (B, H, Tk, Dh)
        return (weights.to(vh.dtype) @ vh), weights

    def _check_mask(self, allowed: Tensor | None, beams: int, tq: int, bk: int, tk: int) -> None:
        """``masks.py``'s checks, then what beams sharing a static cache cannot take."""
        if allowed is not None:
            check_mask(allowed, bk, tq, tk)
            if self.check_rows:
                check_rows(allowed)
        if beams > 1:
            if self.edit_weights is not None:
                raise ValueError("edit_weights takes one source per query row (no shared cache)")
            if allowed is not None and (allowed.ndim != 4 or allowed.shape[2] != 1):
                raise ValueError("A shared key/value cache takes only a key padding mask")

    def _check_inputs(self, q: Tensor, k: Tensor, v: Tensor, shared_kv: bool) -> None:
        if any(x.ndim != 3 for x in (q, k, v)):
            raise ValueError("Expected [batch, sequence, d_model] inputs")
        same = all(x.shape[0] == q.shape[0] for x in (k, v))
        # Beams of one sentence may share a static cache: B is then a multiple of Bk.
        shared = shared_kv and k.shape[0] == v.shape[0] and q.shape[0] % k.shape[0] == 0
        if not (same or shared):
            raise ValueError("Query, key and value batch sizes must match")
        if any(x.shape[-1] != self.d_model for x in (q, k, v)):
            raise ValueError("Input widths must equal d_model")
        if k.shape[1] == 0:
            raise ValueError("At least one key/value is required")
        if k.shape[1] != v.shape[1]:
            raise ValueError("Key and value lengths must match")


@dataclass
class AttentionCache:
    """What one attention module keeps between decoding steps.

    ``static=False`` (decoder self-attention): K/V grow by the new positions at every call.
    ``static=True`` (cross-attention): K/V are computed from the encoder memory at the first
    call and reused unchanged; their batch ``Bk`` may be smaller than the queries' ``B``, in
    which case each block of ``K = B / Bk`` consecutive query rows (the beams of one source
    sentence) reads the same keys, so beams share one copy instead of K copies.
    ``LatentAttention`` keeps the per-token latent instead of K and V (``latent``).
    """

    static: bool = False
    k: Tensor | None = None  # (Bk, G, Tk, Dh)
    v: Tensor | None = None  # (Bk, G, Tk, Dh)
    latent: Tensor | None = None  # (B, Tk, Dl), LatentAttention's

    @property
    def length(self) -> int:
        if self.latent is not None:
            return self.latent.shape[1]
        return 0 if self.k is None else self.k.shape[2]

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.k, self.v, self.latent) if t is not None]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: each new beam's parent row)."""
        if self.static:
            return  # shared by a sentence's beams; the order of beams cannot change it
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        if self.latent is not None:
            self.latent = self.latent.index_select(0, index)


@dataclass
class DecoderCache:
    """Incremental decoding state for a whole decoder: one per decode call.

    Per layer, ``self_attn[i]`` grows one position per step and ``cross_attn[i]`` holds the
    encoder-side K/V computed once. With G key/value heads, each layer's self-attention
    cache at length T holds exactly ``2 * B * T * G * Dh`` elements.
    """

    n_layers: int
    self_attn: list[AttentionCache] = field(init=False)
    cross_attn: list[AttentionCache] = field(init=False)

    def __post_init__(self) -> None:
        self.self_attn = [AttentionCache(static=False) for _ in range(self.n_layers)]
        self.cross_attn = [AttentionCache(static=True) for _ in range(self.n_layers)]

    @property
    def length(self) -> int:
        """Target positions already decoded (the next token's position)."""
        return self.self_attn[0].length

    def reorder(self, index: Tensor) -> None:
        for entry in self.self_attn:
            entry.reorder(index)

    def size(self) -> dict[str, int]:
        """Elements and bytes held, split into self- and cross-attention."""
        report = {}
        for name, entries in (("self", self.self_attn), ("cross", self.cross_attn)):
            tensors = [t for e in entries for t in e.tensors()]
            report[f"{name}_elements"] = sum(t.numel() for t in tensors)
            report[f"{name}_bytes"] = sum(t.numel() * t.element_size() for t in tensors)
        report["elements"] = report["self_elements"] + report["cross_elements"]
        report["bytes"] = report["self_bytes"] + report["cross_bytes"]
        return report
