"""Weights saved by earlier versions of the model, under the names the model has now."""

from __future__ import annotations

import torch
from torch import Tensor


def packed_state(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` (a model's state) with weights saved before Q, K and V were packed
    (``q_proj``, ``k_proj``, ``v_proj``, and for MLA ``kv_down``) stacked into ``in_proj``
    and ``kv_up``: the same numbers under the names ``MultiHeadAttention`` has now. Other
    names pass through."""
    out = dict(tensors)
    for name in [n for n in tensors if n.split(".")[-2:] == ["q_proj", "weight"]]:
        prefix = name.removesuffix("q_proj.weight")
        mla = f"{prefix}kv_down.weight" in tensors
        rows = ("q_proj", "kv_down") if mla else ("q_proj", "k_proj", "v_proj")
        for kind in ("weight", "bias"):
            out[f"{prefix}in_proj.{kind}"] = torch.cat(
                [out.pop(f"{prefix}{r}.{kind}") for r in rows]
            )
            if mla:
                up = [out.pop(f"{prefix}{r}.{kind}") for r in ("k_proj", "v_proj")]
                out[f"{prefix}kv_up.{kind}"] = torch.cat(up)
    return out
