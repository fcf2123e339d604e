"""``seq2seq attention``: sentences translated (or references teacher-forced) into records
(``seq2seq.inspect.records``), written as a PNG or SVG of the maps ``--kind``, ``--layer`` and
``--head`` choose, an HTML explorer page (``seq2seq.explorer.page``) or JSON lines; and the
summary it prints: per sentence its translation and how decoding stopped, for one sentence the
per-row numbers of the chosen maps (entropy, EOS and punctuation mass, the most attended and,
for cross-attention, the most influential source token), rows numbered from 1 as the steps.
"""

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seq2seq.config import DEFAULT_DEVICE
from seq2seq.decoding.translate import Translator, read_lines
from seq2seq.drawing import map_stats, plotting
from seq2seq.drawing.kinds import attention_maps, check_kind
from seq2seq.errors import Seq2SeqError
from seq2seq.explorer.page import write_report
from seq2seq.fileio import atomic_write_text
from seq2seq.inspect.interventions import Spec, parse_spec
from seq2seq.inspect.records import json_record, sentence_records

FORMATS = ("png", "svg", "html", "json")
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
    kind: str = "cross",
    beam: int | None = None,
    length_penalty: float | None = None,
    max_len: int | None = None,
    ban_eos: bool = False,
    words: bool = False,
    influence: bool = True,
    interventions: Sequence[str] = (),
    with_page_interventions: bool = True,
    fmt: str | None = None,
    out: str | Path | None = None,
    device: str = DEFAULT_DEVICE,
) -> dict:
    """Translate ``sentences`` (or teacher-force ``references``) and write their attention.

    ``layer`` is a layer number (from 1) or "all"; ``head`` a head number (from 1),
    "mean" or "all" (every head plus the mean, as a grid); ``kind`` which attention: "cross"
    (the decoder's reading of the source), "encoder" (the source's self-attention) or
    "decoder" (the decoder's masked self-attention, ``records.KINDS``); the three choose
    what PNG and SVG draw and the table prints, while HTML and JSON hold every kind, layer
    and head. ``beam``: None = the run's ``decode.beam``, 1 = greedy; ``length_penalty``:
    None = the run's. ``max_len`` replaces the run's ``a * S + b`` rule;
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
    check_kind(kind)
    translator = run if isinstance(run, Translator) else Translator.from_run(run, device)
    model_config = translator.model.config
    n_layers = model_config.n_enc_layers if kind == "encoder" else model_config.n_dec_layers
    plot_selection(layer, head, (n_layers, model_config.n_heads), _side(kind))
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
        length_penalty=length_penalty,
        max_len=max_len,
        ban_eos=ban_eos,
        words=words,
        influence=influence,
        interventions=interventions,
    )
    title = page_title(records)
    _write(records, fmt, path, title, (layer, head, kind))
    return {"path": path, "format": fmt, "title": title, "records": records, "interventions": asked}


def _write(
    records: list[dict], fmt: str, path: Path, title: str, choice: tuple[int | str, int | str, str]
) -> None:
    """``records`` written as ``fmt``: the maps ``choice`` (layer, head, kind) chooses (PNG,
    SVG: one sentence), the explorer page (HTML), or one JSON record a line."""
    if fmt in ("png", "svg"):
        plotting.plot_attention(path=path, fmt=fmt, **drawing(records[0], *choice))
    elif fmt == "html":
        write_report(records, path, title=title)
    else:
        lines = [json.dumps(json_record(r), ensure_ascii=False) + "\n" for r in records]
        atomic_write_text(path, "".join(lines))


def drawing(
    record: dict, layer: int | str = "all", head: int | str = "mean", kind: str = "cross"
) -> dict:
    """What ``plotting.attention_figure`` (and ``plot_attention``) take to draw the record's
    maps of ``kind``, ``layer`` and ``head`` (as ``plot_selection`` reads them), titled with
    the sentence, the attention's name before it unless cross."""
    maps = attention_maps(record, kind)
    layers, heads = plot_selection(layer, head, maps.weights.shape[:2], _side(kind))
    title = page_title([record])
    if kind != "cross":
        title = f"{maps.name[0].upper()}{maps.name[1:]} of {title}"
    return {
        "weights": maps.weights, "src_tokens": maps.columns, "tgt_tokens": maps.rows,
        "layers": layers, "heads": heads, "title": title, "note": record["word_level"] or "",
        "axes": maps.axes, "causal": maps.causal,
    }  # fmt: skip


def _side(kind: str) -> str:
    """The half of the model whose layers hold attention of ``kind``."""
    return "encoder" if kind == "encoder" else "decoder"


