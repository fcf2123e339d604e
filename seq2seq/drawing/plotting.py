"""Attention heatmaps (PNG, SVG) and a JSON dump; the HTML explorer is ``explorer/page.py``.

No model imports: every function takes numpy arrays and token lists, so the trainer, the
``seq2seq attention`` command and tests all call the same code.

Shapes (letters used below):
    L  layers              H  heads
    Tq queries (cross-attention: target positions, including the EOS step)
    Tk keys (cross-attention: source positions, including EOS)
    ``weights`` is always (L, H, Tq, Tk); each row over Tk sums to 1. Cross-attention is the
    default; a self-attention map names its axes (``axes``), and a decoder's is ``causal``:
    a query never reads a later key, and those cells are drawn hatched, not as weights of 0.

Layers and heads are numbered from 1 everywhere a person sees or passes them (titles,
``layers=``, ``heads=``).

Figures are drawn on a bare ``matplotlib.figure.Figure`` with the Agg canvas, never through
pyplot, so plotting needs no display and leaves matplotlib's global state alone.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Polygon, Rectangle

from seq2seq.drawing.fonts import font_families
from seq2seq.drawing.map_stats import attention_stats
from seq2seq.fileio import atomic_path, atomic_write_text

CAPTION = (
    "Attention weights show where each query (a row) read from, not why the model "
    "produced a token; different layers, heads and seeds can look different for the "
    "same output."
)

HeadSelection = Literal["mean", "all"] | int
CROSS_AXES = ("target (queries)", "source (keys)")  # rows, columns
MASKED_LEGEND = (
    "masked: a later position, which the causal mask hides from the query (not a weight of 0)"
)
_MASKED = {"facecolor": "0.82", "edgecolor": "0.45", "hatch": "////", "lw": 0.0}

# Layout in inches. Every size is a multiple of 1/4 inch, so width * dpi is exact and the
# PNG size is predictable (see figure_size).
_CELL_IN = 0.25  # one token per cell until the map hits _MAP_MAX_IN
_MAP_MIN_IN = 1.5
_MAP_MAX_IN = 9.0
_FIG_MAX_IN = 40.0  # whole-figure cap on each side; maps shrink to respect it
_LEFT_IN = 1.0  # target tick labels + axis label
_SIDE_IN = 1.25  # the per-row numbers "entropy EOS punct" (monospaced) and a gap
_PANEL_TITLE_IN = 0.5  # title and numbers header; the row above's mean line fits in it
_BOTTOM_IN = 1.0  # rotated source tick labels + axis label, under the grid
_SUPTITLE_IN = 0.5
_SCALE_IN = 0.5  # the one colour bar every map shares, its ticks and label
_CAPTION_IN = 0.75
_NOTE_IN = 0.5  # room for a note under the caption (e.g. how words were merged)
_TICK_PT = 7
_LABEL_PITCH_IN = 0.13  # closest two tick labels may sit at _TICK_PT
_LABEL_MAX_CHARS = 10
_NUMBERS_FONT = {"fontsize": 6, "fontfamily": "DejaVu Sans Mono", "color": "0.2"}
_NUMBERS_HEADER = "bits  EOS punct"  # over the columns of _numbers
_SCALE_LABEL = "weight (one 0\u20131 scale for every map)"


# --- checks and labels -------------------------------------------------------------------


def _check_weights(
    weights: np.ndarray, src_tokens: Sequence[str], tgt_tokens: Sequence[str]
) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    expected = f"(L, H, Tq={len(tgt_tokens)}, Tk={len(src_tokens)})"
    if w.ndim != 4 or w.shape[2:] != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(f"weights must be {expected}, got {w.shape}")
    if w.shape[0] == 0 or w.shape[1] == 0 or w.shape[2] == 0 or w.shape[3] == 0:
        raise ValueError(f"weights must be non-empty, got {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("weights contain NaN or infinity")
    return w


def _panel_title(layer: int, head: str, tq: int, tk: int) -> str:
    return f"layer {layer}, head {head} \u2014 {tq}\u00d7{tk} (Tq\u00d7Tk)"


def _numbers(entropy: float, eos: float, punct: float) -> str:
    """One row of the numbers beside a map, under ``_NUMBERS_HEADER``."""
    return f"{entropy:4.2f} {eos:4.2f} {punct:4.2f}"  # entropy < 10 bits: Tk <= 512


# --- figure layout -----------------------------------------------------------------------


def _quarter(x: float) -> float:
    return math.floor(x * 4) / 4


def _map_size(n_rows: int, n_cols: int, tq: int, tk: int) -> tuple[float, float]:
    """Width and height in inches of one heatmap: a cell per token, within both caps."""
    fit_w = (_FIG_MAX_IN - _LEFT_IN) / n_cols - _SIDE_IN
    fixed_h = _SUPTITLE_IN + _SCALE_IN + _BOTTOM_IN + _CAPTION_IN
    fit_h = (_FIG_MAX_IN - fixed_h) / n_rows - _PANEL_TITLE_IN
    width = min(max(tk * _CELL_IN, _MAP_MIN_IN), _MAP_MAX_IN, max(fit_w, _MAP_MIN_IN))
    height = min(max(tq * _CELL_IN, _MAP_MIN_IN), _MAP_MAX_IN, max(fit_h, _MAP_MIN_IN))
    return _quarter(width), _quarter(height)


def figure_size(
    n_rows: int, n_cols: int, tq: int, tk: int, note: bool = False, causal: bool = False
) -> tuple[float, float]:
    """Figure (width, height) in inches for a grid of n_rows × n_cols heatmaps of Tq × Tk.

    Each map gets a quarter inch per token, between 1.5 and 9 inches a side, shrunk so
    that the figure stays within 40 × 40 inches (grids too large for that, more than 14
    panels across or 18 down, keep the 1.5-inch minimum and exceed it). Past the cap, tick
    labels, and the per-row numbers with them, thin out. Target labels sit left of the
    grid and source labels under it, once per row and column of maps.

    Sizes are multiples of 1/4 inch, so ``width * dpi`` is exact: the PNG written by
    ``plot_attention`` is ``floor(width * dpi)`` × ``floor(height * dpi)`` pixels (no tight
    bounding box), which is ``round(...)`` for any dpi divisible by 4 (72, 100, 200, 300).
    A ``note`` under the caption adds half an inch, and so does the legend of a ``causal``
    map's masked cells.
    """
    map_w, map_h = _map_size(n_rows, n_cols, tq, tk)
    width = _LEFT_IN + n_cols * (map_w + _SIDE_IN)
    height = (
        _SUPTITLE_IN + _SCALE_IN + n_rows * (_PANEL_TITLE_IN + map_h) + _BOTTOM_IN + _CAPTION_IN
    )
    return width, height + _NOTE_IN * (note + causal)


def _label_step(n_tokens: int, length_in: float) -> int:
    """Label every k-th token so labels sit at least _LABEL_PITCH_IN apart."""
    fits = max(1, int(length_in / _LABEL_PITCH_IN))
    return max(1, math.ceil(n_tokens / fits))


def _short(token: str) -> str:
    return token if len(token) <= _LABEL_MAX_CHARS else token[: _LABEL_MAX_CHARS - 1] + "\u2026"


# --- PNG / SVG ---------------------------------------------------------------------------


def select_maps(
    weights: np.ndarray, layers: Sequence[int] | None = None, heads: HeadSelection = "mean"
) -> list[list[tuple[int, str, np.ndarray]]]:
    """The maps ``plot_attention`` draws for ``layers`` and ``heads``, as rows of
    (layer number, head label, map): a row per layer for ``heads="all"``, else one row.

    Shapes:
        weights: (L, H, Tq, Tk) -> maps (Tq, Tk)
    """
    w = np.asarray(weights)
    n_layers, n_heads = w.shape[:2]
    layers = list(range(1, n_layers + 1)) if layers is None else list(layers)
    if not layers or any(not 1 <= layer <= n_layers for layer in layers):
        raise ValueError(f"layers are numbered 1..{n_layers}, got {layers}")
    if heads == "mean":
        return [[(layer, "mean", w[layer - 1].mean(axis=0)) for layer in layers]]
    if heads == "all":
        return [
            [(layer, str(h + 1), w[layer - 1, h]) for h in range(n_heads)]
            + [(layer, "mean", w[layer - 1].mean(axis=0))]
            for layer in layers
        ]
    if isinstance(heads, int) and not isinstance(heads, bool) and 1 <= heads <= n_heads:
        return [[(layer, str(heads), w[layer - 1, heads - 1]) for layer in layers]]
    raise ValueError(f'heads must be "mean", "all" or a head number 1..{n_heads}, got {heads!r}')


def _draw_panel(
    canvas: Axes,
    origin_in: tuple[float, float],
    map_in: tuple[float, float],
    attn: np.ndarray,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    title: str,
    fonts: list[str],
    label_src: bool,
    label_tgt: bool,
    axes: tuple[str, str] = CROSS_AXES,
    causal: bool = False,
) -> AxesImage:
    """One heatmap with its title, per-row numbers and, if asked, its tick labels;
    ``axes`` names its rows and columns, and ``causal`` hatches the cells the mask hides.

    ``canvas`` spans the figure in inches from its top-left corner (see ``_canvas``);
    ``origin_in`` is the panel's top-left corner there: its title band, then the map;
    target labels go left of it, source labels under it. A grid's maps line up exactly,
    so only the bottom row labels the source tokens and only the left column the target
    tokens. Text is what a figure costs (matplotlib's Agg renders it glyph by glyph in
    Python, and the trainer draws a 3 x 9 grid at every validation).
    """
    tq, tk = attn.shape
    x0, top = origin_in[0], origin_in[1] + _PANEL_TITLE_IN
    map_w, map_h = map_in
    cell_w, cell_h = map_w / tk, map_h / tq
    text = canvas.text

    image = canvas.imshow(
        attn,
        cmap="viridis",
        vmin=0.0,
        vmax=1.0,
        extent=(x0, x0 + map_w, top + map_h, top),  # row 0 at the top
        aspect="auto",
        interpolation="nearest",
    )
    if causal:
        canvas.add_patch(Polygon(_above_diagonal(x0, top, cell_w, cell_h, tq), **_MASKED))
    canvas.add_patch(Rectangle((x0, top), map_w, map_h, fill=False, lw=0.5))
    text(x0, origin_in[1] + 0.2, title, fontsize=8, va="top")  # below the mean line above

    rows = range(0, tq, _label_step(tq, map_h))
    label = {"fontsize": _TICK_PT, "fontfamily": fonts}
    if label_src:
        for j in range(0, tk, _label_step(tk, map_w)):
            text(x0 + (j + 0.5) * cell_w, top + map_h + 0.04, _short(src_tokens[j]),
                 rotation=90, ha="center", va="top", **label)  # fmt: skip
        text(x0 + map_w / 2, top + map_h + 0.6, axes[1], ha="center", va="top",
             fontsize=_TICK_PT)  # fmt: skip
    if label_tgt:
        for i in rows:
            text(x0 - 0.04, top + (i + 0.5) * cell_h, _short(tgt_tokens[i]), ha="right",
                 va="center", **label)  # fmt: skip
        text(x0 - _LEFT_IN + 0.05, top + map_h / 2, axes[0], rotation=90,
             va="center", fontsize=_TICK_PT)  # fmt: skip

    # One monospaced line per labelled row, so the three columns line up.
    stats = attention_stats(attn, src_tokens)
    x = x0 + map_w + 0.08
    text(x, top - 0.04, _NUMBERS_HEADER, va="bottom", **_NUMBERS_FONT)
    entropy, eos, punct = stats["row_entropy"], stats["eos_mass"], stats["punct_mass"]
    for i in rows:
        text(x, top + (i + 0.5) * cell_h, _numbers(entropy[i], eos[i], punct[i]), va="center",
             **_NUMBERS_FONT)  # fmt: skip
    mean = _numbers(stats["mean_entropy"], stats["mean_eos_mass"], stats["mean_punct_mass"])
    text(x, top + map_h + 0.04, mean + " mean", va="top", **_NUMBERS_FONT)
    return image


def _above_diagonal(
    x0: float, top: float, cell_w: float, cell_h: float, n: int
) -> list[tuple[float, float]]:
    """The staircase outline of an n x n map's cells (i, j > i), from its top-right corner:
    one patch for every masked cell, not one per cell."""
    corners = [(x0 + n * cell_w, top)]
    for i in range(n - 1):
        x = x0 + (i + 1) * cell_w
        corners += [(x, top + i * cell_h), (x, top + (i + 1) * cell_h)]
    return [*corners, (x0 + n * cell_w, top + (n - 1) * cell_h)]


def _title_lines(title: str, fig_w: float) -> tuple[list[str], int]:
    """The figure's title wrapped to its width, and the font size that fits it in the title
    band: 10 pt on up to two lines, else smaller, else cut with an ellipsis. A single map's
    figure is narrower than a sentence pair's title."""
    for size, most in ((10, 2), (8, 3), (7, 3)):
        # ~0.6 em per character of DejaVu Sans; a margin of 0.1 inch each side
        lines = textwrap.wrap(title, width=max(10, int((fig_w - 0.2) * 72 / (0.6 * size))))
        if len(lines) <= most:
            return lines, size
    return [*lines[:2], lines[2][:-1] + "\u2026"], size


