"""The explorer page (``seq2seq attention ... -o report.html``) in headless Chromium: step
through with the keyboard, switch views, toggle the heatmap to influence, see the agreement
per row and the interventions the page holds, pick a sentence; every number shown is the
JSON's."""

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from browser import N_HEADS, N_LAYERS, chromium, explorer_run_dir, not_blank, open_page

from seq2seq.commands.cli import main
from seq2seq.decoding.beam import gnmt_length_penalty
from seq2seq.drawing.plotting import CAPTION
from seq2seq.drawing.words import WORDS_NOTE
from seq2seq.explorer.page import page_record, render_page
from seq2seq.explorer.report import _tied_tokens, page_interventions
from seq2seq.inspect import records as records_module
from seq2seq.inspect.influence import TIE_NATS, agreement, influence_note, tie_nats

REPO = Path(__file__).resolve().parents[1]
SENTENCES = ["Ein Hund läuft über die Wiese.", "Eine Katze spielt mit einem Ball."]
VIEWS = ["step", "heatmap", "lines", "model", "interventions", "tree"]


def write_report(run, folder, *args: str) -> tuple[str, list[dict]]:
    """The HTML page's URL and the JSON records of the same command."""
    source = folder / "in.de"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    for name in ("report.html", "report.json"):
        assert (
            main(["attention", str(run), "-i", str(source), "-o", str(folder / name), *args]) == 0
        )
    lines = (folder / "report.json").read_text(encoding="utf-8").splitlines()
    return (folder / "report.html").as_uri(), [json.loads(line) for line in lines]


def page_data(page) -> dict:
    return page.evaluate("JSON.parse(document.getElementById('explorer-data').textContent)")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return explorer_run_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def report(run_dir, tmp_path_factory):
    return write_report(run_dir, tmp_path_factory.mktemp("report"), "--beam", "1")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def shown_row(page, table: str) -> tuple[int, list[float]]:
    """The highlighted row of a heatmap: its index and its cells' weights."""
    rows = page.eval_on_selector_all(
        f"{table} tr.current",
        "trs => trs.map(tr => [+tr.dataset.row, [...tr.querySelectorAll('td.w')].map(td => +td.dataset.w)])",
    )
    assert len(rows) == 1, rows
    return rows[0]


def test_keyboard_to_step_3_shows_the_jsons_row_top5_and_eos(report, browser):
    url, records = report
    page = open_page(browser, url)
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("body", "data-step") == "3"

    step = records[0]["steps"][2]
    assert page.inner_text("#step-token") == step["token"] == records[0]["tgt_tokens"][2]
    top = page.eval_on_selector_all(
        "#top5 li", "ls => ls.map(l => [l.dataset.token, +l.dataset.prob])"
    )
    assert [t for t, _ in top] == [t["token"] for t in step["top"]]
    assert [p for _, p in top] == pytest.approx([t["prob"] for t in step["top"]])
    assert page.inner_text("#p-eos") == f"{step['p_eos']:.4f}"
    assert float(page.get_attribute("#p-eos", "data-value")) == pytest.approx(step["p_eos"])

    row, weights = shown_row(page, "#step-map")
    mean = np.array(records[0]["weights"])[0].mean(axis=0)  # layer 1, head mean: (Tq, Tk)
    assert row == 2
    np.testing.assert_allclose(weights, mean[2], atol=1e-4)
    assert f"stopped at step {records[0]['stop_step']}" in page.inner_text("#stop-info")

    page.keyboard.press("ArrowLeft")
    assert page.get_attribute("body", "data-step") == "2" and shown_row(page, "#step-map")[0] == 1


def test_every_view_draws_keeps_the_caption_and_is_not_blank(report, browser, tmp_path):
    url, records = report
    page = open_page(browser, url)
    for view in VIEWS:
        page.click(f".tabs button[data-view={view}]")
        assert page.get_attribute("body", "data-view") == view
        assert [page.is_visible(f"#view-{v}") for v in VIEWS] == [v == view for v in VIEWS]
        assert page.is_visible("#caption") and page.inner_text("#caption") == CAPTION
        shot = tmp_path / f"{view}.png"
        page.locator("#views").screenshot(path=shot)
        assert not_blank(shot), view
    assert page.get_attribute("body", "data-status") == "ok"


