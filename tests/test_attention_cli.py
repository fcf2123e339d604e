"""``seq2seq attention`` end to end on a tiny 2+2-layer model trained here: PNG, SVG, HTML
and JSON outputs, greedy and beam search, teacher forcing, the grid, the per-step
distributions, many sentences, word level, and bad input."""

import json
import math

import numpy as np
import pytest
import torch
from helpers import eos_probs_as_searched
from test_plotting import expected_pixels, png_size

from seq2seq.commands.cli import main
from seq2seq.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig
from seq2seq.decoding.load import load_run
from seq2seq.decoding.search import beam_search, greedy_search, max_output_length
from seq2seq.decoding.translate import Translator
from seq2seq.drawing.plotting import CAPTION, figure_size
from seq2seq.drawing.words import WORDS_NOTE
from seq2seq.explorer.report import (
    MAX_PAGE_SENTENCES,
    attention_report,
    format_summary,
    selected_maps,
)
from seq2seq.inspect.influence import (
    influence_note,
    occlude,
    tie_nats,
    tied_columns,
)
from seq2seq.inspect.records import TEACHER_FORCED
from seq2seq.training.entry import train
from seq2seq.vocab import EOS_ID

SENTENCE = "Ein Hund läuft über die Wiese."
REFERENCE = "A dog runs across the meadow."
N_LAYERS, N_HEADS = 2, 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("attention") / "run"
    config = Config(
        model=ModelConfig(
            d_model=32, n_heads=N_HEADS, d_ff=64, n_enc_layers=N_LAYERS, n_dec_layers=N_LAYERS,
            dropout=0.0, max_positions=64,
        ),
        data=DataConfig(data="sample", vocab_size=200, max_len=30),
        train=TrainConfig(
            max_steps=60, validate_every=30, warmup_steps=10, attention_sentences=0, threads=1,
            precision="fp32", device="cpu", early_dropout=None,
        ),
    )  # fmt: skip
    train(config, run, overwrite=True, progress=False)
    return run


def run_json(run_dir, tmp_path, *args: str) -> dict:
    path = tmp_path / "attn.json"
    assert main(["attention", str(run_dir), SENTENCE, "-o", str(path), *args]) == 0
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1  # one record per sentence, one per line
    return json.loads(lines[0])


def detokenize(pieces: list[str]) -> str:
    return "".join(p for p in pieces if p != "</s>").replace("\u2581", " ").strip()


def source(run_dir):
    _, tokenizer, model = load_run(run_dir)
    return model, torch.tensor([tokenizer.encode(SENTENCE, "src") + [EOS_ID]])  # (1, S)


def model_search(run_dir, beam: int):
    """The search's own best hypothesis for SENTENCE, to compare the command against."""
    model, src = source(run_dir)
    if beam == 1:
        return greedy_search(model, src, need_weights=True)[0]
    return beam_search(model, src, DecodeConfig(beam=beam), need_weights=True)[0][0]


@pytest.mark.parametrize("beam", [1, 3])
def test_json_holds_the_produced_outputs_attention(run_dir, tmp_path, capsys, beam):
    record = run_json(run_dir, tmp_path, "--beam", str(beam))
    stdout = capsys.readouterr().out

    weights = np.array(record["weights"])
    n_tq, n_tk = len(record["tgt_tokens"]), len(record["src_tokens"])
    assert record["shape"] == [N_LAYERS, N_HEADS, n_tq, n_tk] == list(weights.shape)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert record["src_tokens"][-1] == "</s>"
    assert detokenize(record["tgt_tokens"]) == record["translation"]
    assert f"translation: {record['translation']}\n" in stdout
    assert (record["tgt_tokens"][-1] == "</s>") == (record["stop_reason"] == "eos")
    assert ("greedy" if beam == 1 else "beam") in record["decoding"]

    hyp = model_search(run_dir, beam)  # the chosen hypothesis, traced through the beam
    assert len(hyp.attention[0, 0]) == n_tq
    np.testing.assert_allclose(weights, hyp.attention.numpy(), atol=1e-6)


def test_png_default_is_the_head_mean_of_every_layer(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["attention", str(run_dir), SENTENCE]) == 0
    record = attention_report(run_dir, SENTENCE, fmt="json", out=tmp_path / "r.json")["records"][0]
    n_tq, n_tk = record["shape"][2:]
    assert png_size(tmp_path / "attention.png") == expected_pixels(1, N_LAYERS, n_tq, n_tk, 100)
    stdout = capsys.readouterr().out
    assert "layer 1, head mean" in stdout and "layer 2, head mean" in stdout
    assert stdout.count("  mean  ") == N_LAYERS  # a mean line closes each table
    maps = selected_maps(record)
    assert [m["head"] for m in maps] == ["mean"] * N_LAYERS
    for m in maps:
        assert len(m["row_entropy"]) == n_tq
        assert all(0 <= e <= math.log2(n_tk) + 1e-9 for e in m["row_entropy"])


