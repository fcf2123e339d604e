"""``seq2seq attention`` and the explorer: translate sentences and record what decoding did.

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

Beside the maps, ``seq2seq attention`` records what each source position does to each
output token (influence by occlusion, ``seq2seq.inspect.influence``) and the outputs of any
interventions on cross-attention (``seq2seq.inspect.interventions``), both for JSON and the table.

Rows are target subwords (queries, the EOS step included when the output stopped at EOS),
columns source subwords (keys, EOS included); with ``words`` both are merged into words
(``seq2seq.drawing.words``). Layers and heads are numbered from 1.

Letters: ``L`` decoder layers, ``H`` heads, ``Tq`` target positions, ``Tk`` source
positions, ``V`` target vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from seq2seq.config import DecodeConfig
from seq2seq.decoding.search import Hypothesis, force_decode, max_output_length, translate_batch
from seq2seq.decoding.translate import Translator, one_line, read_lines
from seq2seq.drawing import plotting, words
from seq2seq.errors import Seq2SeqError
from seq2seq.fileio import atomic_write_text
from seq2seq.inspect import explorer
from seq2seq.inspect.influence import agreement, influence_note, occlude, tie_nats
from seq2seq.inspect.interventions import Spec, intervention_records, parse_spec
from seq2seq.model.transformer import padding_mask
from seq2seq.run.precision import autocast
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID

FORMATS = ("png", "svg", "html", "json")
TEACHER_FORCED = "teacher-forced on the given reference"
TOP_K = 5  # alternatives shown per decoding step
MAX_PAGE_SENTENCES = 200  # an HTML page holds every map: ~100 kB per sentence
# Every HTML page holds these interventions, precomputed, in each decoder layer and in all
# at once: 2 (L + 1) greedy decodings per sentence, small beside its maps. Masking a word
# (S decodings) is left to --intervene mask:N and to seq2seq serve.
PAGE_INTERVENTIONS = ("uniform", "permuted")
_TITLE_MAX_CHARS = 60  # per quoted sentence in a figure title


def attention_report(
    run: str | Path | Translator,
    sentences: str | list[str],
    *,
    references: str | list[str] | None = None,
    layer: int | str = "all",
    head: int | str = "mean",
    beam: int | None = None,
    max_len: int | None = None,
    ban_eos: bool = False,
    words: bool = False,
    influence: bool = True,
    interventions: Sequence[str] = (),
    with_page_interventions: bool = True,
    fmt: str | None = None,
    out: str | Path | None = None,
    device: str = "auto",
) -> dict:
    """Translate ``sentences`` (or teacher-force ``references``) and write their attention.

    ``layer`` is a layer number (from 1) or "all"; ``head`` a head number (from 1),
    "mean" or "all" (every head plus the mean, as a grid); both choose what PNG and SVG
    draw, while HTML and JSON hold every layer and head. ``beam``: None = the run's
    ``decode.beam``, 1 = greedy. ``max_len`` replaces the run's ``a * S + b`` rule;
    ``ban_eos`` makes every output run to max_len. The format comes from ``fmt``, else
    ``out``'s suffix, else PNG; ``out`` defaults to ``attention.<format>`` here. PNG and
    SVG take one sentence; HTML writes one page with a sentence picker, JSON one record
    per line. ``influence``: each record holds the occlusion map beside the attention
    (``seq2seq.inspect.influence``); ``interventions``: specs such as "uniform:2" or "mask:3"
    (``seq2seq.inspect.interventions.parse_spec``), each decoded again per sentence; an HTML page
    holds ``page_interventions`` besides, unless not ``with_page_interventions``. Bad input raises ``Seq2SeqError`` with a one-line
    message, before any file is written.

    Returns a dict: path, format, title, records (see ``sentence_records``) and
    interventions (the specs asked for).
    """
    fmt, path = _output(fmt, out)
    sentences = [sentences] if isinstance(sentences, str) else list(sentences)
    if isinstance(references, str):
        references = [references]
    if fmt in ("png", "svg") and len(sentences) != 1:
        raise Seq2SeqError(f"{fmt.upper()} draws one sentence; write several to .html or .json")
    if fmt == "html" and len(sentences) > MAX_PAGE_SENTENCES:
        raise Seq2SeqError(
            f"{len(sentences)} sentences: a page holds at most {MAX_PAGE_SENTENCES} (every map "
            "of every sentence is in it); split the file, or write .json"
        )
    translator = run if isinstance(run, Translator) else Translator.from_run(run, device)
    model_config = translator.model.config
    layers, heads = _selection(layer, head, (model_config.n_dec_layers, model_config.n_heads))
    asked = list(interventions)
    if fmt == "html" and with_page_interventions:
        given = {parse_spec(text, model_config.n_dec_layers) for text in asked}
        page = page_interventions(model_config.n_dec_layers)
        interventions = [*asked, *(spec.text for spec in page if spec not in given)]
    records = sentence_records(
        translator,
        sentences,
        references,
        beam=beam,
        max_len=max_len,
        ban_eos=ban_eos,
        words=words,
        influence=influence,
        interventions=interventions,
    )
    title = page_title(records)
    if fmt in ("png", "svg"):
        r = records[0]
        plotting.plot_attention(
            r["weights"],
            r["src_tokens"],
            r["tgt_tokens"],
            path,
            layers=layers,
            heads=heads,
            title=title,
            fmt=fmt,
            note=r["word_level"] or "",
        )
    elif fmt == "html":
        explorer.write_report(records, path, title=title)
    else:
        lines = [json.dumps(json_record(r), ensure_ascii=False) + "\n" for r in records]
        atomic_write_text(path, "".join(lines))
    return {"path": path, "format": fmt, "title": title, "records": records, "interventions": asked}


def page_interventions(n_layers: int) -> list[Spec]:
    """What every HTML page holds: each of ``PAGE_INTERVENTIONS`` in each decoder layer, then
    in all of them at once."""
    layers = [*(str(n) for n in range(1, n_layers + 1)), "all"]
    return [parse_spec(f"{kind}:{n}", n_layers) for kind in PAGE_INTERVENTIONS for n in layers]


def sentence_records(
    translator: Translator,
    sentences: list[str],
    references: list[str] | None = None,
    *,
    beam: int | None = None,
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
    steps (per step: step, token, prob, top [{token, prob}], p_eos), hypotheses
    ({translation, length, score, normalized_score, stop_reason, chosen}, best first),
    word_level (the merge rule, or None), step_rows and step_weights (see ``_to_words``),
    caption. With ``influence``: influence (Tq, Tk) array, the occlusion map
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
    decode = _decode_config(translator, beam, max_len, ban_eos)
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
    with autocast(translator.device, translator.dtype):
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
    translator: Translator, beam: int | None, max_len: int | None, ban_eos: bool
) -> DecodeConfig:
    """The run's decoding with the given beam (None: the run's), max_len (None: the run's
    ``a * S + b``) and ban_eos."""
    k = beam if beam is not None else translator.config.decode.beam
    overrides = {"max_len_a": 0.0, "max_len_b": max_len} if max_len is not None else {}
    # nbest = beam: every finished hypothesis, which leaves the chosen one as it is
    return translator.config.decode.with_overrides(beam=k, nbest=k, ban_eos=ban_eos, **overrides)


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
    with autocast(translator.device, translator.dtype):
        if reference is None:
            hyps = translate_batch(model, src, decode, need_weights=True)[0]
        else:
            ref_ids = tok.encode(reference, "tgt")
            if len(ref_ids) + 1 > model.config.max_positions:
                raise Seq2SeqError(
                    f"the reference has {len(ref_ids)} subwords; the model takes at most "
                    f"{model.config.max_positions - 1}"
                )
            hyps = force_decode(model, src, [ref_ids])
        chosen = hyps[0]
        tgt_ids = chosen.tokens + [EOS_ID] if chosen.stop_reason == "eos" else chosen.tokens
        probs = _step_probs(model, src, tgt_ids)  # (Tq, V)
        occlusion = occlude(model, src, tgt_ids, columns) if influence else None
        changes = intervention_records(translator, src, decode, specs, columns, src_units)

    weights = chosen.attention.float().numpy()  # (L, H, Tq, Tk)
    max_positions = model.config.max_positions
    max_len = max_output_length(src.shape[1], decode.max_len_a, decode.max_len_b, max_positions)
    if reference is None:
        decoding = (
            "greedy search"
            if decode.beam == 1
            else f"beam search (beam {decode.beam}), the chosen hypothesis"
        )
    else:
        decoding = TEACHER_FORCED
    return {
        "source": sentence,
        "reference": reference,
        "translation": one_line(tok.decode(chosen.tokens, "tgt")),
        "decoding": decoding,
        "teacher_forced": reference is not None,
        "beam": decode.beam,
        "ban_eos": decode.ban_eos and reference is None,
        "max_len": None if reference is not None else max_len,
        "stop_reason": chosen.stop_reason,
        "stop_step": len(tgt_ids),
        "notes": notes,
        "src_tokens": src_tokens,
        "tgt_tokens": tok.pieces(tgt_ids, "tgt"),
        "shape": list(weights.shape),
        "weights": weights,
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
            tie_nats(translator.dtype),
        ),
        "most_attended": None,
        "most_influential": None,
        "tied": None,
        "agree": None,
        "tie_nats": None if occlusion is None else tie_nats(translator.dtype),
        "interventions": changes,
    }


def _step_probs(model, src: torch.Tensor, tgt_ids: list[int]) -> torch.Tensor:
    """The next-token distribution at every step of the given output, teacher-forced.

    Shapes:
        src: (1, S); tgt_ids: Tq ids -> (Tq, V)
    """
    with torch.inference_mode():
        src_mask = padding_mask(src)
        memory = model.encode(src, src_mask)
        inputs = torch.tensor([[BOS_ID, *tgt_ids[:-1]]], device=src.device)  # (1, Tq)
        logits, _ = model.decode(inputs, memory, src_mask)
        probs = logits[0].float().softmax(-1).cpu()  # (Tq, V)
        probs[:, [PAD_ID, BOS_ID]] = 0.0  # never output: the search sets them to -inf too
        return probs


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
    influence = record["influence"]
    merged = words.merge_words(w, src, tgt, specials)  # (L, H, Wq, Wk)
    return {
        **record,
        "src_tokens": words.words_of(src, specials),
        "tgt_tokens": words.words_of(tgt, specials),
        "shape": list(merged.shape),
        "weights": merged,
        "word_level": words.WORDS_NOTE,
        "step_rows": words.word_index(tgt, specials),
        "step_weights": words.merge_source(w, src, specials),
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
    for key in ("weights", "step_weights", "influence"):
        if out[key] is not None:
            out[key] = np.round(out[key], 6).tolist()
    return out


def read_sentences(path: Path, what: str = "-i") -> list[str]:
    """The lines of a UTF-8 file (invalid bytes become U+FFFD with a warning)."""
    try:
        with open(path, "rb") as f:
            lines = list(read_lines(f))
    except OSError as e:
        raise Seq2SeqError(f"{what} {path}: {e.strerror or e}") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            raise Seq2SeqError(f"{what} {path}: line {n} is empty")
    if not lines:
        raise Seq2SeqError(f"{what} {path}: the file is empty")
    return lines


def report_inputs(
    sentence: str | None,
    input_path: Path | None,
    reference: str | None,
    reference_file: Path | None,
) -> tuple[str | list[str], str | list[str] | None]:
    """``seq2seq attention``'s sentences and references: one SENTENCE (with --reference),
    or the lines of -i FILE (with --reference-file)."""
    if (sentence is None) == (input_path is None):
        raise Seq2SeqError("give one SENTENCE or -i FILE")
    if input_path is None:
        if reference_file is not None:
            raise Seq2SeqError("--reference-file goes with -i FILE; with SENTENCE use --reference")
        return sentence, reference
    if reference is not None:
        raise Seq2SeqError("--reference goes with SENTENCE; with -i FILE use --reference-file")
    references = (
        None if reference_file is None else read_sentences(reference_file, "--reference-file")
    )
    return read_sentences(input_path), references


def format_summary(report: dict, layer: int | str = "all", head: int | str = "mean") -> str:
    """What ``seq2seq attention`` prints: per sentence its translation, how decoding
    stopped and the output of each intervention asked for (not those every page holds);
    for one sentence the per-row numbers of the chosen maps; the file written."""
    records, lines = report["records"], []
    asked = set(report["interventions"])
    for n, r in enumerate(records, start=1):
        where = f"[{n}] " if len(records) > 1 else ""
        limit = f" (max_len {r['max_len']})" if r["max_len"] is not None else ""
        lines.append(f"{where}translation: {r['translation']}")
        lines.append(
            f"{where}decoding: {r['decoding']}; stop reason: {r['stop_reason']} at step "
            f"{r['stop_step']}{limit}"
        )
        for c in (c for c in r["interventions"] if c["spec"] in asked):
            pairs = zip(c["words"], c["changed"], strict=True)
            marked = " ".join(f"[{w}]" if changed else w for w, changed in pairs)
            lines.append(f"{where}intervention {c['spec']} (greedy): {marked}")
            lines.append(
                f"{where}  length {c['length']}, stop reason {c['stop_reason']}; without it "
                f"{c['original_length']}, {c['original_stop_reason']}; "
                f"{sum(c['changed'])} of {len(c['words'])} words changed ([marked]), "
                f"{sum(c['removed'])} of {len(c['original_words'])} of the original's changed "
                "or removed"
            )
    if len(records) == 1:
        lines.append(format_table(records[0], selected_maps(records[0], layer, head)))
    lines.append(f"wrote {report['path']}")
    return "\n".join(lines)


def selected_maps(record: dict, layer: int | str = "all", head: int | str = "mean") -> list[dict]:
    """Layer, head and per-row numbers of each map ``layer`` and ``head`` select, with each
    row's most-attended source column."""
    layers, heads = _selection(layer, head, record["shape"][:2])
    maps = []
    for row in plotting.select_maps(record["weights"], layers, heads):
        for layer_number, head_label, attn in row:
            stats = plotting.attention_stats(attn, record["src_tokens"])
            attended = np.asarray(attn).argmax(-1).tolist()
            maps.append({"layer": layer_number, "head": head_label, **stats, "attended": attended})
    return maps


