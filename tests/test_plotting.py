"""Attention figures and JSON dump, from synthetic weights and made-up tokens."""

import json
import math
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import child_env

from seq2seq.drawing.map_stats import attention_stats, is_punctuation
from seq2seq.drawing.plotting import (
    CAPTION,
    MASKED_LEGEND,
    attention_figure,
    figure_size,
    font_families,
    plot_attention,
    write_attention_json,
)

SRC = ["▁the", "▁cat", "▁sat", "▁on", "▁the", "▁mat", ",", "▁yes", ".", "</s>"]
TGT = ["▁die", "▁Katze", "▁saß", "▁auf", "▁der", "▁Matte", ".", "</s>"]
N_LAYERS, N_HEADS = 3, 4


def softmax_weights(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(scale=2.0, size=shape)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.fixture
def weights() -> np.ndarray:
    return softmax_weights((N_LAYERS, N_HEADS, len(TGT), len(SRC)))  # (L, H, Tq, Tk)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def expected_pixels(n_rows: int, n_cols: int, tq: int, tk: int, dpi: int) -> tuple[int, int]:
    width, height = figure_size(n_rows, n_cols, tq, tk)
    return math.floor(width * dpi), math.floor(height * dpi)


# --- PNG / SVG ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heads", "layers", "grid"),
    [
        ("mean", None, (1, N_LAYERS)),  # default: head mean of every layer, one row
        (2, [1, 3], (1, 2)),  # one head of the chosen layers
        ("all", [2, 3], (2, N_HEADS + 1)),  # a row per layer: every head, then the mean
    ],
)
def test_png_has_the_documented_pixel_size(tmp_path, weights, heads, layers, grid):
    path = plot_attention(weights, SRC, TGT, tmp_path / "attn.png", heads=heads, layers=layers)
    assert path == tmp_path / "attn.png"
    assert png_size(path) == expected_pixels(*grid, len(TGT), len(SRC), dpi=100)


def test_a_note_adds_half_an_inch_under_the_caption(tmp_path, weights):
    path = plot_attention(weights, SRC, TGT, tmp_path / "attn.png", layers=[1], note="merged")
    width, height = figure_size(1, 1, len(TGT), len(SRC), note=True)
    assert (width, height - 0.5) == figure_size(1, 1, len(TGT), len(SRC))
    assert png_size(path) == (math.floor(width * 100), math.floor(height * 100))


def test_dpi_scales_the_png(tmp_path, weights):
    path = plot_attention(weights, SRC, TGT, tmp_path / "attn.png", layers=[1], dpi=72, title="t")
    assert png_size(path) == expected_pixels(1, 1, len(TGT), len(SRC), dpi=72)


def test_svg_is_written_at_the_same_size(tmp_path, weights):
    path = plot_attention(weights, SRC, TGT, tmp_path / "attn.svg", layers=[2])
    text = path.read_text()
    assert "<svg" in text
    width, height = figure_size(1, 1, len(TGT), len(SRC))
    assert f'width="{width * 72:g}pt"' in text and f'height="{height * 72:g}pt"' in text


def test_format_argument_overrides_the_suffix(tmp_path, weights):
    path = plot_attention(weights, SRC, TGT, tmp_path / "attn.figure", layers=[1], fmt="png")
    assert png_size(path)[0] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attn.figure"]  # no temp files left


def test_bad_requests_raise_and_write_nothing(tmp_path, weights):
    with pytest.raises(ValueError, match="png or svg"):
        plot_attention(weights, SRC, TGT, tmp_path / "attn.pdf")
    with pytest.raises(ValueError, match="numbered 1..3"):
        plot_attention(weights, SRC, TGT, tmp_path / "attn.png", layers=[0])
    with pytest.raises(ValueError, match="head number 1..4"):
        plot_attention(weights, SRC, TGT, tmp_path / "attn.png", heads=5)
    with pytest.raises(ValueError, match="Tk=9"):
        plot_attention(weights, SRC[:-1], TGT, tmp_path / "attn.png")
    assert list(tmp_path.iterdir()) == []


def test_figure_grows_with_the_input_up_to_a_cap():
    short, longer, capped = (figure_size(1, 1, n, n) for n in (8, 24, 36))
    assert short < longer < capped
    assert figure_size(1, 1, 500, 500) == capped
    # Even a wide grid stays within 40 inches a side.
    assert max(figure_size(6, 5, 120, 150)) <= 40


def test_long_input_stays_under_the_size_cap(tmp_path):
    tq, tk = 120, 150
    w = softmax_weights((1, 2, tq, tk))
    src = [f"▁s{j}" for j in range(tk - 1)] + ["</s>"]
    tgt = [f"▁t{i}" for i in range(tq - 1)] + ["</s>"]
    path = plot_attention(w, src, tgt, tmp_path / "long.png")
    width, height = png_size(path)
    assert (width, height) == expected_pixels(1, 1, tq, tk, dpi=100)
    assert width <= 40 * 100 and height <= 40 * 100
    # The map is capped below a quarter inch per token, so the labels must have thinned.
    assert figure_size(1, 1, tq, tk)[0] < tk * 0.25