@pytest.mark.parametrize(
    ("args", "grid"),
    [
        (["--layer", "all", "--head", "all"], (N_LAYERS, N_HEADS + 1)),
        (["--layer", "2", "--head", "3"], (1, 1)),
    ],
)
def test_png_layer_and_head_selection(run_dir, tmp_path, args, grid):
    path = tmp_path / "attn.png"
    report = attention_report(run_dir, SENTENCE, fmt="json", out=tmp_path / "r.json")
    assert main(["attention", str(run_dir), SENTENCE, "-o", str(path), *args]) == 0
    assert png_size(path) == expected_pixels(*grid, *report["records"][0]["shape"][2:], 100)


def test_svg_from_the_suffix(run_dir, tmp_path):
    path = tmp_path / "attn.svg"
    report = attention_report(run_dir, SENTENCE, layer=1, out=path)
    assert report["format"] == "svg"
    width, height = figure_size(1, 1, *report["records"][0]["shape"][2:])
    text = path.read_text()
    assert f'width="{width * 72:g}pt"' in text and f'height="{height * 72:g}pt"' in text


def test_reference_is_teacher_forced(run_dir, tmp_path):
    record = run_json(run_dir, tmp_path, "--reference", REFERENCE)
    _, tokenizer, _ = load_run(run_dir)
    n_ref = len(tokenizer.encode(REFERENCE, "tgt"))
    assert record["shape"][2] == n_ref + 1 == len(record["tgt_tokens"])
    assert record["decoding"] == TEACHER_FORCED
    assert record["teacher_forced"] is True and record["max_len"] is None
    assert record["translation"] == tokenizer.normalize(REFERENCE, "tgt")
    assert "teacher-forced on the given reference" in record["influence_note"]
    assert "this output" not in record["influence_note"]


def test_influence_and_the_pages_interventions_can_be_skipped(run_dir, tmp_path):
    record = run_json(run_dir, tmp_path, "--no-influence")
    assert record["influence"] is None and record["agree"] is None
    report = attention_report(run_dir, SENTENCE, fmt="html", out=tmp_path / "a.html",
                              influence=False, with_page_interventions=False)  # fmt: skip
    assert report["records"][0]["interventions"] == []
    assert main(["attention", str(run_dir), SENTENCE, "--no-interventions", "--intervene",
                 "kept", "-o", str(tmp_path / "b.html")]) == 0  # fmt: skip