def format_table(record: dict, maps: list[dict]) -> str:
    """The per-row numbers of every map: entropy (bits), EOS and punctuation mass, one
    block per map, one line per target position. With the record's influence, also the
    source token the map's row attends to most, the one whose occlusion lowers the row's
    token most (tied ones joined by "=", ``_tied_tokens``; ``influence.tie_nats``), and whether
    they are the same position ("tie" where tied; the mean line: how often, of the rows
    that are not)."""
    tokens, src = record["tgt_tokens"], record["src_tokens"]
    tied = record.get("tied")
    influential = [] if tied is None else [_tied_tokens(src, t) for t in tied]
    width = max(6, *(len(t) for t in tokens))
    src_width = max((len(t) for t in src), default=0)
    a_width = max(len("attended"), src_width)
    i_width = max(len("influential"), src_width, *(len(t) for t in influential))
    lines = []
    for m in maps:
        lines.append(f"layer {m['layer']}, head {m['head']}")
        header = f"  {'#':>3}  {'target':<{width}}  {'bits':>5}  {'EOS':>5}  {'punct':>5}"
        if tied is not None:
            header += f"  {'attended':<{a_width}}  {'influential':<{i_width}}  same"
        lines.append(header)
        rows = zip(m["row_entropy"], m["eos_mass"], m["punct_mass"], strict=True)
        same = [] if tied is None else _same(m["attended"], tied)
        for i, (entropy, eos, punct) in enumerate(rows):
            line = f"  {i:>3}  {tokens[i]:<{width}}  {entropy:5.2f}  {eos:5.2f}  {punct:5.2f}"
            if tied is not None:
                a = src[m["attended"][i]]
                line += f"  {a:<{a_width}}  {influential[i]:<{i_width}}  {same[i]}"
            lines.append(line)
        mean = (m["mean_entropy"], m["mean_eos_mass"], m["mean_punct_mass"])
        line = f"  {'':>3}  {'mean':<{width}}  {mean[0]:5.2f}  {mean[1]:5.2f}  {mean[2]:5.2f}"
        if tied is not None:
            decisive = len(same) - same.count("tie")
            line += f"  {'':<{a_width}}  {'':<{i_width}}  {same.count('yes')}/{decisive}"
        lines.append(line)
    if tied is not None:
        lines.append(
            f"same: of the {decisive} rows whose most influential token leads the next by "
            f"{record['tie_nats']} nats or more (rounding in the map's precision moves a drop "
            "by less); "
            f"{same.count('tie')} rows are ties"
        )
    return "\n".join(lines)


