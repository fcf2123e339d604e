"""The notebook face (``seq2seq.load``, ``inspect``): what it returns, the messages it shows
for sentences the explorer cannot show, and two inline explorers on one page in Chromium,
each stepping and toggling on its own, with no request made."""

import base64
import html
import re
from pathlib import Path

import numpy as np
import pytest
from browser import N_HEADS, N_LAYERS, chromium, explorer_run_dir
from matplotlib.figure import Figure

import seq2seq
from seq2seq.decoding.translate import Translation
from seq2seq.inspect.records import sentence_records

SENTENCE = "Ein Hund läuft über die Wiese."
OTHER = "Eine Katze spielt mit einem Ball."


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return seq2seq.load(explorer_run_dir(tmp_path_factory), device="cpu")


@pytest.fixture(scope="module")
def dog(run):
    return run.inspect(SENTENCE)


def test_translate_takes_a_string_or_a_list_and_gives_objects_on_request(run):
    found = run.translator.translate([SENTENCE, OTHER])
    assert run.translate(SENTENCE) == found[0][0].text
    assert run.translate([SENTENCE, OTHER]) == [hyps[0].text for hyps in found]
    full = run.translate([SENTENCE], full=True)
    assert isinstance(full[0], Translation) and full[0].tokens == found[0][0].tokens
    assert run.translate(SENTENCE, full=True).stop_reason == found[0][0].stop_reason


def test_inspect_holds_the_reports_record_by_name(run, dog):
    (record,) = sentence_records(run.translator, [SENTENCE], beam=1, influence=True)
    assert dog.translation == record["translation"] and dog.stop_reason == record["stop_reason"]
    tq, tk = len(dog.tgt_tokens), len(dog.src_tokens)
    assert dog.attention.shape == (N_LAYERS, N_HEADS, tq, tk)
    np.testing.assert_allclose(dog.attention, record["weights"])
    assert dog.influence.shape == (tq, tk)
    assert dog.message is None
    held = {c["spec"] for c in dog.record["interventions"]}  # what the page offers
    assert {"uniform:1", "uniform:all", "permuted:2"} <= held


def test_under_beam_search_inspect_holds_the_tree_the_inline_explorer_draws(run, dog):
    beamed = run.inspect(SENTENCE, beam=3, length_penalty=0.5, influence=False)
    tree = beamed.beam_tree
    assert tree["beam"] == 3 and tree["alpha"] == 0.5 and dog.beam_tree is None
    (chosen,) = [e for e in tree["endings"] if e["chosen"]]
    assert chosen == tree["endings"][0] and chosen["translation"] == beamed.translation
    assert sum(n["fate"] in ("kept", "max_len") for n in tree["nodes"] if n["step"] == 1) == 3
    assert 'data-view="tree"' in html.unescape(beamed._repr_html_())


def test_heatmap_is_a_figure_of_a_panel_per_layer(dog, tmp_path):
    fig = dog.heatmap()
    assert isinstance(fig, Figure)
    fig.savefig(tmp_path / "map.png")
    assert (tmp_path / "map.png").stat().st_size > 1000
    one = dog.heatmap(layer=2, head=1)
    assert [len(f.axes[0].images) for f in (fig, one)] == [N_LAYERS, 1]  # a map a panel
    with pytest.raises(seq2seq.Seq2SeqError, match="layers 1..2"):
        dog.heatmap(layer=3)


def test_in_ipython_the_heatmap_displays_as_a_picture(dog):
    shell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell.instance()
    try:
        shown, _ = shell.display_formatter.format(dog.heatmap())
    finally:
        shell.clear_instance()
    png = shown["image/png"]
    assert (base64.b64decode(png) if isinstance(png, str) else png)[:4] == b"\x89PNG"


def test_an_intervention_shows_the_translation_before_and_after(run, dog):
    changed = dog.intervene("uniform:all")
    assert changed.before == dog.translation
    assert changed.after == changed.record["translation"]
    text = repr(changed)
    assert "before: " in text and "after uniform:all: " in text
    marks = re.findall(r"<mark>", changed._repr_html_())
    assert len(marks) == sum(changed.record["changed"]) + sum(changed.record["removed"])
    words = run.inspect(SENTENCE, words=True)
    masked = words.mask("Hund")
    assert masked.record["masked_token"] == "Hund" and masked.record["spec"] == "mask:2"
    with pytest.raises(seq2seq.Seq2SeqError, match="no source column reads 'Hund'.*words=True"):
        dog.mask("Hund")  # subword columns: '▁H', 'und', ...


