"""The attention explorer: one self-contained HTML page (no network) for decoded sentences.

The page is ``templates/explorer.html`` with its stylesheet and script inlined, and the
sentences' records (``records.sentence_records``) as a JSON block. It has six
views of one sentence: a step-through of decoding (with, per row, whether the most-attended
source position is the most influential one), the heatmap (attention or, toggled,
influence by occlusion, each with its own legend), a line view, a model view (a thumbnail
per layer and head), the interventions and, under beam search, the search's tree; a sentence
picker when there are several, an attention selector (cross, the encoder's self-attention or
the decoder's masked one, for the heatmap, line and model views), layer and head selectors,
and the caption at the top. ``seq2seq serve`` renders the same
page with a form above it (``form`` and ``error``), and its interventions panel asks the
server for new ones; a written page shows those it holds.

Every map the page shows is computed here (heads and their mean, the per-row numbers), so
the script only draws. No model imports.

Letters: ``L`` layers, ``H`` heads, ``Tq`` target rows, ``Tk`` source columns.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path

import numpy as np

from seq2seq.drawing import kinds, map_stats, plotting
from seq2seq.fileio import atomic_write_text

_RECORD_KEYS = (
    "source", "reference", "translation", "decoding", "teacher_forced", "beam", "ban_eos",
    "max_len", "stop_reason", "stop_step", "notes", "steps", "step_rows", "hypotheses",
    "word_level", "length_penalty",
)  # fmt: skip


def template(name: str) -> str:
    """A file of the package's ``templates`` folder, as text."""
    return (
        resources.files("seq2seq.explorer").joinpath("templates", name).read_text(encoding="utf-8")
    )


def _maps(
    weights: np.ndarray,
    src_tokens: list[str] | None,
    digits: int = 4,
    name: str = "",
    tied: list[list[int]] | None = None,
) -> list[list[dict]]:
    """For each layer, a map per head then the head mean: weights and, given the key tokens
    (``src_tokens``), a title (``name``, if any, first) and per-row numbers; given the
    influence's ``tied`` columns, each row's most-attended column and whether it is the most
    influential one (None where tied), as ``influence.agreement`` says for the record's mean.

    Shapes:
        weights: (L, H, Tq, Tk) -> L lists of H + 1 maps (Tq, Tk)
    """
    n_layers, n_heads, tq, tk = weights.shape
    layers = []
    for layer in range(n_layers):
        heads = [(str(h + 1), weights[layer, h]) for h in range(n_heads)]
        heads.append(("mean", weights[layer].mean(axis=0)))
        maps = []
        for head, attn in heads:
            entry = {"w": np.round(attn, digits).tolist()}
            if src_tokens is not None:
                stats = map_stats.attention_stats(attn, src_tokens)
                entry.update(
                    title=f"{name}layer {layer + 1}, head {head} \u2014 {tq}\u00d7{tk} (Tq\u00d7Tk)",
                    summary=map_stats.stats_line(stats),
                    vmax=float(attn.max()),
                    entropy=np.round(stats["row_entropy"], 3).tolist(),
                    eos=np.round(stats["eos_mass"], 3).tolist(),
                    punct=np.round(stats["punct_mass"], 3).tolist(),
                )
            if tied is not None:
                attended = attn.argmax(-1).tolist()
                agree = [
                    a == t[0] if len(t) == 1 else None for a, t in zip(attended, tied, strict=True)
                ]
                entry.update(attended=attended, agree=agree)
            maps.append(entry)
        layers.append(maps)
    return layers


def _influence_map(record: dict, digits: int = 4) -> dict | None:
    """The record's occlusion map as the page draws it, with per row the most-attended and
    the most influential source column, the columns tied with it, and whether the two agree
    (None where tied); None without one.

    Shapes: influence (Tq, Tk) -> w (Tq, Tk), attended/influential/tied/agree Tq each
    """
    if record.get("influence") is None:
        return None
    drops = np.asarray(record["influence"], dtype=np.float64)
    tq, tk = drops.shape
    agree = record["agree"]
    decisive = [a for a in agree if a is not None]
    return {
        "w": np.round(drops, digits).tolist(),
        "vmax": max(float(drops.max()), 0.0),  # a rise (negative drop) draws as no drop
        "title": f"influence by occlusion, every layer at once \u2014 {tq}\u00d7{tk} (Tq\u00d7Tk)",
        "summary": f"largest drop {drops.max():.3f} nats \u00b7 {tq - len(decisive)} rows tied "
        f"(two drops within {record['tie_nats']} nats, which the map's precision can order "
        "either way)",
        "attended": record["most_attended"],
        "influential": record["most_influential"],
        "tied": record["tied"],
        "agree": agree,
        "tie_nats": record["tie_nats"],
        "note": record["influence_note"],
    }