def test_non_latin_tokens_pick_a_font_or_warn(tmp_path):
    families = font_families(["▁猫", "が"])
    assert families[0] == "DejaVu Sans"
    if len(families) == 1:
        pytest.skip("no CJK font installed (Debian: fonts-noto-cjk)")
    w = softmax_weights((1, 2, 3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missing-glyph warning, ours or matplotlib's
        plot_attention(w, ["▁猫", "が", "</s>"], ["▁le", "▁chat", "</s>"], tmp_path / "ja.png")

    no_font = chr(0x1D800)  # Sutton SignWriting: in no font this project installs
    with pytest.warns(UserWarning, match="no installed font has glyphs"):
        font_families([f"▁{no_font}"])


def test_plotting_imports_no_model_code_and_no_pyplot():
    code = (
        "import sys, seq2seq.drawing.plotting; "
        "bad = [m for m in ('torch', 'seq2seq.model.transformer', 'matplotlib.pyplot') if m in sys.modules]; "
        "sys.exit(str(bad) if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=child_env())


# --- numbers -----------------------------------------------------------------------------


def test_attention_stats_on_a_hand_built_map():
    src = ["▁a", "▁,", "b", "</s>"]
    w = np.array(
        [
            [0.0, 0.0, 0.0, 1.0],  # all on EOS
            [0.25, 0.25, 0.25, 0.25],  # uniform over 4
            [0.5, 0.5, 0.0, 0.0],  # half on punctuation
        ]
    )
    stats = attention_stats(w, src)
    assert stats["entropy_unit"] == "bits"
    assert stats["row_entropy"] == pytest.approx([0.0, math.log2(4), 1.0])
    assert stats["eos_mass"] == pytest.approx([1.0, 0.25, 0.0])
    assert stats["punct_mass"] == pytest.approx([0.0, 0.25, 0.5])
    assert stats["mean_entropy"] == pytest.approx(1.0)
    assert stats["mean_eos_mass"] == pytest.approx(1.25 / 3)
    assert stats["mean_punct_mass"] == pytest.approx(0.25)


def test_stats_with_no_eos_or_punctuation_columns_are_zero():
    stats = attention_stats(np.full((2, 3), 1 / 3), ["▁x", "▁y", "▁z"])
    assert stats["eos_mass"] == [0.0, 0.0] and stats["punct_mass"] == [0.0, 0.0]
    assert stats["row_entropy"] == pytest.approx([math.log2(3)] * 2)


@pytest.mark.parametrize(
    ("token", "expected"),
    [(",", True), ("▁.", True), ("。", True), ("?!", True), ("▁", False), ("</s>", False),
     ("a.", False), ("▁the", False)],
)  # fmt: skip
def test_is_punctuation(token, expected):
    assert is_punctuation(token) is expected


# --- JSON --------------------------------------------------------------------------------


def test_json_round_trips_tokens_and_weights(tmp_path, weights):
    path = write_attention_json(
        weights, SRC, TGT, tmp_path / "attn.json",
        translation="die Katze saß auf der Matte.", stop_reason="eos", extra={"beam": 4},
    )  # fmt: skip
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["shape"] == [N_LAYERS, N_HEADS, len(TGT), len(SRC)]
    loaded = np.array(record["weights"])
    assert loaded.shape == tuple(record["shape"])
    np.testing.assert_allclose(loaded.sum(axis=-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(loaded, weights, atol=5e-7)
    assert record["src_tokens"] == SRC and record["tgt_tokens"] == TGT
    assert record["translation"] == "die Katze saß auf der Matte."
    assert record["stop_reason"] == "eos"
    assert record["metadata"] == {"beam": 4}
    assert record["caption"] == CAPTION


def text_boxes(fig) -> list[tuple[str, object]]:
    """Every text of a drawn figure with its extent in pixels."""
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.axes[0].texts]


def test_a_single_maps_long_title_wraps_inside_the_figure():
    title = (
        "\u201c" + "Ein Mann fährt Fahrrad auf der Straße " * 2 + "\u201d \u2192 (greedy search)"
    )
    w = softmax_weights((1, 2, 3, 3))
    fig = attention_figure(w, SRC[:3], TGT[:3], layers=[1], title=title)
    ((shown, box),) = [(t, b) for t, b in text_boxes(fig) if "Mann" in t]
    assert "\n" in shown and shown.replace("\n", " ") == title  # wrapped, nothing cut
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height


def test_a_causal_map_hatches_the_masked_cells_and_says_so(tmp_path):
    n = 5
    w = np.tril(softmax_weights((2, 2, n, n)))  # a decoder's: nothing right of the diagonal
    w /= w.sum(-1, keepdims=True)
    tokens = ["<s>", *TGT[: n - 1]]
    axes = ("decoder input (queries)", "decoder input (keys)")
    fig = attention_figure(w, tokens, tokens, layers=[1, 2], axes=axes, causal=True)
    hatched = [p for p in fig.axes[0].patches if p.get_hatch()]
    assert len(hatched) == 2 + 1  # one patch a map, one swatch in the legend
    x, y = np.asarray(hatched[0].get_xy()).T  # in inches: a staircase above the diagonal
    area = abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))) / 2  # shoelace
    x0, x1, y0, y1 = fig.axes[0].images[0].get_extent()  # the first map's, in inches
    cell = abs((x1 - x0) * (y1 - y0)) / n**2
    assert area == pytest.approx(cell * n * (n - 1) / 2)  # the masked cells, no more
    texts = [t for t, _ in text_boxes(fig)]
    assert MASKED_LEGEND in (t.replace("\n", " ") for t in texts) and set(axes) <= set(texts)
    assert fig.get_size_inches().tolist() == list(figure_size(1, 2, n, n, causal=True))
    assert figure_size(1, 2, n, n, causal=True)[1] == figure_size(1, 2, n, n)[1] + 0.5
    with pytest.raises(ValueError, match="square"):
        attention_figure(w[..., :-1], tokens[:-1], tokens, causal=True)