@pytest.mark.parametrize(
    ("sentence", "says"),
    [
        ("", "The sentence is empty"),
        (
            "\u200b",
            r"The sentence has no subwords: the tokenizer drops each of its characters \(U\+200B\)",
        ),
    ],
)
def test_a_sentence_the_explorer_cannot_show_shows_a_message(run, sentence, says):
    shown = run.inspect(sentence)
    assert re.fullmatch(f"<p><b>{says}.*</b></p>", shown._repr_html_())
    assert shown.attention is None and shown.translation is None
    with pytest.raises(seq2seq.Seq2SeqError, match=says):
        shown.heatmap()


def test_a_sentence_cut_at_max_len_shows_the_explorer_under_a_message(run):
    shown = run.inspect(SENTENCE, max_len=2)
    assert shown.stop_reason == "max_len" and len(shown.tgt_tokens) == 2
    out = shown._repr_html_()
    assert out.startswith("<p><b>Decoding stopped at max_len (2 subwords) before")
    assert "<iframe srcdoc=" in out


def test_the_inline_explorer_is_the_written_page_in_a_frame(dog):
    out = dog._repr_html_()
    (srcdoc,) = re.findall(r'<iframe srcdoc="([^"]*)"', out)
    inner = html.unescape(srcdoc)
    assert inner.replace(seq2seq.explorer.notebook._FIT_FRAME, "") == dog.page()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", inner)  # nothing to fetch


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def test_two_inline_explorers_step_and_toggle_on_their_own_and_fetch_nothing(
    run, dog, browser, tmp_path
):
    cell = f"<h1>a notebook</h1>{dog._repr_html_()}<p>another cell</p>"
    cell += run.inspect(OTHER)._repr_html_()
    page_file = tmp_path / "notebook.html"
    page_file.write_text(f"<!DOCTYPE html><html><body>{cell}</body></html>", encoding="utf-8")
    requests, errors = [], []
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_file.as_uri())
    first, second = [f for f in page.frames if f != page.main_frame]
    status = "document.body.dataset.status"
    first.wait_for_function(f"{status} !== 'loading'")
    second.wait_for_function(f"{status} !== 'loading'")
    assert [first.evaluate(status), second.evaluate(status)] == ["ok", "ok"], errors

    def shown(key: str) -> list[str]:
        return [f.evaluate(f"document.body.dataset.{key}") for f in (first, second)]

    first.click("#next")
    first.click("#next")
    second.click("#next")
    assert shown("step") == ["3", "2"]
    assert first.inner_text("#translation") == dog.translation
    for frame in (first, second):
        frame.click(".tabs button[data-view=heatmap]")
    first.click(".toggle button[data-map=influence]")
    assert shown("map") == ["influence", "attention"]
    second.click(".toggle button[data-map=influence]")
    assert shown("map") == ["influence", "influence"]
    heights = page.eval_on_selector_all("iframe", "fs => fs.map(f => f.offsetHeight)")
    assert all(h > 300 for h in heights)  # each frame fits its page
    assert requests == [page_file.as_uri()]


def test_the_latency_the_python_api_links_says_how_it_was_taken():
    """The page links the render of the record (docs/results.md); beside its figures, what
    they are: untrained weights, a machine shared with other jobs."""
    repo = Path(__file__).resolve().parents[1]
    page = (repo / "docs/python_api.md").read_text(encoding="utf-8")
    assert "](results.md#the-first-explorer-in-a-notebook)" in page
    results = (repo / "docs/results.md").read_text(encoding="utf-8")
    rendered = results.split("### The first explorer in a notebook")[1].split("\n## ")[0]
    assert "untrained" in rendered and "not an idle machine" in rendered


def test_inspect_holds_the_self_attention_and_draws_any_kind(dog):
    tq, tk = len(dog.tgt_tokens), len(dog.src_tokens)
    assert dog.encoder_attention.shape[1:] == (N_HEADS, tk, tk)
    assert dog.decoder_attention.shape == (N_LAYERS, N_HEADS, tq, tq)
    assert dog.decoder_tokens == ["<s>", *dog.tgt_tokens[:-1]]
    fig = dog.heatmap(layer=1, kind="decoder")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "decoder input (keys)" in texts and any("masked" in t for t in texts)
    assert len([p for p in fig.axes[0].patches if p.get_hatch()]) == 1 + 1  # the map, the legend
    assert any(t.startswith("Decoder self-attention (masked) of") for t in texts)
    with pytest.raises(seq2seq.Seq2SeqError, match="--layer 9: the encoder has layers"):
        dog.heatmap(layer=9, kind="encoder")
    with pytest.raises(seq2seq.Seq2SeqError, match="--kind self: choose one of"):
        dog.heatmap(kind="self")