def test_line_view_draws_each_weight_as_opacity_and_hover_shows_it(report, browser):
    url, records = report
    page = open_page(browser, url + "#view=lines&layer=2&head=3")
    lines = page.eval_on_selector_all(
        "#lines line",
        "ls => ls.map(l => [+l.dataset.i, +l.dataset.j, +l.getAttribute('stroke-opacity')])",
    )
    w = np.array(records[0]["weights"])[1, 2]  # layer 2, head 3: (Tq, Tk)
    assert len(lines) == int((np.round(w, 4) >= 0.005).sum())
    for i, j, opacity in lines:
        assert opacity == pytest.approx(w[i, j], abs=1e-4)

    i, j, _ = max(lines, key=lambda line: line[2])
    page.hover(f"#lines text >> nth={i}")  # a target token: only its lines stay
    shown = page.eval_on_selector_all(
        "#lines line", "ls => ls.filter(l => getComputedStyle(l).visibility === 'visible')"
        ".map(l => +l.dataset.i)",
    )  # fmt: skip
    assert shown and set(shown) == {i}
    page.dispatch_event(f"#lines line[data-i='{i}'][data-j='{j}']", "mousemove")
    tip = page.inner_text("#tooltip")
    src, tgt = records[0]["src_tokens"][j], records[0]["tgt_tokens"][i]
    assert f"source {j + 1}: {src}" in tip and f"target {i + 1}: {tgt}" in tip
    assert f"weight {w[i, j]:.4f}" in tip


def test_model_view_has_a_thumbnail_per_layer_and_head_and_a_click_opens_it(report, browser):
    url, _ = report
    page = open_page(browser, url + "#view=model")
    assert page.locator("#model-grid canvas").count() == N_LAYERS * (N_HEADS + 1)
    page.click("#model-grid figure[data-layer='2'][data-head='3']")
    assert page.get_attribute("body", "data-view") == "heatmap"
    assert page.get_attribute("body", "data-layer") == "2"
    assert page.get_attribute("body", "data-head") == "3"
    assert page.inner_text("#map-title").startswith("layer 2, head 3 \u2014")


def test_picking_the_second_sentence_shows_its_translation_and_steps(report, browser):
    url, records = report
    page = open_page(browser, url)
    assert page.is_visible("#sentence-select")
    page.keyboard.press("End")
    page.select_option("#sentence-select", "1")
    assert page.inner_text("#source") == SENTENCES[1]
    assert page.inner_text("#translation") == records[1]["translation"]
    assert page.get_attribute("body", "data-step") == "1"  # a new sentence starts at step 1
    shown = page.eval_on_selector_all("#top5 li", "ls => ls.map(l => l.dataset.token)")
    assert shown == [t["token"] for t in records[1]["steps"][0]["top"]]
    assert page.get_attribute("#step-slider", "max") == str(len(records[1]["steps"]))


def boxes(page, selector: str) -> list[dict]:
    return page.eval_on_selector_all(
        selector, "es => es.map(e => { const b = e.getBoundingClientRect(); "
        "return {x: b.x, y: b.y, w: b.width, h: b.height}; })",
    )  # fmt: skip


def overlap(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["w"] - 0.5 and b["x"] < a["x"] + a["w"] - 0.5
        and a["y"] < b["y"] + b["h"] - 0.5 and b["y"] < a["y"] + a["h"] - 0.5
    )  # fmt: skip


@pytest.mark.parametrize("width", [1200, 700])
def test_heatmap_cells_are_at_least_20px_and_labels_never_overlap(report, browser, width):
    url, records = report
    page = open_page(browser, url + "#view=heatmap", width=width)
    cells = boxes(page, "#heatmap td.w")
    tq, tk = len(records[0]["tgt_tokens"]), len(records[0]["src_tokens"])
    assert len(cells) == tq * tk
    assert min(c["w"] for c in cells) >= 20 and min(c["h"] for c in cells) >= 20
    for selector in ("#heatmap thead th.src span", "#heatmap th.tgt"):
        labels = boxes(page, selector)
        assert len(labels) in (tq, tk)
        assert not any(overlap(a, b) for k, a in enumerate(labels) for b in labels[k + 1 :])


def test_beam_report_lists_the_finished_hypotheses_with_their_scores(run_dir, browser, tmp_path):
    url, records = write_report(run_dir, tmp_path, "--beam", "3")
    page = open_page(browser, url)
    assert page.is_visible("#hypotheses-box")
    rows = page.eval_on_selector_all(
        "#hypotheses tr:not(:first-child)",
        "trs => trs.map(tr => [...tr.children].map(td => td.textContent))",
    )
    hyps = records[0]["hypotheses"]
    assert len(rows) == len(hyps) and hyps[0]["chosen"]
    assert [r[1] for r in rows] == [h["translation"] for h in hyps]
    assert [float(r[4]) for r in rows] == pytest.approx(
        [h["normalized_score"] for h in hyps], abs=1e-4
    )
    assert rows[0][0] == "chosen" and rows[0][1] == page.inner_text("#translation")