def _canvas(fig: Figure) -> Axes:
    """One invisible axes over the whole figure whose data units are inches from the
    top-left corner: every map and label is placed there, instead of an axes per map."""
    canvas = fig.add_axes((0, 0, 1, 1))
    canvas.set_axis_off()
    fig_w, fig_h = fig.get_size_inches()
    canvas.set_xlim(0, fig_w)
    canvas.set_ylim(fig_h, 0)
    canvas.set_autoscale_on(False)  # imshow would otherwise rescale to the last map
    return canvas


def plot_attention(
    weights: np.ndarray,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    path: str | Path,
    *,
    layers: Sequence[int] | None = None,
    heads: HeadSelection = "mean",
    title: str = "",
    dpi: int = 100,
    fmt: str | None = None,
    note: str = "",
    axes: tuple[str, str] = CROSS_AXES,
    causal: bool = False,
) -> Path:
    """Draw attention heatmaps (``attention_figure``) to a PNG or SVG file and return its
    path. The format comes from ``fmt`` or the path's suffix.
    """
    path = Path(path)
    fmt = (fmt or path.suffix.lstrip(".")).lower()
    if fmt not in ("png", "svg"):
        raise ValueError(f"format must be png or svg, got {fmt!r} (from fmt= or the suffix)")
    fig = attention_figure(
        weights, src_tokens, tgt_tokens, layers=layers, heads=heads, title=title, dpi=dpi,
        note=note, axes=axes, causal=causal,
    )  # fmt: skip
    with atomic_path(path) as tmp:
        # zlib level 1: a tenth of the default's time on these mostly flat images, for
        # files about a third larger.
        options = {"pil_kwargs": {"compress_level": 1}} if fmt == "png" else {}
        fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches=fig.bbox_inches, **options)
    return path


