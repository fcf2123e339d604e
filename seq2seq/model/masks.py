"""Attention masks: the one convention the model, decoding and the instruments share.

A mask is boolean with **True = may attend**: ``allowed[..., i, j]`` lets query ``i`` read key
``j``. It is shaped ``[Tq, Tk]``, the same for every sentence (the causal mask), or
``[B, 1, Tq, Tk]``, one per sentence and broadcast over the heads; key padding is
``[B, 1, 1, Tk]``, the same for every query. A query row with no allowed key is refused: its
softmax would be over nothing, a row of NaN.

When a check reads the host: ``check_mask`` reads only a mask's shape and dtype, so it costs
nothing; ``check_rows`` reads its values, a device sync. So the rows are read where a mask comes
from a user, once: ``MultiHeadAttention`` on its own checks every mask it is given, while the
model's layers build theirs with ``check_rows=False``, because ``Seq2Seq.encode`` checks the
source padding mask once per batch and a causal mask always allows a query's own position; no
decoding step then waits for the device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seq2seq.vocab import PAD_ID


def padding_mask(src: Tensor) -> Tensor:
    """True where a source position is a real token: (B, S) -> (B, 1, 1, S)."""
    return (src != PAD_ID)[:, None, None, :]


def causal_mask(n_new: int, n_total: int, device: torch.device) -> Tensor:
    """Position ``n_total - n_new + i`` may read positions ``<=`` itself: (n_new, n_total)."""
    offset = n_total - n_new
    rows = torch.arange(n_new, device=device)[:, None] + offset
    return rows >= torch.arange(n_total, device=device)[None, :]


def check_rows(allowed: Tensor) -> None:
    """Raise ``ValueError`` if a query row of ``allowed`` has no allowed key (one host sync)."""
    if not allowed.any(dim=-1).all():
        raise ValueError("Each query must have at least one allowed key (a sentence all padding?)")


def check_mask(allowed: Tensor, batch: int, tq: int, tk: int) -> None:
    """Raise ``ValueError`` unless ``allowed`` is a boolean mask of a shape that fits these
    sizes (its shape and dtype only: no device sync)."""
    if allowed.dtype != torch.bool:
        raise ValueError("Use a boolean mask: True = allowed")
    shape = tuple(allowed.shape)
    ok = (allowed.ndim == 2 and shape == (tq, tk)) or (
        allowed.ndim == 4
        and shape[0] in (1, batch)
        and shape[1] == 1
        and shape[2] in (1, tq)
        and shape[3] == tk
    )
    if not ok:
        raise ValueError(
            f"Mask shape {list(shape)} does not fit: expected [Tq, Tk]=[{tq}, {tk}], "
            f"[B, 1, Tq, Tk]=[{batch}, 1, {tq}, {tk}] or [B, 1, 1, Tk]=[{batch}, 1, 1, {tk}]"
        )