def test_word_level_page_says_how_it_merged_and_highlights_the_steps_word(
    run_dir, browser, tmp_path
):
    url, records = write_report(run_dir, tmp_path, "--beam", "1", "--words")
    page = open_page(browser, url)
    assert page.inner_text("#word-note") == WORDS_NOTE
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    row, weights = shown_row(page, "#step-map")
    assert row == records[0]["step_rows"][3]
    mean = np.array(records[0]["weights"])[0].mean(axis=0)
    np.testing.assert_allclose(weights, mean[row], atol=1e-4)
    np.testing.assert_allclose(mean.sum(-1), 1.0, atol=1e-4)
    assert page.inner_text("#step-token") == records[0]["steps"][3]["token"]  # steps stay subwords


def test_a_bad_hash_falls_back_with_a_note(report, browser):
    url, _ = report
    page = open_page(browser, url + "#layer=9&head=1&view=nope&sentence=7")
    assert page.get_attribute("body", "data-layer") == "1"
    assert page.get_attribute("body", "data-view") == "step"
    assert "No map for" in page.inner_text("#note")


HOSTILE = ["</script>", "<b>x</b>", "%STYLE%", "</s>"]  # must stay text, never markup


def hostile_record() -> dict:
    w = np.full((1, 2, 2, len(HOSTILE)), 1 / len(HOSTILE))
    step = {
        "step": 1,
        "token": "<i>",
        "prob": 0.5,
        "top": [{"token": "<i>", "prob": 0.5}],
        "p_eos": 0.1,
    }
    return {
        "source": "<img src=x>", "translation": "</script><b>", "decoding": "greedy search",
        "teacher_forced": False, "beam": 1, "ban_eos": False, "max_len": 2, "stop_reason": "max_len",
        "stop_step": 2, "notes": [], "src_tokens": HOSTILE, "tgt_tokens": ["<i>", "%DATA%"],
        "weights": w, "steps": [step, {**step, "step": 2}], "hypotheses": [], "word_level": None,
        "step_rows": None, "step_weights": None,
    }  # fmt: skip


def test_page_is_self_contained_and_tokens_stay_text(browser, tmp_path):
    page_text = render_page([hostile_record()], title="%SCRIPT% <t>")
    assert page_text.count("</script>") == 2  # the data block and the code; tokens are escaped
    assert CAPTION in page_text
    path = tmp_path / "hostile.html"
    path.write_text(page_text, encoding="utf-8")

    page = browser.new_page()
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri())
    assert page.get_attribute("body", "data-status") == "ok"
    assert requests == [path.as_uri()]  # nothing fetched: no network, no other file
    assert page.title() == "%SCRIPT% <t>"
    assert page.inner_text("#translation") == "</script><b>"
    assert page.inner_text("#step-map thead th.src span >> nth=0") == "</script>"


def test_template_ships_as_package_data():
    folder = resources.files("seq2seq.explorer").joinpath("templates")
    assert all(folder.joinpath(f"explorer.{ext}").is_file() for ext in ("html", "css", "js"))


def test_heatmap_toggles_to_influence_with_its_own_legend(report, browser):
    url, records = report
    page = open_page(browser, url + "#view=heatmap")
    assert page.get_attribute("body", "data-map") == "attention"
    assert "largest weight" in page.inner_text("#legend-text")
    page.click(".toggle button[data-map=influence]")
    assert page.get_attribute("body", "data-map") == "influence"
    assert "map=influence" in page.url  # a view that can be linked
    assert page.inner_text("#map-title").startswith("influence by occlusion, every layer at once")
    assert "largest drop in log-probability" in page.inner_text("#legend-text")
    note = records[0]["influence_note"]
    assert note == influence_note("this output", tie_nats(None))  # the run's fp32
    assert note in page.inner_text("#map-measures")  # what it measures, and not

    record = records[0]
    drops = np.array(record["influence"])  # (Tq, Tk)
    cells = page.eval_on_selector_all("#heatmap td.w", "tds => tds.map(td => +td.dataset.w)")
    np.testing.assert_allclose(cells, drops.ravel(), atol=1e-4)
    assert page.inner_text("#legend-max") == f"{max(drops.max(), 0):.3f}"  # the same scale rule
    rows = page.eval_on_selector_all(
        "#heatmap tbody tr", "trs => trs.map(tr => [...tr.querySelectorAll('td.num')]"
        ".map(td => td.textContent))",
    )  # fmt: skip
    src, chosen = record["src_tokens"], selected_agreement(record)  # layer 1, head mean
    shown = {True: "yes", False: "no", None: "tie"}
    assert rows == [
        [src[a], _tied_tokens(src, tied), shown[same]]
        for a, tied, same in zip(
            chosen["most_attended"], chosen["tied"], chosen["agree"], strict=True
        )
    ]  # a tie: the tied tokens, as the command's table shows them
    page.dispatch_event("#heatmap td.w >> nth=0", "mousemove")
    assert "drop (nats)" in page.inner_text("#tooltip")

    page.click(".toggle button[data-map=attention]")
    assert page.inner_text("#map-title").startswith("layer 1, head mean")