def _self_attention(record: dict) -> dict:
    """The record's self-attention as the page draws it, by kind ("encoder", "decoder"):
    name, query and key tokens, whether causal, what the axes are, layers and maps. A
    record without (one built by hand) has none."""
    shown = {}
    for kind in ("encoder", "decoder"):
        if record.get(kinds.KINDS[kind][0]) is None:
            continue
        maps = kinds.attention_maps(record, kind)
        weights = np.asarray(maps.weights, dtype=np.float64)
        shown[kind] = {
            "name": maps.name, "rows": list(maps.rows), "cols": list(maps.columns),
            "causal": maps.causal, "axes": list(maps.axes), "n_layers": weights.shape[0],
            "maps": _maps(weights, list(maps.columns), name=f"{maps.name}, "),
        }  # fmt: skip
    return shown


def _page_tree(tree: dict | None, digits: int = 3) -> dict | None:
    """The search's tree as the page draws it: each expanded node's attention row as the head
    mean of every layer, which keeps a tree of K (K + 1) nodes a step to a few kB a step.

    Shapes: attention (L, H, Tk) -> (L, Tk)
    """
    if tree is None:
        return None
    nodes = [
        {
            **node,
            "attention": None
            if node["attention"] is None
            else np.round(np.mean(node["attention"], axis=1), digits).tolist(),
        }
        for node in tree["nodes"]
    ]
    return {**tree, "nodes": nodes}


def page_record(record: dict) -> dict:
    """What the page's script needs of one record."""
    weights = np.asarray(record["weights"], dtype=np.float64)
    out = {key: record.get(key) for key in _RECORD_KEYS}
    out.update(
        src=list(record["src_tokens"]),
        tgt=list(record["tgt_tokens"]),
        n_layers=weights.shape[0],
        n_heads=weights.shape[1],
        maps=_maps(weights, record["src_tokens"], tied=record.get("tied")),
        self_attention=_self_attention(record),
        step_maps=None,
        influence=_influence_map(record),
        interventions=record.get("interventions") or [],
        tree=_page_tree(record.get("tree")),
    )
    if record.get("step_weights") is not None:
        out["step_maps"] = _maps(np.asarray(record["step_weights"]), None)
    return out


def render_page(
    records: list[dict], *, title: str, form: dict | None = None, error: str = ""
) -> str:
    """The explorer page. ``form``: the values to show in ``seq2seq serve``'s form (None:
    a report, no form); ``error``: a message shown above the views."""
    data = {
        "records": [page_record(r) for r in records],
        "form": form,
        "caption": plotting.CAPTION,
        "masked_legend": plotting.MASKED_LEGEND,
    }
    # "<" only occurs inside JSON strings, where \u003c means the same; this keeps a token
    # such as "</script>" from closing the script element.
    data_json = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    fills = {
        "%TITLE%": html.escape(title),
        "%ERROR%": html.escape(error),
        "%CAPTION%": html.escape(plotting.CAPTION),
        "%STYLE%": template("explorer.css"),
        "%SCRIPT%": template("explorer.js"),
        "%DATA%": data_json,
    }
    # One pass, so text filled in (a sentence reading "%STYLE%") is never filled again.
    return re.sub(
        r"%[A-Z]+%", lambda m: fills.get(m.group(0), m.group(0)), template("explorer.html")
    )


def write_report(records: list[dict], path: str | Path, *, title: str) -> Path:
    """Write the explorer page for ``records`` to ``path`` (atomically)."""
    return atomic_write_text(Path(path), render_page(records, title=title))