def test_html_page(run_dir, tmp_path):
    path = tmp_path / "page.html"
    assert (
        main(["attention", str(run_dir), SENTENCE, "-o", str(path), "--reference", REFERENCE]) == 0
    )
    page = path.read_text(encoding="utf-8")
    assert CAPTION in page and TEACHER_FORCED in page and '"n_heads": 4' in page
    assert "<script>" in page and "%DATA%" not in page  # the template, filled


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Input files for the bad-input cases, outside the folder those check stays empty."""
    folder = tmp_path_factory.mktemp("inputs")
    files = {"IN": [SENTENCE, "Zwei Hunde."], "ONE": [REFERENCE], "GAP": [SENTENCE, "", "x"],
             "MANY": ["x"] * (MAX_PAGE_SENTENCES + 1),
             "DROPPED": [SENTENCE, "\x01\x7f"]}  # fmt: skip
    for name, lines in files.items():
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {name: folder / name for name in files}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such/run", SENTENCE], "no such run directory"),
        (["RUN", "   "], "the sentence is empty"),
        (["RUN", SENTENCE, "--layer", "3"], "--layer 3: the decoder has layers 1..2"),
        (["RUN", SENTENCE, "--layer", "0"], "--layer 0: the decoder has layers 1..2"),
        (["RUN", SENTENCE, "--head", "5"], "--head 5: the decoder has heads 1..4"),
        (["RUN", SENTENCE, "--kind", "encoder", "--layer", "3"], "the encoder has layers 1..2"),
        (["RUN", "  ", "--kind", "decoder"], "the sentence is empty"),
        (["RUN", SENTENCE, "--reference", ""], "--reference is empty"),
        (["RUN", SENTENCE, "-o", "attn.pdf"], "unknown format 'pdf'"),
        (["RUN", SENTENCE, "--max-len", "0"], "--max-len must be at least 1"),
        (["RUN"], "give one SENTENCE or -i FILE"),
        (["RUN", SENTENCE, "-i", "IN"], "give one SENTENCE or -i FILE"),
        (["RUN", "-i", "IN", "-o", "a.png"], "PNG draws one sentence"),
        (["RUN", "-i", "IN", "--reference", "x", "-o", "a.html"], "--reference goes with SENTENCE"),
        (["RUN", SENTENCE, "--reference-file", "ONE"], "--reference-file goes with -i FILE"),
        (["RUN", "-i", "GAP", "-o", "a.json"], "line 2 is empty"),
        (["RUN", "\u200b"], "the sentence has no subwords: the tokenizer drops each of its"),
        (["RUN", "\ufeff", "--no-influence"], "the sentence has no subwords"),
        (["RUN", "-i", "DROPPED", "-o", "a.json"], "sentence 2 has no subwords"),
        (["RUN", "-i", "IN", "--reference-file", "ONE", "-o", "a.json"], "1 references for 2"),
        (["RUN", "-i", "/no/such/file", "-o", "a.json"], "-i /no/such/file: No such file"),
        (["RUN", "-i", "MANY", "-o", "a.html"], f"at most {MAX_PAGE_SENTENCES}"),
        (["RUN", SENTENCE, "--intervene", "flat"], "--intervene flat: unknown kind 'flat'"),
        (["RUN", SENTENCE, "--intervene", "uniform:3"], "the decoder has layers 1..2"),
        (["RUN", SENTENCE, "--intervene", "mask"], "name the source position to hide"),
        (["RUN", SENTENCE, "--intervene", "mask:99"], "--intervene mask:99: the source has"),
        (["RUN", SENTENCE, "--intervene", "mask:\u00b2"], "name the source position to hide"),
        (["RUN", SENTENCE, "--intervene", "uniform:\u00b2"], "the decoder has layers 1..2"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    run_dir, inputs, tmp_path, monkeypatch, capsys, args, message
):
    monkeypatch.chdir(tmp_path)
    names = {"RUN": str(run_dir), **{name: str(path) for name, path in inputs.items()}}
    assert main(["attention", *[names.get(a, a) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert list(tmp_path.iterdir()) == []


def test_attention_report_takes_a_translator(run_dir, tmp_path):
    translator = Translator.from_run(run_dir)
    report = attention_report(translator, SENTENCE, head="all", fmt="png", out=tmp_path / "g.png")
    maps = selected_maps(report["records"][0], head="all")
    assert [(m["layer"], m["head"]) for m in maps][: N_HEADS + 1] == [
        (1, "1"), (1, "2"), (1, "3"), (1, "4"), (1, "mean")
    ]  # fmt: skip


def test_steps_are_the_distributions_greedy_search_saw(run_dir, tmp_path):
    record = run_json(run_dir, tmp_path, "--beam", "1")
    steps = record["steps"]
    assert [s["step"] for s in steps] == list(range(1, record["stop_step"] + 1))
    assert [s["token"] for s in steps] == record["tgt_tokens"]
    model, src = source(run_dir)
    searched = greedy_search(model, src)[0]
    ids = searched.tokens + [EOS_ID] if searched.stop_reason == "eos" else searched.tokens
    # The teacher-forced pass over the output gives the P(EOS) the search saw at each step.
    assert [s["p_eos"] for s in steps] == pytest.approx(
        eos_probs_as_searched(model, src, ids), abs=1e-5
    )
    for s in steps:
        probs = [t["prob"] for t in s["top"]]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
        assert s["top"][0]["token"] == s["token"] and s["top"][0]["prob"] == s["prob"]
    limit = max_output_length(len(record["src_tokens"]), 1.5, 10, 64)  # the run's decode rule
    assert record["max_len"] == limit and record["stop_step"] <= limit
    assert record["stop_reason"] == ("eos" if record["tgt_tokens"][-1] == "</s>" else "max_len")


def test_ban_eos_runs_to_the_given_max_len(run_dir, tmp_path, capsys):
    record = run_json(run_dir, tmp_path, "--beam", "1", "--ban-eos", "--max-len", "7")
    assert record["stop_reason"] == "max_len" and record["max_len"] == 7 == record["stop_step"]
    assert len(record["steps"]) == len(record["tgt_tokens"]) == 7 and record["ban_eos"] is True
    assert "stop reason: max_len at step 7 (max_len 7)" in capsys.readouterr().out


def test_beam_lists_the_finished_hypotheses_with_their_scores(run_dir, tmp_path):
    record = run_json(run_dir, tmp_path, "--beam", "3")
    model, src = source(run_dir)
    finished = beam_search(model, src, DecodeConfig(beam=3, nbest=3))[0]
    hyps = record["hypotheses"]
    assert [h["chosen"] for h in hyps] == [True] + [False] * (len(hyps) - 1)
    assert [h["length"] for h in hyps] == [len(h.tokens) for h in finished]
    assert [h["normalized_score"] for h in hyps] == pytest.approx(
        [h.normalized_score for h in finished], abs=1e-5
    )
    assert hyps[0]["translation"] == record["translation"]


def test_many_sentences_with_references_are_one_record_per_line(run_dir, tmp_path, capsys):
    sources, references = tmp_path / "src.txt", tmp_path / "ref.txt"
    sources.write_text(f"{SENTENCE}\nZwei Hunde.\n", encoding="utf-8")
    references.write_text(f"{REFERENCE}\nTwo dogs.\n", encoding="utf-8")
    out = tmp_path / "many.json"
    args = ["-i", str(sources), "--reference-file", str(references), "-o", str(out)]
    assert main(["attention", str(run_dir), *args]) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["source"] for r in records] == [SENTENCE, "Zwei Hunde."]
    assert [r["reference"] for r in records] == [REFERENCE, "Two dogs."]
    assert all(r["decoding"] == TEACHER_FORCED for r in records)
    stdout = capsys.readouterr().out
    assert "[2] translation: Two dogs." in stdout and "layer 1, head mean" not in stdout


def test_words_merge_the_json_maps(run_dir, tmp_path):
    subwords = run_json(run_dir, tmp_path, "--beam", "1")
    record = run_json(run_dir, tmp_path, "--beam", "1", "--words")
    assert record["word_level"] == WORDS_NOTE
    assert detokenize(record["src_tokens"]) == detokenize(subwords["src_tokens"]).replace(" ", "")
    weights = np.array(record["weights"])
    assert list(weights.shape) == record["shape"][:2] + [
        len(record["tgt_tokens"]), len(record["src_tokens"])
    ]  # fmt: skip
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert len(record["step_rows"]) == len(record["steps"]) == len(subwords["tgt_tokens"])


def test_options_may_sit_between_the_positionals(run_dir, tmp_path):
    out = tmp_path / "mixed.json"
    assert main(["attention", str(run_dir), "--beam", "1", SENTENCE, "-o", str(out)]) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["source"] == SENTENCE


def test_words_png_says_how_it_merged_under_the_caption(run_dir, tmp_path):
    path = tmp_path / "words.png"
    report = attention_report(run_dir, SENTENCE, beam=1, words=True, out=path)
    record = report["records"][0]
    assert record["word_level"] == WORDS_NOTE
    width, height = figure_size(1, N_LAYERS, *record["shape"][2:], note=True)
    assert png_size(path) == (math.floor(width * 100), math.floor(height * 100))


def test_json_holds_the_influence_map_beside_the_attention(run_dir, tmp_path, capsys):
    record = run_json(run_dir, tmp_path, "--beam", "1")
    stdout = capsys.readouterr().out
    n_tq, n_tk = len(record["tgt_tokens"]), len(record["src_tokens"])
    influence = np.array(record["influence"])
    tie = tie_nats(Translator.from_run(run_dir).dtype)  # of the precision the map ran in
    assert influence.shape == (n_tq, n_tk)
    assert record["influence_note"] == influence_note("this output", tie)
    model, src = source(run_dir)
    tgt_ids = model_search(run_dir, 1).tokens + [EOS_ID] * (record["stop_reason"] == "eos")
    expected = occlude(model, src, tgt_ids).influence.numpy()
    np.testing.assert_allclose(influence, expected, atol=1e-5)
    mean = np.array(record["weights"]).mean(axis=(0, 1))  # (Tq, Tk)
    assert record["most_attended"] == mean.argmax(-1).tolist()
    assert record["most_influential"] == expected.argmax(-1).tolist()
    tied = tied_columns(expected, tie)
    assert record["tied"] == tied and record["tie_nats"] == tie
    pairs = zip(record["most_attended"], record["most_influential"], tied, strict=True)
    assert record["agree"] == [a == b if len(t) == 1 else None for a, b, t in pairs]
    # The table: each map's most-attended source token beside the most influential one, or
    # "tie"; the mean line counts agreement over the rows that are not ties.
    assert "  attended  " in stdout and "  influential" in stdout
    first = f"  {1:>3}  {record['tgt_tokens'][0]}"  # rows numbered from 1
    row = next(line for line in stdout.splitlines() if line.startswith(first))
    if len(tied[0]) == 1:
        assert row.split()[-2] == record["src_tokens"][record["most_influential"][0]]
    else:
        assert row.split()[-1] == "tie"
    decisive = sum(len(t) == 1 for t in tied)
    assert f"same: of the {decisive} rows whose most influential token leads" in stdout
    assert f"/{decisive}\n" in stdout


def test_words_influence_hides_whole_source_words(run_dir, tmp_path):
    record = run_json(run_dir, tmp_path, "--beam", "1", "--words")
    influence = np.array(record["influence"])
    assert influence.shape == (len(record["tgt_tokens"]), len(record["src_tokens"]))
    assert len(record["agree"]) == len(record["tgt_tokens"])


def test_interventions_decode_again_beside_the_original(run_dir, tmp_path, capsys):
    record = run_json(
        run_dir, tmp_path, "--intervene", "kept", "--intervene", "uniform:2",
        "--intervene", "mask:1",
    )  # fmt: skip
    stdout = capsys.readouterr().out
    kept, uniform, mask = record["interventions"]
    assert [c["spec"] for c in record["interventions"]] == ["kept", "uniform:2", "mask:1"]
    greedy = model_search(run_dir, 1)
    for c in (kept, uniform, mask):
        assert c["original_length"] == len(greedy.tokens) and c["decoding"] == "greedy search"
        assert len(c["words"]) == len(c["changed"]) and len(c["original_words"]) == len(
            c["removed"]
        )
        assert c["stop_reason"] in ("eos", "max_len")
    assert kept["translation"] == kept["original"] and not any(kept["changed"])
    assert (kept["layer"], uniform["layer"], mask["layer"]) == (None, 2, None)
    assert mask["masked"] == 1 and mask["masked_token"] == record["src_tokens"][0]
    assert "intervention kept (greedy): " in stdout
    assert f"0 of {len(kept['words'])} words changed" in stdout


def test_the_summary_counts_the_words_an_intervention_removed():
    """A truncated output changes none of its own words: what it lost is counted too."""
    cut = {"spec": "mask:1", "words": ["A", "dog"], "changed": [False, False], "length": 2,
           "original_words": ["A", "dog", "runs", "."], "removed": [False, False, True, True],
           "stop_reason": "max_len", "original_length": 4, "original_stop_reason": "eos"}  # fmt: skip
    record = {"translation": "A dog runs.", "max_len": 9, "decoding": "greedy search",
              "stop_reason": "eos", "stop_step": 5, "interventions": [cut]}  # fmt: skip
    report = {"records": [record, record], "interventions": ["mask:1"], "path": "x.json"}
    summary = format_summary(report)
    assert "0 of 2 words changed ([marked]), 2 of 4 of the original's changed or removed" in summary


def test_kind_decoder_draws_the_masked_self_attention_rows_numbered_from_1(
    run_dir, tmp_path, capsys
):
    record = run_json(run_dir, tmp_path, "--beam", "1")
    capsys.readouterr()
    path = tmp_path / "decoder.png"
    args = ["--kind", "decoder", "--layer", "2", "--head", "1", "--beam", "1", "-o", str(path)]
    assert main(["attention", str(run_dir), SENTENCE, *args]) == 0
    inputs = record["decoder_tokens"]
    assert inputs == ["<s>", *record["tgt_tokens"][:-1]]  # BOS, then the output before each step
    width, height = figure_size(1, 1, len(inputs), len(inputs), causal=True)
    assert png_size(path) == (math.floor(width * 100), math.floor(height * 100))
    table = capsys.readouterr().out.splitlines()
    start = table.index("decoder self-attention (masked), layer 2, head 1")
    rows = [line.split()[:2] for line in table[start + 2 : start + 2 + len(inputs)]]
    assert rows == [[str(n), t] for n, t in enumerate(inputs, start=1)]  # as steps and mask:N


def test_json_holds_the_encoders_and_the_decoders_self_attention(run_dir, tmp_path):
    for words in ([], ["--words"]):
        record = run_json(run_dir, tmp_path, "--beam", "2", *words)
        tk, tq = len(record["src_tokens"]), len(record["decoder_tokens"])
        assert tq == len(record["tgt_tokens"])  # a row per step, a word per word
        encoder, decoder = np.array(record["encoder_weights"]), np.array(record["decoder_weights"])
        assert encoder.shape == (N_LAYERS, N_HEADS, tk, tk)
        assert decoder.shape == (N_LAYERS, N_HEADS, tq, tq)
        for w in (encoder, decoder):
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-4)
        later = np.triu(np.ones((tq, tq), dtype=bool), 1)
        assert (decoder[..., later] == 0).all()  # never read: the causal mask
        assert (decoder[..., ~later] > 0).all()  # every earlier position is read a little
