"""Word alignments: which source word each target word is linked to, from cross-attention or
from influence by occlusion, written as Pharaoh links and scored against a gold alignment.

A link ``i-j`` joins source word ``i`` and target word ``j``, both from 0, as fast_align and
fairseq's ``--print-alignment`` write them. Words are those of the word views
(``seq2seq.drawing.words``): the words SentencePiece reads between spaces, which for ordinary
text are the line's space-separated words. EOS, the source's last column and the target's last
row when the output stopped there, is no word of the sentence and is left out before a link is
chosen.

The rule: each target word is linked to the one source word that scores highest in its row
(a tie goes to the first), so every target word has one link and a source word any number:

- attention: the most attended source word, in the word-level map (a source word's weight the
  sum over its subwords, a target word's row the mean of its subwords' rows); the mean over
  every decoder layer and head by default, or over the heads of one layer (fairseq's rule), or
  one head of one layer;
- influence: the most influential source word, the largest drop of the target word's
  log-probability (summed over its subwords) when the source word is hidden whole from
  cross-attention (``seq2seq.inspect.influence``).

Neither is the model's reason for a word: attention shows where the queries read, occlusion one
measure of what they depended on. Scores (Och & Ney 2003), with ``A`` the links predicted,
``S`` the gold's sure links and ``P`` its possible ones (``S`` among them), each count summed
over the corpus before dividing: precision ``|A∩P| / |A|``, recall ``|A∩S| / |S|``, alignment
error rate (AER) ``1 - (|A∩S| + |A∩P|) / (|A| + |S|)``.

Letters: ``L`` decoder layers, ``H`` heads, ``Wq`` target words, ``Wk`` source words.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from seq2seq.decoding.translate import Translator
from seq2seq.errors import Seq2SeqError
from seq2seq.inspect.records import sentence_records

Link = tuple[int, int]  # (source word, target word), from 0
_GOLD_LINK = re.compile(r"(\d+)([-p])(\d+)")


@dataclass(frozen=True)
class WordMaps:
    """One sentence's maps between its words, EOS left out.

    Shapes: attention (L, H, Wq, Wk); influence (Wq, Wk), or None where not computed
    """

    src_words: list[str]
    tgt_words: list[str]
    attention: np.ndarray
    influence: np.ndarray | None
    translation: str  # what the target words are: the reference, or the model's output
    notes: list[str]  # where the words may not be the line's space-separated ones


@dataclass(frozen=True)
class Gold:
    """A sentence's gold links: ``sure`` (``i-j``) and ``possible`` (``ipj``, the sure included)."""

    sure: frozenset[Link]
    possible: frozenset[Link]


@dataclass(frozen=True)
class Scores:
    """Alignment scores over a corpus; None where the count divided by is 0."""

    aer: float | None
    precision: float | None
    recall: float | None
    links: int  # |A|
    sure: int  # |S|
    possible: int  # |P|, the sure links included


def word_maps(
    translator: Translator,
    sources: Sequence[str],
    references: Sequence[str] | None = None,
    *,
    influence: bool = False,
    beam: int | None = None,
) -> list[WordMaps]:
    """Each source sentence's word-level maps, teacher-forced on its reference, or without
    ``references`` on the model's own output (``beam``: None = the run's ``decode.beam``);
    the influence map too where ``influence``."""
    if references is not None and len(references) != len(sources):
        raise Seq2SeqError(
            f"{_lines(len(sources), 'source ')} but {_lines(len(references), 'reference ')}"
        )
    records = sentence_records(
        translator,
        list(sources),
        None if references is None else list(references),
        beam=beam,
        words=True,
        influence=influence,
    )
    return [record_maps(r) for r in records]


def record_maps(record: dict) -> WordMaps:
    """A word-level record's maps (``sentence_records(..., words=True)``) without the EOS
    column, and without the EOS row where the output stopped at EOS."""
    rows = len(record["tgt_tokens"]) - (record["stop_reason"] == "eos")
    cols = len(record["src_tokens"]) - 1
    influence = record["influence"]
    target = record["reference"] if record["teacher_forced"] else record["translation"]
    src_words, tgt_words = record["src_tokens"][:cols], record["tgt_tokens"][:rows]
    notes = list(record["notes"])
    for side, words, line in (
        ("source", src_words, record["source"]),
        ("target", tgt_words, target),
    ):
        if len(words) != len(line.split()):
            notes.append(
                f"the {side} has {len(line.split())} space-separated words, the tokenizer "
                f"reads {len(words)}: links number the tokenizer's"
            )
    return WordMaps(
        src_words=src_words,
        tgt_words=tgt_words,
        attention=record["weights"][:, :, :rows, :cols],
        influence=None if influence is None else influence[:rows, :cols],
        translation=target,
        notes=notes,
    )