def _tied_tokens(src: list[str], tied: list[int]) -> str:
    """A row's most influential token, or those tied with it: "a=b=c", or "a 5-way tie"."""
    return "=".join(src[j] for j in tied) if len(tied) <= 3 else f"a {len(tied)}-way tie"


def _same(attended: list[int], tied: list[list[int]]) -> list[str]:
    """Per row, "yes" or "no": the attended column is the most influential one; "tie" where
    several are (``seq2seq.inspect.influence.agreement``)."""
    return [
        "tie" if len(t) > 1 else "yes" if a == t[0] else "no"
        for a, t in zip(attended, tied, strict=True)
    ]


def page_title(records: list[dict]) -> str:
    r = records[0]
    if len(records) > 1:
        return f"Cross-attention of {len(records)} sentences ({r['decoding']})"
    return f"{_quote(r['source'])} \u2192 {_quote(r['translation'])} ({r['decoding']})"


def _output(fmt: str | None, out: str | Path | None) -> tuple[str, Path]:
    """The format (from ``fmt``, else the suffix of ``out``, else png) and the path."""
    if fmt is None:
        suffix = Path(out).suffix.lstrip(".").lower() if out is not None else ""
        fmt = suffix or "png"
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise Seq2SeqError(
            f"unknown format '{fmt}' (use {', '.join(FORMATS)}; from --format or -o's suffix)"
        )
    return fmt, Path(out) if out is not None else Path(f"attention.{fmt}")


def _selection(
    layer: int | str, head: int | str, shape: tuple[int, int]
) -> tuple[list[int] | None, int | str]:
    """``plot_attention``'s ``layers`` and ``heads`` for the user's ``layer`` and ``head``."""
    n_layers, n_heads = shape
    if layer != "all" and not (isinstance(layer, int) and 1 <= layer <= n_layers):
        raise Seq2SeqError(f"--layer {layer}: the decoder has layers 1..{n_layers} (or 'all')")
    if head not in ("mean", "all") and not (isinstance(head, int) and 1 <= head <= n_heads):
        raise Seq2SeqError(f"--head {head}: the decoder has heads 1..{n_heads} (or 'mean', 'all')")
    return (None if layer == "all" else [layer]), head


def _quote(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _TITLE_MAX_CHARS:
        text = text[: _TITLE_MAX_CHARS - 1] + "\u2026"
    return f"\u201c{text}\u201d"
