"""Which attention a view shows, by kind, named as Hugging Face's outputs name them
(``cross_attentions``, ``encoder_attentions``, ``decoder_attentions``; fairseq's
``encoder_attn`` is the cross): "cross", the decoder's queries reading the source; "encoder",
the source reading itself; "decoder", the decoder's inputs (BOS, then the output before each
step) reading themselves under the causal mask. A record (``seq2seq.inspect.records``) holds
all three; every view (the table, the figures, the explorer, the notebook) takes one through
``attention_maps``. No model imports.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from seq2seq.drawing.plotting import CROSS_AXES
from seq2seq.errors import Seq2SeqError

# Which attention a view shows: its record key, its rows' and columns' tokens, its name.
KINDS = {
    "cross": ("weights", "tgt_tokens", "src_tokens", "cross-attention"),
    "encoder": ("encoder_weights", "src_tokens", "src_tokens", "encoder self-attention"),
    "decoder": (
        "decoder_weights", "decoder_tokens", "decoder_tokens", "decoder self-attention (masked)",
    ),
}  # fmt: skip
# The axes a drawing names, rows then columns.
AXES = {
    "cross": CROSS_AXES,
    "encoder": ("source (queries)", "source (keys)"),
    "decoder": ("decoder input (queries)", "decoder input (keys)"),
}


class Maps(NamedTuple):
    """One kind of attention of a record, as every view draws it."""

    weights: np.ndarray  # (L, H, Tq, Tk)
    rows: list[str]  # Tq query tokens
    columns: list[str]  # Tk key tokens
    name: str  # e.g. "decoder self-attention (masked)"
    causal: bool  # a query never reads a later key (the decoder's mask)
    axes: tuple[str, str]  # what the rows and the columns are


def check_kind(kind: str) -> None:
    """Refuse (``Seq2SeqError``) a kind of attention ``KINDS`` does not name."""
    if kind not in KINDS:
        raise Seq2SeqError(f"--kind {kind}: choose one of {', '.join(KINDS)}")


def attention_maps(record: dict, kind: str = "cross") -> Maps:
    """The record's attention of ``kind`` ("cross", "encoder" or "decoder", ``KINDS``)."""
    check_kind(kind)
    key, rows, columns, name = KINDS[kind]
    weights = np.asarray(record[key])
    return Maps(weights, record[rows], record[columns], name, kind == "decoder", AXES[kind])
