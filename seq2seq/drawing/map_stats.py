"""The plain numbers of an attention map, beside every drawing of it (``plotting``), on the
explorer's page and in ``seq2seq attention``'s table: each row's entropy in bits, its mass on
EOS and on punctuation. Numbers, no interpretation, and no matplotlib.

Shapes: ``weights`` (Tq, Tk), Tq target positions (queries), Tk source positions (keys).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

from seq2seq.drawing.words import WORD_START

EOS = "</s>"


def is_punctuation(token: str) -> bool:
    """True when the token, without SentencePiece's word-start marker, is all punctuation."""
    text = token.replace(WORD_START, "")
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def attention_stats(weights: np.ndarray, src_tokens: Sequence[str]) -> dict:
    """Per-row entropy (bits) and the mass on EOS and on punctuation source columns.

    Plain numbers, no interpretation. EOS columns are those whose token is ``"</s>"``;
    punctuation columns are those for which ``is_punctuation`` holds.

    Shapes:
        weights: (Tq, Tk); src_tokens: Tk tokens.
        row_entropy, eos_mass, punct_mass: Tq floats each.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != len(src_tokens):
        raise ValueError(f"weights must be (Tq, Tk={len(src_tokens)}), got {w.shape}")
    logs = np.log2(np.where(w > 0, w, 1.0))
    entropy = -(w * logs).sum(axis=1) + 0.0  # + 0.0 turns -0.0 into 0.0
    eos_cols = [j for j, t in enumerate(src_tokens) if t == EOS]
    punct_cols = [j for j, t in enumerate(src_tokens) if is_punctuation(t)]
    eos_mass = w[:, eos_cols].sum(axis=1)
    punct_mass = w[:, punct_cols].sum(axis=1)
    return {
        "entropy_unit": "bits",
        "row_entropy": entropy.tolist(),
        "eos_mass": eos_mass.tolist(),
        "punct_mass": punct_mass.tolist(),
        "mean_entropy": float(entropy.mean()) if len(entropy) else 0.0,
        "mean_eos_mass": float(eos_mass.mean()) if len(eos_mass) else 0.0,
        "mean_punct_mass": float(punct_mass.mean()) if len(punct_mass) else 0.0,
    }


def stats_line(stats: dict) -> str:
    return (
        f"mean entropy {stats['mean_entropy']:.2f} {stats['entropy_unit']} \u00b7 "
        f"mass on EOS {stats['mean_eos_mass']:.2f}, punct {stats['mean_punct_mass']:.2f}"
    )