def selected_agreement(record: dict, layer: int = 1, head: int | None = None) -> dict:
    """``influence.agreement`` of the cross-attention map the selectors choose (layer from 1;
    head from 1, None: the mean), which the page's "most attended" follows."""
    w = np.array(record["weights"])[layer - 1]  # (H, Tq, Tk)
    attn = w.mean(axis=0) if head is None else w[head - 1]
    return agreement(attn, np.array(record["influence"]), record["tie_nats"])


def test_step_through_shows_whether_each_row_agrees(report, browser):
    url, records = report
    record = records[0]
    page = open_page(browser, url + "#view=step&step=4")
    src, row, chosen = record["src_tokens"], 3, selected_agreement(record)
    text = page.inner_text("#step-agreement")
    assert f"(layer 1, head mean): {src[chosen['most_attended'][row]]};" in text
    if chosen["agree"][row] is None:
        assert "a tie: drops within" in text
    else:
        assert f"most influential (occlusion): {src[record['most_influential'][row]]}" in text
        assert ("the same position" in text) == chosen["agree"][row]
    same = page.eval_on_selector_all(
        "#step-map tbody tr", "trs => trs.map(tr => tr.lastElementChild.textContent)"
    )
    assert same == [{True: "yes", False: "no", None: "tie"}[a] for a in chosen["agree"]]


def test_a_tied_row_says_it_is_a_tie(run_dir, tmp_path, browser, monkeypatch):
    """This fp32 model's map, judged with bf16's wider threshold, has near-ties: the step
    view labels them "tie" and says within how many nats the drops lie."""
    monkeypatch.setattr(records_module, "tie_nats", lambda dtype, device: TIE_NATS)
    url, records = write_report(run_dir, tmp_path, "--beam", "1")
    record = records[0]
    assert record["tie_nats"] == TIE_NATS and None in record["agree"]
    row = record["agree"].index(None)
    page = open_page(browser, url + f"#view=step&step={row + 1}")
    assert f"a tie: drops within {TIE_NATS} nats" in page.inner_text("#step-agreement")
    same = page.eval_on_selector_all(
        "#step-map tbody tr", "trs => trs.map(tr => tr.lastElementChild.textContent)"
    )
    assert same[row] == "tie"


def test_the_written_page_holds_its_interventions_and_says_which(run_dir, browser, tmp_path):
    url, records = write_report(run_dir, tmp_path, "--beam", "1", "--intervene", "mask:2")
    held = ["mask:2", *(s.text for s in page_interventions(N_LAYERS))]
    assert [c["spec"] for c in records[0]["interventions"]] == ["mask:2"]  # JSON: as asked
    data = page_data(open_page(browser, url))
    assert all([c["spec"] for c in r["interventions"]] == held for r in data["records"])

    page = open_page(browser, url + "#view=interventions")
    assert not page.is_visible("#intervene")  # nothing to ask: the page holds what it has
    note = page.inner_text("#interventions-note")
    assert ", ".join(held) in note and "seq2seq serve" in note
    shown = page.eval_on_selector_all(
        "#interventions tr[data-spec]", "trs => trs.map(tr => tr.dataset.spec)"
    )
    assert shown == held
    assert page.get_attribute("body", "data-spec") is None  # the first one shown
    assert page.inner_text("#result-spec").startswith("mask:2")

    page.select_option("#kind-select", "permuted")
    page.select_option("#where-select", "2")
    assert page.get_attribute("body", "data-spec") == "permuted:2"
    c = data["records"][0]["interventions"][held.index("permuted:2")]
    assert page.inner_text("#result-words") == " ".join(c["words"])
    assert page.inner_text("#original-words") == " ".join(c["original_words"])
    info = page.inner_text("#result-info")
    assert f"({c['length']} subwords, stop reason {c['stop_reason']})" in info
    removed = f"{sum(c['removed'])} of {len(c['original_words'])} of the original's changed"
    assert f"{sum(c['changed'])} of {len(c['words'])} words changed, {removed}" in info
    page.select_option("#kind-select", "kept")
    assert "Not on this page: kept:2" in page.inner_text("#intervention-status")
    page.click("#mask-words button >> nth=2")  # a word: hiding it is not held either
    status = page.inner_text("#intervention-status")
    assert "Not on this page: mask:3" in status
    assert f'seq2seq attention RUN "{SENTENCES[0]}" --intervene mask:3' in status  # how to get it
    assert "seq2seq serve RUN" in status
    assert not page.is_visible("#intervention-result")
    page.click("#interventions tr[data-spec='uniform:all']")
    assert page.get_attribute("body", "data-spec") == "uniform:all"
    assert page.is_visible("#intervention-result")


