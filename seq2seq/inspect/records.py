"""The record of a sentence: what decoding did, step by step, and its attention; what
``seq2seq attention`` writes (``seq2seq.explorer.report``), the explorer shows and ``seq2seq
serve`` answers with.

For each sentence, a *record* (a plain dict) holds the cross-attention of the output that
was actually produced: greedy search's, or under beam search the chosen hypothesis'
attention traced through the beam back-pointers (``search.Hypothesis.attention``), or with
a reference the reference teacher-forced (``search.force_decode``). Beside the maps it
holds, per decoding step, the token chosen, its probability, the five most likely tokens
and P(EOS); the step and the reason the loop stopped (``eos`` or ``max_len``) and the
max_len that applied; under beam search every finished hypothesis with its scores.

The per-step distributions come from one teacher-forced pass over the produced output:
the decoder is causal, so step n of that pass sees exactly the prefix the search saw when
it chose token n. They are the model's own distributions (PAD and BOS, which the search
never outputs, at 0); with EOS banned the search chose from them with EOS removed, and
P(EOS) shows what the ban overrode. That pass decodes apart from the search, in one call
rather than step by step, so the two agree up to rounding; ``tests/test_bf16_paths.py``
pins them together under bf16, where rounding is coarsest.

Beside the cross-attention, a record holds the self-attention of the same output, from the
same teacher-forced pass (the decoder is causal, so row n is what step n computed, up to
rounding): the encoder's, source over source, and the decoder's, masked, over its inputs (BOS,
then the output before each step), which ``attention_maps`` returns with its row and column
tokens by kind (``seq2seq.drawing.kinds``).

Beside the maps, a record holds what each source position does to each output token
(influence by occlusion, ``seq2seq.inspect.influence``) and the outputs of any
interventions on cross-attention (``seq2seq.inspect.interventions``).

Rows are target subwords (queries, the EOS step included when the output stopped at EOS),
columns source subwords (keys, EOS included); with ``words`` both are merged into words
(``seq2seq.drawing.words``). Layers and heads are numbered from 1.

Letters: ``L`` decoder layers, ``H`` heads, ``Tq`` target positions, ``Tk`` source
positions, ``V`` target vocabulary, ``Le`` encoder layers.
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from seq2seq.config import DecodeConfig
from seq2seq.decoding.search import (
    Hypothesis,
    beam_search,
    force_decode,
    greedy_search,
    max_output_length,
    step_probs,
)
from seq2seq.decoding.translate import Translator, one_line
from seq2seq.decoding.tree import SearchTree
from seq2seq.drawing import plotting, words
from seq2seq.errors import Seq2SeqError
from seq2seq.inspect.beam_tree import tree_in_words, tree_record
from seq2seq.inspect.influence import agreement, influence_note, occlude, tie_nats
from seq2seq.inspect.interventions import Spec, intervention_records, parse_spec
from seq2seq.model.transformer import Seq2Seq
from seq2seq.vocab import BOS_ID, EOS_ID

TEACHER_FORCED = "teacher-forced on the given reference"
TOP_K = 5  # alternatives shown per decoding step


def sentence_records(
    translator: Translator,
    sentences: list[str],
    references: list[str] | None = None,
    *,
    beam: int | None = None,
    length_penalty: float | None = None,
    max_len: int | None = None,
    ban_eos: bool = False,
    words: bool = False,
    influence: bool = False,
    interventions: Sequence[str] = (),
) -> list[dict]:
    """One record per sentence: what decoding produced, step by step, and its attention.

    Keys: source, reference, translation, decoding, teacher_forced, beam, ban_eos,
    max_len (None when teacher-forced), stop_reason ("eos" | "max_len"), stop_step,
    notes, src_tokens, tgt_tokens, shape [L, H, Tq, Tk], weights (L, H, Tq, Tk) array,
    encoder_weights (Le, H, Tk, Tk) and decoder_weights (L, H, Tq, Tq) arrays (self-attention,
    teacher-forced over the output), decoder_tokens (the decoder's Tq inputs: BOS, then the
    output before each step),
    steps (per step: step, token, prob, top [{token, prob}], p_eos), hypotheses
    ({translation, length, score, normalized_score, stop_reason, chosen}, best first),
    word_level (the merge rule, or None), step_rows and step_weights (see ``_to_words``),
    caption; tree: under beam search the search's tree (``seq2seq.inspect.beam_tree``), else
    None; length_penalty. With ``influence``: influence (Tq, Tk) array, the occlusion map
    (``seq2seq.inspect.influence``; a target word's row sums its subwords', a source word is
    hidden whole), most_attended (of the mean over layers and heads), most_influential, tied
    and agree (None where tied), per row (``seq2seq.inspect.influence.agreement``), and
    influence_note; else all None. interventions: one dict per spec
    (``seq2seq.inspect.interventions.intervention_records``), source positions numbered as the
    record's columns.
    """
    check_sentences(translator, sentences)
    if references is not None:
        if len(references) != len(sentences):
            raise Seq2SeqError(f"{len(references)} references for {len(sentences)} sentences")
        if any(not r.strip() for r in references):
            raise Seq2SeqError(
                "--reference is empty" if len(references) == 1 else "a reference is empty"
            )
    if max_len is not None and max_len < 1:
        raise Seq2SeqError(f"--max-len must be at least 1, got {max_len}")
    specs = [parse_spec(text, translator.model.config.n_dec_layers) for text in interventions]
    decode = _decode_config(translator, beam, max_len, ban_eos, length_penalty)
    refs = references or [None] * len(sentences)
    records = [
        _record(translator, s, r, decode, influence=influence, specs=specs, by_word=words)
        for s, r in zip(sentences, refs, strict=True)
    ]
    specials = translator.tokenizer.special_pieces
    if words:
        records = [_to_words(r, specials) for r in records]
    return [_with_agreement(r) for r in records]


def sentence_interventions(
    translator: Translator,
    sentence: str,
    interventions: Sequence[str],
    *,
    max_len: int | None = None,
    ban_eos: bool = False,
    words: bool = False,
) -> list[dict]:
    """The interventions of one sentence alone, as ``sentence_records`` holds them (what
    ``seq2seq serve``'s interventions panel asks for): no maps, no other decoding."""
    check_sentences(translator, [sentence])
    specs = [parse_spec(text, translator.model.config.n_dec_layers) for text in interventions]
    decode = _decode_config(translator, 1, max_len, ban_eos)
    source = _source(translator, sentence, words)
    with translator.numerics():
        return intervention_records(
            translator, source.src, decode, specs, source.columns, source.units
        )


def check_sentences(translator: Translator, sentences: list[str]) -> None:
    """Refuse (``Seq2SeqError``) no sentences, a blank one, or one the tokenizer reads as no
    subwords at all (only characters it drops, such as U+200B or control characters):
    ``seq2seq translate`` leaves such a line untranslated, and a source of EOS alone has no
    position to hide (influence, ``mask:N``)."""
    if not sentences:
        raise Seq2SeqError("no sentences given")
    encoded = translator.tokenizer.encode_batch(sentences, "src")
    for n, (s, ids) in enumerate(zip(sentences, encoded, strict=True), start=1):
        which = "the sentence" if len(sentences) == 1 else f"sentence {n}"
        if not s.strip():
            raise Seq2SeqError(f"{which} is empty")
        if not ids:
            shown = " ".join(f"U+{ord(c):04X}" for c in dict.fromkeys(s) if not c.isspace())
            raise Seq2SeqError(
                f"{which} has no subwords: the tokenizer drops each of its characters "
                f"({shown[:60]}); nothing to translate"
            )


def _decode_config(
    translator: Translator,
    beam: int | None,
    max_len: int | None,
    ban_eos: bool,
    length_penalty: float | None = None,
) -> DecodeConfig:
    """The run's decoding with the given beam and length penalty (None: the run's), max_len
    (None: the run's ``a * S + b``) and ban_eos."""
    k = beam if beam is not None else translator.config.decode.beam
    overrides = {"max_len_a": 0.0, "max_len_b": max_len} if max_len is not None else {}
    # nbest = beam: every finished hypothesis, which leaves the chosen one as it is
    return translator.config.decode.with_overrides(
        beam=k, nbest=k, ban_eos=ban_eos, length_penalty=length_penalty, **overrides
    )


class _Source(NamedTuple):
    src: torch.Tensor  # (1, S): EOS added, cut to the model's limit
    tokens: list[str]  # S subwords
    columns: list[list[int]]  # the positions each column hides: a subword's, or a word's
    units: list[str]  # what the columns are: subwords, or words
    notes: list[str]  # the cut, if any


def _source(translator: Translator, sentence: str, by_word: bool) -> _Source:
    """The sentence as the model reads it, and its columns."""
    tok = translator.tokenizer
    notes = []
    src_ids = tok.encode(sentence, "src")
    if len(src_ids) > translator.max_src_len:
        notes.append(
            f"{len(src_ids)} source subwords, cut to the model's limit of {translator.max_src_len}"
        )
        src_ids = src_ids[: translator.max_src_len]
    src = torch.tensor([src_ids + [EOS_ID]], device=translator.device)  # (1, S)
    src_tokens = tok.pieces(src_ids + [EOS_ID], "src")
    if not by_word:
        return _Source(src, src_tokens, [[i] for i in range(len(src_tokens))], src_tokens, notes)
    columns = words.word_positions(src_tokens, tok.special_pieces)
    return _Source(src, src_tokens, columns, words.words_of(src_tokens, tok.special_pieces), notes)


def _decode(
    translator: Translator, src: torch.Tensor, reference: str | None, decode: DecodeConfig
) -> tuple[list[Hypothesis], SearchTree | None]:
    """The sentence's hypotheses, best first: greedy search's, beam search's with its tree,
    or the reference teacher-forced."""
    model = translator.model
    if reference is None and decode.beam > 1:
        tree = SearchTree()
        return beam_search(model, src, decode, need_weights=True, tree=tree)[0], tree
    if reference is None:
        return greedy_search(model, src, decode, need_weights=True), None
    ref_ids = translator.tokenizer.encode(reference, "tgt")
    if len(ref_ids) + 1 > model.config.max_positions:
        raise Seq2SeqError(
            f"the reference has {len(ref_ids)} subwords; the model takes at most "
            f"{model.config.max_positions - 1}"
        )
    return force_decode(model, src, [ref_ids]), None


def _record(
    translator: Translator,
    sentence: str,
    reference: str | None,
    decode: DecodeConfig,
    *,
    influence: bool,
    specs: list[Spec],
    by_word: bool,
) -> dict:
    """The record of one sentence at subword level, but ``by_word`` the occlusion and the
    interventions hide whole source words already (``_to_words`` merges the rest)."""
    tok, model = translator.tokenizer, translator.model
    src, src_tokens, columns, src_units, notes = _source(translator, sentence, by_word)
    with translator.numerics():
        hyps, tree = _decode(translator, src, reference, decode)
        chosen = hyps[0]
        tgt_ids = chosen.tokens + [EOS_ID] if chosen.stop_reason == "eos" else chosen.tokens
        probs = step_probs(model, src, tgt_ids)  # (Tq, V)
        encoder_weights, decoder_weights = _self_attention(model, src, tgt_ids)
        occlusion = occlude(model, src, tgt_ids, columns) if influence else None
        tie = tie_nats(translator.dtype, translator.device)  # of the precision in force
        changes = intervention_records(translator, src, decode, specs, columns, src_units)

    weights = chosen.attention.float().numpy()  # (L, H, Tq, Tk)
    max_positions = model.config.max_positions
    max_len = max_output_length(src.shape[1], decode.max_len_a, decode.max_len_b, max_positions)
    return {
        "source": sentence,
        "reference": reference,
        "translation": one_line(tok.decode(chosen.tokens, "tgt")),
        "decoding": _decoding(decode, teacher_forced=reference is not None),
        "teacher_forced": reference is not None,
        "beam": decode.beam,
        "length_penalty": decode.length_penalty,
        "ban_eos": decode.ban_eos and reference is None,
        "max_len": None if reference is not None else max_len,
        "stop_reason": chosen.stop_reason,
        "stop_step": len(tgt_ids),
        "notes": notes,
        "src_tokens": src_tokens,
        "tgt_tokens": tok.pieces(tgt_ids, "tgt"),
        "shape": list(weights.shape),
        "weights": weights,
        "encoder_weights": encoder_weights,
        "decoder_weights": decoder_weights,
        "decoder_tokens": tok.pieces([BOS_ID, *tgt_ids[:-1]], "tgt"),
        "steps": _steps(tok, probs, tgt_ids),
        "hypotheses": [_hypothesis(tok, h, i == 0) for i, h in enumerate(hyps)],
        "word_level": None,
        "step_rows": None,
        "step_weights": None,
        "caption": plotting.CAPTION,
        "influence": None if occlusion is None else occlusion.influence.cpu().numpy(),
        "influence_note": None
        if occlusion is None
        else influence_note(
            "this output" if reference is None else "the given reference",
            tie,
        ),
        "most_attended": None,
        "most_influential": None,
        "tied": None,
        "agree": None,
        "tie_nats": None if occlusion is None else tie,
        "interventions": changes,
        "tree": None if tree is None else tree_record(tok, tree.trees[0], hyps),
    }


def _decoding(decode: DecodeConfig, teacher_forced: bool) -> str:
    """How the record's output was found, in words."""
    if teacher_forced:
        return TEACHER_FORCED
    if decode.beam == 1:
        return "greedy search"
    return (
        f"beam search (beam {decode.beam}, length penalty {decode.length_penalty:g}), "
        "the chosen hypothesis"
    )


def _self_attention(
    model: Seq2Seq, src: torch.Tensor, tgt_ids: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The encoder's self-attention (Le, H, Tk, Tk) and the decoder's (L, H, Tq, Tq), one
    teacher-forced pass over the output, as ``step_probs``."""
    inputs = torch.tensor([[BOS_ID, *tgt_ids[:-1]]], device=src.device)  # (1, Tq)
    with torch.inference_mode():
        encoder, decoder = model.self_attention(src, inputs)
    return tuple(torch.cat(w).float().cpu().numpy() for w in (encoder, decoder))  # (L, ...)


def _steps(tok, probs: torch.Tensor, tgt_ids: list[int]) -> list[dict]:
    top_p, top_ids = probs.topk(min(TOP_K, probs.shape[-1]), dim=-1)  # (Tq, K)
    steps = []
    for n, token_id in enumerate(tgt_ids):
        top = zip(tok.pieces(top_ids[n].tolist(), "tgt"), top_p[n].tolist(), strict=True)
        steps.append(
            {
                "step": n + 1,
                "token": tok.pieces([token_id], "tgt")[0],
                "prob": round(float(probs[n, token_id]), 6),
                "top": [{"token": t, "prob": round(p, 6)} for t, p in top],
                "p_eos": round(float(probs[n, EOS_ID]), 6),
            }
        )
    return steps


def _hypothesis(tok, hyp: Hypothesis, chosen: bool) -> dict:
    return {
        "translation": one_line(tok.decode(hyp.tokens, "tgt")),
        "length": len(hyp.tokens),
        "score": round(hyp.score, 6),
        "normalized_score": round(hyp.normalized_score, 6),
        "stop_reason": hyp.stop_reason,
        "chosen": chosen,
    }


def _to_words(record: dict, specials: frozenset[str]) -> dict:
    """The record with word-level maps (``seq2seq.drawing.words``). Decoding steps stay subwords:
    ``step_rows[n]`` is the word row step n belongs to, ``step_weights`` (L, H, Tq, Wk) the
    rows each step used with the source merged into words."""
    src, tgt, w = record["src_tokens"], record["tgt_tokens"], record["weights"]
    inputs = record["decoder_tokens"]
    influence = record["influence"]
    merged = words.merge_words(w, src, tgt, specials)  # (L, H, Wq, Wk)
    return {
        **record,
        "src_tokens": words.words_of(src, specials),
        "tgt_tokens": words.words_of(tgt, specials),
        "encoder_weights": words.merge_words(record["encoder_weights"], src, src, specials),
        "decoder_weights": words.merge_words(record["decoder_weights"], inputs, inputs, specials),
        "decoder_tokens": words.words_of(inputs, specials),
        "shape": list(merged.shape),
        "weights": merged,
        "word_level": words.WORDS_NOTE,
        "step_rows": words.word_index(tgt, specials),
        "step_weights": words.merge_source(w, src, specials),
        "tree": tree_in_words(record["tree"], src, specials),
        # Its source columns are words already: hidden whole (``_record``).
        "influence": None if influence is None else words.sum_target(influence, tgt, specials),
    }


def _with_agreement(record: dict) -> dict:
    """The record with, per row, its most-attended source column (of the mean over layers
    and heads) and its most influential one, and whether they agree (``agreement``)."""
    if record["influence"] is None:
        return record
    mean = record["weights"].mean(axis=(0, 1))  # (Tq, Tk)
    return {**record, **agreement(mean, record["influence"], record["tie_nats"])}


def json_record(record: dict) -> dict:
    """The record with its arrays as nested lists, rounded to 6 digits."""
    out = dict(record)
    for key in ("weights", "encoder_weights", "decoder_weights", "step_weights", "influence"):
        if out[key] is not None:
            out[key] = np.round(out[key], 6).tolist()
    return out