def check_map_choice(layer: int | None, head: int | None, n_layers: int, n_heads: int) -> None:
    """Refuse a layer or head the model does not have, and a head without its layer (a head
    belongs to one layer: the same number in another is another head). Numbered from 1."""
    if layer is not None and not 1 <= layer <= n_layers:
        raise Seq2SeqError(f"--layer {layer}: the model has decoder layers 1 to {n_layers}")
    if head is not None:
        if layer is None:
            raise Seq2SeqError(f"--head {head} picks a head of one layer: give --layer too")
        if not 1 <= head <= n_heads:
            raise Seq2SeqError(f"--head {head}: each layer has heads 1 to {n_heads}")


def attention_map(attention: np.ndarray, layer: int | None, head: int | None) -> np.ndarray:
    """The map ``layer`` and ``head`` (from 1; None: the mean) choose.

    Shapes:
        attention: (L, H, Wq, Wk) -> (Wq, Wk)
    """
    layers = attention if layer is None else attention[layer - 1 : layer]  # (L', H, Wq, Wk)
    heads = layers if head is None else layers[:, head - 1 : head]  # (L', H', Wq, Wk)
    return heads.mean(axis=(0, 1))


def best_links(scores: np.ndarray) -> frozenset[Link]:
    """Each target word (row) linked to its highest-scoring source word (column), a tie to
    the first. Shapes: scores (Wq, Wk) -> Wq links (none where there is no source word)"""
    if scores.shape[-1] == 0:
        return frozenset()
    return frozenset((int(i), j) for j, i in enumerate(np.asarray(scores).argmax(-1)))


def links_of(
    maps: WordMaps, source: str = "attention", layer: int | None = None, head: int | None = None
) -> frozenset[Link]:
    """One sentence's links from ``source`` ("attention": the map ``layer`` and ``head``
    choose; "influence")."""
    if source == "influence":
        if maps.influence is None:
            raise ValueError("these maps hold no influence: word_maps(..., influence=True)")
        return best_links(maps.influence)
    return best_links(attention_map(maps.attention, layer, head))


def format_pharaoh(links: Collection[Link]) -> str:
    """``"i-j i-j ..."``, by source word, then target word."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def parse_gold(lines: Sequence[str], n_sentences: int) -> list[Gold]:
    """Gold alignments, one line a sentence: links ``i-j`` (sure) and ``ipj`` (possible), words
    from 0; an empty line has none. Bad input raises ``Seq2SeqError``, naming the line."""
    if len(lines) != n_sentences:
        raise Seq2SeqError(f"the gold file has {_lines(len(lines))} for {n_sentences} sentences")
    return [_gold_line(line, n) for n, line in enumerate(lines, start=1)]


def _gold_line(line: str, number: int) -> Gold:
    sure, possible = set(), set()
    for text in line.split():
        found = _GOLD_LINK.fullmatch(text)
        if found is None:
            raise Seq2SeqError(
                f"gold line {number}: {text!r} is not a link i-j (sure) or ipj (possible)"
            )
        link = (int(found[1]), int(found[3]))
        possible.add(link)
        if found[2] == "-":
            sure.add(link)
    return Gold(frozenset(sure), frozenset(possible))


def check_gold(gold: Sequence[Gold], sizes: Sequence[tuple[int, int]]) -> None:
    """Refuse a gold link past its sentence; ``sizes``: each sentence's (source, target) word
    counts, as ``word_maps`` reads them."""
    for number, (g, size) in enumerate(zip(gold, sizes, strict=True), start=1):
        for link in sorted(g.possible):
            for index, count, side in zip(link, size, ("source", "target"), strict=True):
                if index >= count:
                    words = f"words 0 to {count - 1}" if count else "no words"
                    raise Seq2SeqError(
                        f"gold line {number}: the link {link[0]}-{link[1]} names {side} word "
                        f"{index}, but the {side} has {words}"
                    )


def score(predicted: Sequence[Collection[Link]], gold: Sequence[Gold]) -> Scores:
    """Precision, recall and AER of ``predicted`` against ``gold``, sentence by sentence,
    counts summed over the corpus (Och & Ney 2003)."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted alignments for {len(gold)} gold ones")
    a = s = p = a_s = a_p = 0
    for links, g in zip(predicted, gold, strict=True):
        links = set(links)
        a, s, p = a + len(links), s + len(g.sure), p + len(g.possible)
        a_s, a_p = a_s + len(links & g.sure), a_p + len(links & g.possible)
    return Scores(
        aer=1 - (a_s + a_p) / (a + s) if a + s else None,
        precision=a_p / a if a else None,
        recall=a_s / s if s else None,
        links=a,
        sure=s,
        possible=p,
    )


def format_scores(scores: Scores) -> str:
    """One line: AER, precision and recall, and the counts they come from."""

    def shown(value: float | None) -> str:
        return "undefined" if value is None else f"{value:.3f}"

    return (
        f"AER {shown(scores.aer)}, precision {shown(scores.precision)}, recall "
        f"{shown(scores.recall)} ({scores.links} links; gold {scores.sure} sure, "
        f"{scores.possible} possible)"
    )


def _lines(n: int, kind: str = "") -> str:
    """``"1 line"``, ``"2 source lines"``."""
    return f"{n} {kind}line" + ("" if n == 1 else "s")
