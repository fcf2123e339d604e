"""Latent attention (MLA, after DeepSeek-V2, simplified for absolute positions): multi-head
self-attention that caches one small vector per token instead of its keys and values.

Each token is compressed to a ``d_latent`` vector, the latent; only it is cached, and K and V
are up-projected from it (``kv_up``) at every step. Everything else (the heads, the masks,
``attend``, the output) is ``MultiHeadAttention``'s.

Letters as in attention.py, and ``Dl`` the latent width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.model.attention import AttentionCache, MultiHeadAttention


class LatentAttention(MultiHeadAttention):
    """``MultiHeadAttention`` whose keys and values come from a ``d_latent`` latent per token.

    ``in_proj`` packs Q | latent, ``kv_up`` K | V from the latent. Keys and values come from
    one input, so it is for self-attention: ``k`` must be ``v``.

    Shapes: as ``MultiHeadAttention``; a cache keeps the latent, (B, Tk, Dl)
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        check_rows: bool = True,
        *,
        d_latent: int,
    ) -> None:
        self.d_latent = d_latent  # before the base's __init__, which builds the projections
        super().__init__(d_model, n_heads, n_kv_heads, dropout, check_rows)

    def _add_projections(self) -> None:
        self.in_proj = nn.Linear(self.d_model, self.d_model + self.d_latent)  # Q | latent
        self.kv_up = nn.Linear(self.d_latent, 2 * self.d_kv)  # K | V from the latent
        self.out_proj = nn.Linear(self.d_model, self.d_model)

    def packed_rows(self) -> dict[nn.Parameter, list[int]]:
        return {
            self.in_proj.weight: [self.d_model, self.d_latent],
            self.kv_up.weight: [self.d_kv, self.d_kv],
        }

    def _keys_values(
        self, latent: Tensor | None, cache: AttentionCache | None
    ) -> tuple[Tensor, Tensor]:
        """K and V up-projected from the latent, which alone the cache keeps."""
        if cache is not None:
            if latent is None:
                latent = cache.latent
            elif cache.latent is not None:
                latent = torch.cat([cache.latent, latent], dim=1)  # (B, P + Tk, Dl)
            cache.latent = latent
        return self._heads(self.kv_up(latent))

    def _check_inputs(self, q: Tensor, k: Tensor, v: Tensor, shared_kv: bool) -> None:
        super()._check_inputs(q, k, v, shared_kv)
        if k is not v:
            raise ValueError(
                "MLA (d_latent) compresses keys and values from one input: pass the same "
                "tensor as k and v (self-attention)"
            )