def attention_figure(
    weights: np.ndarray,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    *,
    layers: Sequence[int] | None = None,
    heads: HeadSelection = "mean",
    title: str = "",
    dpi: int = 100,
    note: str = "",
    axes: tuple[str, str] = CROSS_AXES,
    causal: bool = False,
) -> Figure:
    """Attention heatmaps as a matplotlib ``Figure`` (Agg canvas, no pyplot): cross-attention,
    or a self-attention map whose ``axes`` (rows, columns) say what they are.

    ``layers`` picks layer numbers (1-based; None = all). ``heads="mean"`` draws one
    panel per layer, averaged over heads; an int draws that head (1-based) of each layer;
    ``"all"`` draws a grid, a row per layer, a column per head plus a head-mean column.
    Every panel uses the same 0-1 colour scale, shown once by the colour bar at the top.
    Beside each map: the entropy (bits), EOS mass and punctuation mass of each labelled
    row. Size: see ``figure_size``.
    ``note`` (e.g. how subwords were merged into words) follows the caption. ``causal``
    (a decoder's self-attention, Tq = Tk): the cells a query may not read, right of the
    diagonal, are hatched grey, with a legend under the caption.

    Shapes:
        weights: (L, H, Tq, Tk); src_tokens: Tk tokens; tgt_tokens: Tq tokens.
    """
    w = _check_weights(weights, src_tokens, tgt_tokens)
    if causal and len(src_tokens) != len(tgt_tokens):
        raise ValueError(f"a causal map is square, got {w.shape[2:]}")
    panels = select_maps(w, layers, heads)
    tq, tk = w.shape[2:]
    n_rows, n_cols = len(panels), len(panels[0])
    fonts = font_families([*src_tokens, *tgt_tokens, title])

    fig = Figure(figsize=figure_size(n_rows, n_cols, tq, tk, bool(note), causal), dpi=dpi)
    FigureCanvasAgg(fig)
    canvas = _canvas(fig)
    map_in = _map_size(n_rows, n_cols, tq, tk)
    panel_w = map_in[0] + _SIDE_IN
    panel_h = _PANEL_TITLE_IN + map_in[1]
    for r, row in enumerate(panels):
        for c, (layer, head, attn) in enumerate(row):
            origin = (_LEFT_IN + c * panel_w, _SUPTITLE_IN + _SCALE_IN + r * panel_h)
            label = _panel_title(layer, head, tq, tk)
            image = _draw_panel(
                canvas, origin, map_in, attn, src_tokens, tgt_tokens, label, fonts,
                label_src=r == n_rows - 1, label_tgt=c == 0, axes=axes, causal=causal,
            )  # fmt: skip

    fig_w, fig_h = fig.get_size_inches()
    if title:
        lines, size = _title_lines(title, fig_w)
        canvas.text(fig_w / 2, _SUPTITLE_IN / 2, "\n".join(lines), ha="center", va="center",
                    fontsize=size, fontfamily=fonts, linespacing=1.1)  # fmt: skip
    bar_w = min(2.5, fig_w - _LEFT_IN - 0.25)
    bar_ax = fig.add_axes(
        (_LEFT_IN / fig_w, 1 - (_SUPTITLE_IN + 0.12) / fig_h, bar_w / fig_w, 0.12 / fig_h)
    )
    colorbar = fig.colorbar(image, cax=bar_ax, orientation="horizontal")
    colorbar.set_ticks([0, 0.25, 0.5, 0.75, 1])
    colorbar.ax.tick_params(labelsize=6, length=2, pad=1)
    canvas.text(_LEFT_IN + bar_w / 2, _SUPTITLE_IN + 0.3, _SCALE_LABEL, ha="center", va="top",
                fontsize=6, color="0.25")  # fmt: skip
    # ~0.5 em per character at 8 pt decides where the caption wraps.
    caption = textwrap.fill(f"{CAPTION} {note}".strip(), width=max(40, int(fig_w * 72 / 4.4)))
    caption_in = _CAPTION_IN + (_NOTE_IN if note else 0.0)
    legend_in = _NOTE_IN if causal else 0.0
    canvas.text(fig_w / 2, fig_h - legend_in - caption_in / 2, caption, ha="center",
                va="center", fontsize=8, color="0.25")  # fmt: skip
    if causal:
        _masked_legend(canvas, fig_w, fig_h - legend_in / 2)
    return fig


