"""Embeddings, sinusoidal positions, feed-forward, and the pre-norm encoder/decoder layers.

The layers' attention trusts the rows of its masks (``check_rows=False``): ``Seq2Seq.encode``
checks the source padding mask once per batch, and a causal mask always allows a query's own
position, so no attention call reads a mask on the host.

Letters: ``B`` batch, ``S`` source length, ``T`` target length, ``D`` d_model, ``V`` vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.config import ModelConfig
from seq2seq.model.attention import AttentionCache, MultiHeadAttention


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """The fixed position encodings of Vaswani et al. (2017), (n_positions, D)."""
    position = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)
    rate = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(n_positions, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: d_model // 2])
    return table


class Dropout(nn.Module):
    """Dropout whose probability the trainer's schedule moves (``drop.p = 0.2``), built for two
    costs. Eager CPU training draws 16 random bits per element (four to each int64 that
    ``random_`` fills), where ``F.dropout``'s ``bernoulli_`` draws a double, and keeps only the
    boolean mask for backward (1 byte an element; ``F.dropout`` on CPU keeps an ``x.dtype``
    noise tensor). Same law: each element kept with probability 1 - p (to 1/65536) and scaled
    by 1/(1 - p) computed in float32, also under bf16 autocast; masks from torch's default
    generator, so a seed and ``--resume`` reproduce them. On other devices it is
    ``F.dropout``. Under ``torch.compile`` the probability and the scale are read from tensors
    inside the graph, so a schedule that moves them every step compiles once, not once per
    value."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.register_buffer("rate", torch.tensor(float(p)), persistent=False)
        self.register_buffer("scale", torch.tensor(1.0), persistent=False)
        self.p = p

    @property
    def p(self) -> float:
        return self._p

    @p.setter
    def p(self, value: float) -> None:
        self._p = float(value)  # what eager code reads: no device sync for it
        self.active = value > 0.0  # what a compiled graph guards on: one bool, not the value
        self.rate.fill_(value)
        self.scale.fill_(1.0 / (1.0 - value))  # float32 of the eager path's Python float

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or not self.active:
            return x
        if torch.compiler.is_compiling():
            # Scaled in float32, then cast, as on the eager path: on a GPU a 0-dim tensor in
            # bf16 arithmetic is rounded to bf16 first (1 - 0.1 became 0.8984375).
            keep = torch.rand_like(x, dtype=torch.float32) >= self.rate
            return (x.float() * keep * self.scale).to(x.dtype)
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        return _MaskAndScale.apply(x, keep_mask(x.shape, self.p), self.p)

    def extra_repr(self) -> str:
        return f"p={self.p:g}"


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """True with probability 1 - p (to 1/65536), from 16 random bits per element. CPU."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    threshold = round(p * 65536) - 32768  # an int16 at or above it: probability 1 - p
    return (words.view(torch.int16)[:n] >= threshold).view(shape)


class _MaskAndScale(torch.autograd.Function):
    """``x * keep * (1 / (1 - p))``; the gradient is masked and scaled the same way. Only the
    boolean ``keep`` is saved; the scale is a Python float, which CPU kernels multiply in
    float32 even for a bf16 ``x`` (a bf16 scale tensor would be 1.109375 at p = 0.1)."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, p: float) -> Tensor:
        ctx.scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(keep)
        return (x * keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None


class Embedding(nn.Module):
    """Token embedding scaled by √D, plus sinusoidal positions, then dropout.

    Shapes:
        tokens: (B, T) -> (B, T, D); position of tokens[:, i] is ``start + i``
    """

    def __init__(self, tokens: nn.Embedding, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.tokens = tokens  # may be shared with the other side and the output layer
        self.scale = math.sqrt(tokens.embedding_dim)
        self.register_buffer(
            "positions", sinusoidal_table(max_positions, tokens.embedding_dim), persistent=False
        )
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, start: int = 0) -> Tensor:
        end = start + tokens.shape[1]
        if end > self.positions.shape[0]:
            raise ValueError(
                f"Sequence of {end} positions exceeds max_positions={self.positions.shape[0]}"
            )
        return self.dropout(self.tokens(tokens) * self.scale + self.positions[start:end])


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.dropout(torch.relu(self.up(x))))


class EncoderLayer(nn.Module):
    """Pre-norm: ``x + SelfAttn(LN(x))``, then ``x + FFN(LN(x))``.

    The encoder's self-attention never uses the MLA latent (``d_latent``): nothing is cached
    on the source side, so a K/V bottleneck there would only cost quality.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.self_attn_norm = nn.LayerNorm(c.d_model)
        self.self_attn = MultiHeadAttention(
            c.d_model, c.n_heads, c.n_kv_heads, dropout=c.attn_dropout, check_rows=False
        )
        self.ffn_norm = nn.LayerNorm(c.d_model)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout)
        self.dropout = Dropout(c.dropout)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        h = self.self_attn_norm(x)
        x = x + self.dropout(self.self_attn(h, h, h, src_mask)[0])
        x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        return x  # (B, S, D)


class DecoderLayer(nn.Module):
    """Pre-norm: causal self-attention, cross-attention (Q from the target, K/V from the
    encoder memory), feed-forward. Returns the new states and the cross-attention weights
    (``None`` unless asked for). With ``d_latent`` set, the self-attention alone is MLA:
    it is the only attention whose K/V grow in the cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.self_attn_norm = nn.LayerNorm(c.d_model)
        self.self_attn = MultiHeadAttention(
            c.d_model,
            c.n_heads,
            c.n_kv_heads,
            dropout=c.attn_dropout,
            d_latent=c.d_latent,
            check_rows=False,
        )
        self.cross_attn_norm = nn.LayerNorm(c.d_model)
        self.cross_attn = MultiHeadAttention(
            c.d_model, c.n_heads, c.n_kv_heads, dropout=c.attn_dropout, check_rows=False
        )
        self.ffn_norm = nn.LayerNorm(c.d_model)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout)
        self.dropout = Dropout(c.dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None,
        src_mask: Tensor,
        self_cache: AttentionCache | None = None,
        cross_cache: AttentionCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        h = self.self_attn_norm(x)
        x = x + self.dropout(self.self_attn(h, h, h, tgt_mask, cache=self_cache)[0])
        h = self.cross_attn_norm(x)
        read, weights = self.cross_attn(
            h, memory, memory, src_mask, need_weights=need_weights, cache=cross_cache
        )
        x = x + self.dropout(read)
        x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        return x, weights  # (B, T, D), (B, H, T, S) or None
