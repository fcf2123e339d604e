"""``seq2seq attention``: translate one sentence and draw the decoder's cross-attention.

The maps are those of the output that was actually produced: greedy search's, or under
beam search the chosen hypothesis' attention traced through the beam back-pointers
(``search.Hypothesis.attention``). With a reference, the reference is teacher-forced
instead (``search.force_decode``) and everything says "teacher-forced on the given
reference".

Rows are target subwords (queries, the EOS step included when the output stopped at EOS),
columns source subwords (keys, EOS included). Layers and heads are numbered from 1, as in
``seq2seq.plotting``. The figure formats (PNG, SVG) draw the maps chosen by ``layer`` and
``head``; HTML and JSON always hold every layer and head.

Letters: ``L`` decoder layers, ``H`` heads, ``Tq`` target positions, ``Tk`` source
positions.
"""

from __future__ import annotations

from pathlib import Path

from seq2seq import plotting
from seq2seq.data import collate
from seq2seq.errors import Seq2SeqError
from seq2seq.precision import autocast
from seq2seq.search import force_decode, translate_batch
from seq2seq.translate import Translator, one_line, warn
from seq2seq.vocab import EOS_ID

FORMATS = ("png", "svg", "html", "json")
TEACHER_FORCED = "teacher-forced on the given reference"
_TITLE_MAX_CHARS = 60  # per quoted sentence in a figure title


def attention_report(
    run: str | Path | Translator,
    sentence: str,
    layer: int | str = "all",
    head: int | str = "mean",
    beam: int | None = None,
    fmt: str | None = None,
    out: str | Path | None = None,
    reference: str | None = None,
    device: str = "auto",
) -> dict:
    """Translate ``sentence`` (or teacher-force ``reference``) and write its attention.

    ``layer`` is a layer number (from 1) or "all"; ``head`` a head number (from 1),
    "mean" or "all" (every head plus the mean, as a grid). ``beam``: None = the run's
    ``decode.beam``, 1 = greedy; ignored with ``reference``. The format comes from ``fmt``,
    else ``out``'s suffix, else PNG; ``out`` defaults to ``attention.<format>`` in the
    current directory. Bad input raises ``Seq2SeqError`` with a one-line message.

    Returns a dict: path, format, source, translation, stop_reason, decoding,
    teacher_forced, src_tokens, tgt_tokens, shape [L, H, Tq, Tk], and maps: for each map
    drawn, its layer, head, row_entropy (bits), eos_mass and punct_mass (Tq floats each).
    """
    fmt, path = _output(fmt, out)
    if not sentence.strip():
        raise Seq2SeqError("the sentence is empty")
    if reference is not None and not reference.strip():
        raise Seq2SeqError("--reference is empty")
    translator = run if isinstance(run, Translator) else Translator.from_run(run, device)
    tok = translator.tokenizer

    src_ids = tok.encode(sentence, "src")
    if len(src_ids) > translator.max_src_len:
        warn(
            f"{len(src_ids)} source subwords, cut to the model's limit of {translator.max_src_len}"
        )
        src_ids = src_ids[: translator.max_src_len]
    src = collate([src_ids], None).src.to(translator.device)  # (1, S), EOS appended
    if reference is None:
        search = translator.search_config(beam=beam, nbest=1, need_weights=True)
        with autocast(translator.device, translator.dtype):
            hyp = translate_batch(translator.model, src, search)[0][0]
        decoding = (
            "greedy search"
            if search.beam == 1
            else f"beam search (beam {search.beam}), the chosen hypothesis"
        )
    else:
        ref_ids = tok.encode(reference, "tgt")
        if len(ref_ids) + 1 > translator.model.config.max_positions:
            raise Seq2SeqError(
                f"--reference has {len(ref_ids)} subwords; the model takes at most "
                f"{translator.model.config.max_positions - 1}"
            )
        with autocast(translator.device, translator.dtype):
            hyp = force_decode(translator.model, src, [ref_ids])[0]
        decoding = TEACHER_FORCED

    weights = hyp.attention.float().numpy()  # (L, H, Tq, Tk)
    src_tokens = tok.pieces(src_ids + [EOS_ID], "src")
    tgt_ids = hyp.tokens + [EOS_ID] if hyp.stop_reason == "eos" else hyp.tokens
    tgt_tokens = tok.pieces(tgt_ids, "tgt")
    layers, heads = _selection(layer, head, weights.shape[:2])
    translation = one_line(tok.decode(hyp.tokens, "tgt"))
    title = f"{_quote(sentence)} \u2192 {_quote(translation)} ({decoding})"

    if fmt in ("png", "svg"):
        plotting.plot_attention(
            weights, src_tokens, tgt_tokens, path, layers=layers, heads=heads, title=title, fmt=fmt
        )
    elif fmt == "html":
        plotting.write_attention_html(
            weights, src_tokens, tgt_tokens, path, translation=translation,
            stop_reason=hyp.stop_reason, title=title,
        )  # fmt: skip
    else:
        metadata = {
            "source": sentence,
            "decoding": decoding,
            "teacher_forced": reference is not None,
            "reference": reference,
            "layers_and_heads_numbered_from": 1,
        }
        plotting.write_attention_json(
            weights, src_tokens, tgt_tokens, path, translation=translation,
            stop_reason=hyp.stop_reason, extra=metadata,
        )  # fmt: skip

    maps = []
    for row in plotting.select_maps(weights, layers, heads):
        for layer_number, head_label, attn in row:
            stats = plotting.attention_stats(attn, src_tokens)
            maps.append({"layer": layer_number, "head": head_label, **stats})
    return {
        "path": path,
        "format": fmt,
        "source": sentence,
        "translation": translation,
        "stop_reason": hyp.stop_reason,
        "decoding": decoding,
        "teacher_forced": reference is not None,
        "src_tokens": src_tokens,
        "tgt_tokens": tgt_tokens,
        "shape": list(weights.shape),
        "maps": maps,
    }


def format_table(report: dict) -> str:
    """The per-row numbers of every map in ``report``: entropy (bits), EOS and
    punctuation mass, one block per map, one line per target position."""
    tokens = report["tgt_tokens"]
    width = max(6, *(len(t) for t in tokens))
    lines = []
    for m in report["maps"]:
        lines.append(f"layer {m['layer']}, head {m['head']}")
        lines.append(f"  {'#':>3}  {'target':<{width}}  {'bits':>5}  {'EOS':>5}  {'punct':>5}")
        rows = zip(m["row_entropy"], m["eos_mass"], m["punct_mass"], strict=True)
        for i, (entropy, eos, punct) in enumerate(rows):
            lines.append(
                f"  {i:>3}  {tokens[i]:<{width}}  {entropy:5.2f}  {eos:5.2f}  {punct:5.2f}"
            )
        mean = (m["mean_entropy"], m["mean_eos_mass"], m["mean_punct_mass"])
        lines.append(
            f"  {'':>3}  {'mean':<{width}}  {mean[0]:5.2f}  {mean[1]:5.2f}  {mean[2]:5.2f}"
        )
    return "\n".join(lines)


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