def _masked_legend(canvas: Axes, fig_w: float, y: float) -> None:
    """A hatched swatch and what it means, on one line at height ``y``."""
    legend = textwrap.fill(MASKED_LEGEND, width=max(30, int((fig_w - 0.6) * 72 / 4.4)))
    canvas.add_patch(Rectangle((0.15, y - 0.08), 0.16, 0.16, **_MASKED))
    canvas.text(0.4, y, legend, va="center", fontsize=8, color="0.25")


# --- JSON --------------------------------------------------------------------------------


def write_attention_json(
    weights: np.ndarray,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    path: str | Path,
    *,
    translation: str,
    stop_reason: str,
    extra: dict | None = None,
) -> Path:
    """Write tokens, weights (rounded to 6 digits), translation and stop reason as JSON.

    Keys: src_tokens, tgt_tokens, translation, stop_reason, shape [L, H, Tq, Tk],
    weights (nested lists in that shape), caption, metadata (``extra``, or {}).

    Shapes:
        weights: (L, H, Tq, Tk); src_tokens: Tk tokens; tgt_tokens: Tq tokens.
    """
    w = _check_weights(weights, src_tokens, tgt_tokens)
    record = {
        "src_tokens": list(src_tokens),
        "tgt_tokens": list(tgt_tokens),
        "translation": translation,
        "stop_reason": stop_reason,
        "shape": list(w.shape),
        "weights": np.round(w, 6).tolist(),
        "caption": CAPTION,
        "metadata": dict(extra or {}),
    }
    return atomic_write_text(Path(path), json.dumps(record, ensure_ascii=False) + "\n")
