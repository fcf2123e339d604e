"""Word-level maps: subwords merged by hand on made-up maps."""

import numpy as np
import pytest

from seq2seq.drawing.words import (
    merge_source,
    merge_words,
    sum_target,
    word_index,
    word_positions,
    words_of,
)

SPECIALS = frozenset({"<pad>", "<unk>", "<s>", "</s>"})  # as Tokenizer.special_pieces
SRC = ["▁Ein", "▁Hund", "e", ".", "</s>"]  # words: Ein | Hunde. | </s>
TGT = ["▁Do", "g", "s", "▁run", "</s>"]  # words: Dogs | run | </s>


@pytest.mark.parametrize(
    ("tokens", "index", "words"),
    [
        (SRC, [0, 1, 1, 1, 2], ["Ein", "Hunde.", "</s>"]),
        (TGT, [0, 0, 0, 1, 2], ["Dogs", "run", "</s>"]),
        (["ab", "▁c", "</s>", "d"], [0, 1, 2, 3], ["ab", "c", "</s>", "d"]),
        (["▁", "▁x"], [0, 1], ["▁", "x"]),  # a lone marker stays visible
        ([], [], []),
        # byte-fallback pieces spell a character of their word; <unk> stands alone
        (["▁Ein", "▁", "<0xF0>", "<0x9F>", "▁x", "<unk>", "y"], [0, 1, 1, 1, 2, 3, 4], None),
    ],
)
def test_words_start_at_the_marker_and_specials_stand_alone(tokens, index, words):
    assert word_index(tokens, SPECIALS) == index
    if words is not None:
        assert words_of(tokens, SPECIALS) == words


def test_merge_by_hand():
    w = np.array(
        [
            [0.1, 0.2, 0.3, 0.2, 0.2],  # ▁Do
            [0.0, 0.5, 0.5, 0.0, 0.0],  # g
            [0.3, 0.0, 0.0, 0.1, 0.6],  # s
            [1.0, 0.0, 0.0, 0.0, 0.0],  # ▁run
            [0.0, 0.0, 0.0, 0.0, 1.0],  # </s>
        ]
    )[None, None]  # (L=1, H=1, Tq=5, Tk=5)
    merged = merge_words(w, SRC, TGT, SPECIALS)
    # Source: Ein = col 0; Hunde. = cols 1-3 summed; </s> = col 4.
    # Target: Dogs = mean of rows 0-2; run = row 3; </s> = row 4.
    dogs = np.mean([[0.1, 0.7, 0.2], [0.0, 1.0, 0.0], [0.3, 0.1, 0.6]], axis=0)
    expected = np.array([dogs, [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(merged[0, 0], expected)
    np.testing.assert_allclose(merged.sum(-1), 1.0)


def test_word_positions_and_summed_target_rows_by_hand():
    assert word_positions(SRC, SPECIALS) == [[0], [1, 2, 3], [4]]
    assert word_positions([], SPECIALS) == []
    drops = np.arange(10.0).reshape(5, 2)  # (Tq=5, X=2): e.g. log-prob drops per source word
    # Dogs = rows 0-2 summed (a word's log-prob is its subwords' sum); run = row 3; </s> = 4.
    expected = [[0 + 2 + 4, 1 + 3 + 5], [6, 7], [8, 9]]
    np.testing.assert_allclose(sum_target(drops, TGT, SPECIALS), expected)


def test_random_maps_keep_rows_summing_to_one_and_every_shape():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, len(TGT), len(SRC)))
    w = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    merged = merge_words(w, SRC, TGT, SPECIALS)
    assert merged.shape == (2, 3, 3, 3)  # (L, H, Wq, Wk)
    np.testing.assert_allclose(merged.sum(-1), 1.0)
    source_only = merge_source(w, SRC, SPECIALS)
    assert source_only.shape == (2, 3, len(TGT), 3)  # (L, H, Tq, Wk)
    np.testing.assert_allclose(source_only[..., 1], w[..., 1:4].sum(-1))