def test_the_summary_prints_the_interventions_asked_for_not_the_pages(run_dir, tmp_path, capsys):
    page = tmp_path / "page.html"
    assert (
        main(["attention", str(run_dir), SENTENCES[0], "--intervene", "kept", "-o", str(page)]) == 0
    )
    printed = capsys.readouterr().out
    assert "intervention kept (greedy)" in printed and "uniform:1" not in printed


def test_the_caption_is_the_first_thing_under_the_title(report, browser):
    url, _ = report
    page = open_page(browser, url)
    page.set_default_timeout(10_000)
    (caption,) = boxes(page, "#caption")
    (controls,) = boxes(page, "#explorer .controls")
    (title,) = boxes(page, "#page-title")
    assert page.inner_text("#caption") == CAPTION
    assert title["y"] < caption["y"] < controls["y"]  # above every selector and view
    assert caption["y"] + caption["h"] < 900 / 3  # in the first third of the first screen


def test_the_attention_selector_shows_self_attention_and_the_causal_mask(report, browser):
    url, records = report
    record = records[0]
    page = open_page(browser, url + "#view=heatmap")
    page.set_default_timeout(10_000)
    assert not page.is_visible("#masked-legend")
    page.select_option("#attention-select", "decoder")
    assert page.get_attribute("body", "data-kind") == "decoder" and "kind=decoder" in page.url
    assert page.inner_text("#map-title").startswith("decoder self-attention (masked), layer 1,")
    tq = len(record["decoder_tokens"])
    cells = page.eval_on_selector_all(
        "#heatmap td.w", "tds => tds.map(td => [td.classList.contains('masked'), "
        "td.style.background, +td.dataset.w])",
    )  # fmt: skip
    masked = np.triu(np.ones((tq, tq), dtype=bool), 1).ravel()
    assert [m for m, _, _ in cells] == masked.tolist()  # right of the diagonal, and only there
    assert all(not colour for m, colour, _ in cells if m)  # hatched, not coloured as 0
    mean = np.array(record["decoder_weights"])[0].mean(axis=0)  # layer 1, head mean
    np.testing.assert_allclose([w for _, _, w in cells], mean.ravel(), atol=1e-4)
    assert page.is_visible("#masked-legend") and "causal mask" in page.inner_text("#masked-legend")
    labels = page.eval_on_selector_all("#heatmap th.tgt", "ths => ths.map(th => th.textContent)")
    assert labels == record["decoder_tokens"]

    page.select_option("#attention-select", "encoder")
    n_enc = len(record["encoder_weights"])
    assert page.locator("#layer-select option").count() == n_enc  # the encoder's own layers
    assert not page.is_visible("#masked-legend")
    page.click(".tabs button[data-view=step]")  # the step-through stays cross-attention
    assert "cross-attention" in page.inner_text("#step-kind-note")
    assert shown_row(page, "#step-map")[0] == 0
    page.click(".tabs button[data-view=model]")
    assert page.locator("#model-grid canvas").count() == n_enc * (N_HEADS + 1)


