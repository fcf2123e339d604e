"""Cross-attention maps read per word instead of per subword.

A word is what SentencePiece writes between spaces: a token starting with ``"▁"`` starts
a new word, a token without it continues the word before it (so ``"▁Wiese" "."`` is the
word ``"Wiese."``). The specials the tokenizer names (``Tokenizer.special_pieces``: control
and unknown pieces such as ``"</s>"``) are words of their own; byte-fallback pieces
(``"<0xF0>"``) continue their word like any other piece without the marker.

The merge keeps each row a distribution: a source word's weight is the **sum** over its
subwords (the mass a query put on the word), a target word's row is the **mean** of its
subwords' rows (each of them sums to 1, so their mean does too).

Letters: ``L`` layers, ``H`` heads, ``Tq`` target subwords, ``Tk`` source subwords,
``Wq`` target words, ``Wk`` source words. No model imports.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

WORD_START = "\u2581"  # SentencePiece's "▁"
WORDS_NOTE = (
    "Word level: a source word's weight is the sum over its subwords; a target word's row "
    "is the mean of its subwords' rows, so every row still sums to 1."
)


def word_index(tokens: Sequence[str], specials: Collection[str]) -> list[int]:
    """The word each token belongs to, numbered from 0 in order.

    >>> word_index(["▁Ein", "▁Hund", "e", ".", "</s>"], {"</s>"})
    [0, 1, 1, 1, 2]
    """
    index, word = [], -1
    for i, token in enumerate(tokens):
        after_special = i > 0 and tokens[i - 1] in specials
        if i == 0 or token.startswith(WORD_START) or token in specials or after_special:
            word += 1
        index.append(word)
    return index


def words_of(tokens: Sequence[str], specials: Collection[str]) -> list[str]:
    """The words themselves, without the word-start marker (a lone ``"▁"`` stays)."""
    index = word_index(tokens, specials)
    words = [""] * (index[-1] + 1 if index else 0)
    for token, w in zip(tokens, index, strict=True):
        words[w] += token
    return [w.replace(WORD_START, "") or WORD_START for w in words]


def word_positions(tokens: Sequence[str], specials: Collection[str]) -> list[list[int]]:
    """The positions of each word's tokens, word by word.

    >>> word_positions(["▁Ein", "▁Hund", "e", "</s>"], {"</s>"})
    [[0], [1, 2], [3]]
    """
    positions: list[list[int]] = []
    for i, word in enumerate(word_index(tokens, specials)):
        if word == len(positions):
            positions.append([])
        positions[word].append(i)
    return positions


def _membership(tokens: Sequence[str], specials: Collection[str]) -> np.ndarray:
    """(tokens, words) matrix: 1 where a token belongs to a word."""
    index = word_index(tokens, specials)
    m = np.zeros((len(tokens), (index[-1] + 1) if index else 0))
    m[np.arange(len(tokens)), index] = 1.0
    return m


def merge_source(
    weights: np.ndarray, src_tokens: Sequence[str], specials: Collection[str]
) -> np.ndarray:
    """Sum each source word's columns.

    Shapes:
        weights: (..., Tk) -> (..., Wk)
    """
    return np.asarray(weights, dtype=np.float64) @ _membership(src_tokens, specials)


def sum_target(
    values: np.ndarray, tgt_tokens: Sequence[str], specials: Collection[str]
) -> np.ndarray:
    """Sum each target word's rows: a word's log-probability is the sum of its subwords',
    and so is a change in it.

    Shapes:
        values: (..., Tq, X) -> (..., Wq, X)
    """
    return _membership(tgt_tokens, specials).T @ np.asarray(values, dtype=np.float64)


def merge_words(
    weights: np.ndarray,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    specials: Collection[str],
) -> np.ndarray:
    """Word-level maps: source columns summed per word, target rows averaged per word.

    Shapes:
        weights: (L, H, Tq, Tk) -> (L, H, Wq, Wk)
    """
    tgt = _membership(tgt_tokens, specials)  # (Tq, Wq)
    mean_rows = (tgt / tgt.sum(axis=0, keepdims=True)).T  # (Wq, Tq), each row averages a word
    return mean_rows @ merge_source(weights, src_tokens, specials)  # (L, H, Wq, Wk)
