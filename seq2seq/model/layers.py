"""Embeddings, sinusoidal positions, feed-forward, and the pre-norm encoder/decoder layers.

The layers' attention trusts the rows of its masks (``check_rows=False``; ``masks.py`` says why).

Letters: ``B`` batch, ``S`` source length, ``T`` target length, ``D`` d_model, ``V`` vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seq2seq.config import ModelConfig
from seq2seq.model.attention import AttentionCache, MultiHeadAttention
from seq2seq.model.dropout import Dropout
from seq2seq.model.latent_attention import LatentAttention


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


def _attention(config: ModelConfig, d_latent: int | None = None) -> MultiHeadAttention:
    """A layer's attention: ``LatentAttention`` with ``d_latent`` set, else ``MultiHeadAttention``."""
    c = config
    sizes = (c.d_model, c.n_heads, c.n_kv_heads, c.attn_dropout)
    if d_latent is None:
        return MultiHeadAttention(*sizes, check_rows=False)
    return LatentAttention(*sizes, check_rows=False, d_latent=d_latent)


class EncoderLayer(nn.Module):
    """Pre-norm: ``x + SelfAttn(LN(x))``, then ``x + FFN(LN(x))``.

    The encoder's self-attention never uses the MLA latent (``d_latent``): nothing is cached
    on the source side, so a K/V bottleneck there would only cost quality.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.self_attn_norm = nn.LayerNorm(c.d_model)
        self.self_attn = _attention(c)
        self.ffn_norm = nn.LayerNorm(c.d_model)
        self.ffn = FeedForward(c.d_model, c.d_ff, c.activation_dropout)
        self.dropout = Dropout(c.dropout)

    def forward(
        self, x: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        h = self.self_attn_norm(x)
        read, weights = self.self_attn(h, h, h, src_mask, need_weights=need_weights)
        x = x + self.dropout(read)
        x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        return x, weights  # (B, S, D), (B, H, S, S) or None


class DecoderLayer(nn.Module):
    """Pre-norm: causal self-attention, cross-attention (Q from the target, K/V from the
    encoder memory), feed-forward. Returns the new states, the cross-attention weights
    (``None`` unless ``need_weights``) and the self-attention weights (``None`` unless
    ``need_self_weights``). With ``d_latent`` set, the self-attention alone is
    ``LatentAttention`` (MLA): it is the only attention whose K/V grow in the cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.self_attn_norm = nn.LayerNorm(c.d_model)
        self.self_attn = _attention(c, d_latent=c.d_latent)
        self.cross_attn_norm = nn.LayerNorm(c.d_model)
        self.cross_attn = _attention(c)
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
        need_self_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        h = self.self_attn_norm(x)
        own, self_weights = self.self_attn(
            h, h, h, tgt_mask, need_weights=need_self_weights, cache=self_cache
        )
        x = x + self.dropout(own)
        h = self.cross_attn_norm(x)
        read, weights = self.cross_attn(
            h, memory, memory, src_mask, need_weights=need_weights, cache=cross_cache
        )
        x = x + self.dropout(read)
        x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        return x, weights, self_weights  # (B, T, D), (B, H, T, S) or None, (B, H, T, T) or None