def test_most_attended_follows_the_layer_and_head_chosen(report, browser):
    url, records = report
    record = records[0]
    page = open_page(browser, url + "#view=heatmap&map=influence&layer=2&head=1")
    page.set_default_timeout(10_000)
    header = page.inner_text("#heatmap thead")
    assert "most attended (layer 2, head 1)" in header
    attended = page.eval_on_selector_all(
        "#heatmap tbody tr", "trs => trs.map(tr => tr.querySelector('td.num').textContent)"
    )
    chosen = selected_agreement(record, layer=2, head=1)
    assert attended == [record["src_tokens"][j] for j in chosen["most_attended"]]
    assert "(cross-attention, layer 2, head 1)" in page.inner_text("#map-summary")


@pytest.fixture(scope="module")
def beam_report(run_dir, tmp_path_factory):
    return write_report(
        run_dir, tmp_path_factory.mktemp("beam"), "--beam", "4", "--no-interventions"
    )


def test_the_pages_length_penalty_is_the_searchs(beam_report):
    """The page re-ranks with the penalty's constants and each ending's step count as the
    tree gives them: that formula must be the search's, at its own alpha and at any other."""
    _, records = beam_report
    for record in records:
        tree = page_record(record)["tree"]
        base, scale = tree["penalty"]["base"], tree["penalty"]["scale"]
        for e in tree["endings"]:
            assert e["steps"] == len(e["tokens"])  # the EOS counted, as the search counts it
            for alpha in (-1.0, 0.0, 0.6, tree["alpha"], 2.5):
                page_penalty = ((base + e["steps"]) / scale) ** alpha
                assert page_penalty == pytest.approx(gnmt_length_penalty(e["steps"], alpha))
            assert e["score"] / ((base + e["steps"]) / scale) ** tree["alpha"] == pytest.approx(
                e["normalized"], abs=2e-4
            )
        returned = [e for e in tree["endings"] if e["returned"]]
        assert [e["translation"] for e in returned] == [
            h["translation"] for h in record["hypotheses"]
        ]
        assert [e["normalized"] for e in returned] == pytest.approx(
            [h["normalized_score"] for h in record["hypotheses"]], abs=1e-4
        )


def slide_to(page, alpha: float) -> list[list[str]]:
    """Move the length-penalty slider as a user does (an input event); the ranked table."""
    page.eval_on_selector(
        "#alpha-slider", "(e, v) => { e.value = v; e.dispatchEvent(new Event('input')); }", alpha
    )
    return page.eval_on_selector_all(
        "#endings tr:not(:first-child)",
        "trs => trs.map(tr => [...tr.children].map(td => td.textContent))",
    )


def test_the_tree_draws_every_node_by_its_fate_and_the_slider_re_ranks(beam_report, browser):
    url, records = beam_report
    page = open_page(browser, url + "#view=tree")
    tree = page_data(page)["records"][0]["tree"]
    fates = page.eval_on_selector_all("#tree g.node", "gs => gs.map(g => g.dataset.fate)")
    assert sorted(fates) == sorted(n["fate"] for n in tree["nodes"])
    assert {"kept", "width", "eos"} <= set(fates)
    # The search's own alpha: its ranking, its normalized scores, its choice first.
    rows = slide_to(page, tree["alpha"])
    assert rows[0][8] == "chosen" and rows[0][1] == page.inner_text("#translation")
    assert [float(r[5]) for r in rows] == pytest.approx([float(r[6]) for r in rows], abs=2e-4)
    orders = {}
    for alpha in (-1.0, 0.0, 3.0):
        rows = slide_to(page, alpha)
        expected = sorted(
            tree["endings"], key=lambda e: -e["score"] / gnmt_length_penalty(e["steps"], alpha)
        )
        assert [r[1] for r in rows] == [e["translation"] for e in expected]
        assert page.get_attribute("body", "data-alpha") == f"{alpha:g}"
        orders[alpha] = tuple(r[1] for r in rows)
        why = page.inner_text("#ranking-why")
        assert why.startswith("At") if rows[0][8] == "chosen" else "wins at" in why
    assert len(set(orders.values())) > 1  # the penalty did re-rank what ended
    # A click on a node shows its numbers and the attention row that scored it.
    node = next(n for n in tree["nodes"] if n["fate"] == "width")
    page.click(f"#tree g.node[data-node='{node['id']}']")
    assert page.get_attribute("body", "data-node") == str(node["id"])
    assert f"{node['logp']:.4f}" in page.inner_text("#node-info")
    bars = page.eval_on_selector_all(
        "#node-row span:nth-child(3n)", "s => s.map(x => +x.textContent)"
    )
    parent = tree["nodes"][node["parent"]]
    assert bars == pytest.approx(parent["attention"][0], abs=1e-3)
    assert "--reference" in page.inner_text("#node-influence-title")  # not on the chosen path