def page_interventions(n_layers: int) -> list[Spec]:
    """What every HTML page holds: each of ``PAGE_INTERVENTIONS`` in each decoder layer, then
    in all of them at once."""
    layers = [*(str(n) for n in range(1, n_layers + 1)), "all"]
    return [parse_spec(f"{kind}:{n}", n_layers) for kind in PAGE_INTERVENTIONS for n in layers]


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


def format_summary(
    report: dict, layer: int | str = "all", head: int | str = "mean", kind: str = "cross"
) -> str:
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
        maps = selected_maps(records[0], layer, head, kind)
        lines.append(format_table(records[0], maps, kind))
    lines.append(f"wrote {report['path']}")
    return "\n".join(lines)


def selected_maps(
    record: dict, layer: int | str = "all", head: int | str = "mean", kind: str = "cross"
) -> list[dict]:
    """Layer, head and per-row numbers of each map ``kind``, ``layer`` and ``head`` select,
    with each row's most-attended column."""
    chosen = attention_maps(record, kind)
    layers, heads = plot_selection(layer, head, chosen.weights.shape[:2], _side(kind))
    maps = []
    for row in plotting.select_maps(chosen.weights, layers, heads):
        for layer_number, head_label, attn in row:
            stats = map_stats.attention_stats(attn, chosen.columns)
            attended = np.asarray(attn).argmax(-1).tolist()
            maps.append({"layer": layer_number, "head": head_label, **stats, "attended": attended})
    return maps


def format_table(record: dict, maps: list[dict], kind: str = "cross") -> str:
    """The per-row numbers of every map: entropy (bits), EOS and punctuation mass, one
    block per map, one line per query (numbered from 1, as the decoding steps). With the
    record's influence, for cross-attention, also the source token the map's row attends to
    most, the one whose occlusion lowers the row's token most (tied ones joined by "=",
    ``_tied_tokens``; ``influence.tie_nats``), and whether they are the same position ("tie"
    where tied; the mean line: how often, of the rows that are not)."""
    chosen = attention_maps(record, kind)
    tokens, src = chosen.rows, chosen.columns
    tied = record.get("tied") if kind == "cross" else None
    influential = [] if tied is None else [_tied_tokens(src, t) for t in tied]
    queries = chosen.axes[0].split(" (")[0]  # "target", "source" or "decoder input"
    width = max(len(queries), *(len(t) for t in tokens))
    src_width = max((len(t) for t in src), default=0)
    a_width = max(len("attended"), src_width)
    i_width = max(len("influential"), src_width, *(len(t) for t in influential))
    lines = []
    for m in maps:
        which = "" if kind == "cross" else f"{chosen.name}, "
        lines.append(f"{which}layer {m['layer']}, head {m['head']}")
        header = f"  {'#':>3}  {queries:<{width}}  {'bits':>5}  {'EOS':>5}  {'punct':>5}"
        if tied is not None:
            header += f"  {'attended':<{a_width}}  {'influential':<{i_width}}  same"
        lines.append(header)
        rows = zip(m["row_entropy"], m["eos_mass"], m["punct_mass"], strict=True)
        same = [] if tied is None else _same(m["attended"], tied)
        for i, (entropy, eos, punct) in enumerate(rows):
            line = f"  {i + 1:>3}  {tokens[i]:<{width}}  {entropy:5.2f}  {eos:5.2f}  {punct:5.2f}"
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


def plot_selection(
    layer: int | str, head: int | str, shape: tuple[int, int], side: str = "decoder"
) -> tuple[list[int] | None, int | str]:
    """``plot_attention``'s ``layers`` and ``heads`` for a user's ``layer`` (a number from 1,
    or "all") and ``head`` (a number from 1, "mean" or "all"), checked against the ``shape``
    (layers, heads) of the ``side`` ("decoder" or "encoder") the attention is in: what
    ``seq2seq attention`` and ``Inspection.heatmap`` draw."""
    n_layers, n_heads = shape
    if layer != "all" and not (isinstance(layer, int) and 1 <= layer <= n_layers):
        raise Seq2SeqError(f"--layer {layer}: the {side} has layers 1..{n_layers} (or 'all')")
    if head not in ("mean", "all") and not (isinstance(head, int) and 1 <= head <= n_heads):
        raise Seq2SeqError(f"--head {head}: the {side} has heads 1..{n_heads} (or 'mean', 'all')")
    return (None if layer == "all" else [layer]), head


def _quote(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _TITLE_MAX_CHARS:
        text = text[: _TITLE_MAX_CHARS - 1] + "\u2026"
    return f"\u201c{text}\u201d"
