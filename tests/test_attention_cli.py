"""``seq2seq attention`` end to end on a tiny 2+2-layer model trained here: PNG, SVG, HTML
and JSON outputs, greedy and beam search, teacher forcing, the grid, and bad input."""

import json
import math

import numpy as np
import pytest
from test_plotting import expected_pixels, png_size

from seq2seq.attention_report import TEACHER_FORCED, attention_report
from seq2seq.checkpoint import load_run
from seq2seq.cli import main
from seq2seq.config import Config, DataConfig, ModelConfig, TrainConfig
from seq2seq.data import collate
from seq2seq.plotting import CAPTION, figure_size
from seq2seq.search import beam_search, greedy_search
from seq2seq.train import train

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
            precision="fp32", device="cpu",
        ),
    )  # fmt: skip
    train(config, run, overwrite=True, progress=False)
    return run


def run_json(run_dir, tmp_path, *args: str) -> dict:
    path = tmp_path / "attn.json"
    assert main(["attention", str(run_dir), SENTENCE, "-o", str(path), *args]) == 0
    return json.loads(path.read_text(encoding="utf-8"))


def detokenize(pieces: list[str]) -> str:
    return "".join(p for p in pieces if p != "</s>").replace("\u2581", " ").strip()


def model_search(run_dir, beam: int):
    """The search's own best hypothesis for SENTENCE, to compare the command against."""
    _, tokenizer, model = load_run(run_dir)
    src = collate([tokenizer.encode(SENTENCE, "src")], None).src
    if beam == 1:
        return greedy_search(model, src, need_weights=True)[0]
    return beam_search(model, src, beam=beam, need_weights=True)[0][0]


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
    assert ("greedy" if beam == 1 else "beam") in record["metadata"]["decoding"]

    hyp = model_search(run_dir, beam)  # the chosen hypothesis, traced through the beam
    assert len(hyp.attention[0, 0]) == n_tq
    np.testing.assert_allclose(weights, hyp.attention.numpy(), atol=1e-6)


def test_png_default_is_the_head_mean_of_every_layer(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["attention", str(run_dir), SENTENCE]) == 0
    report = attention_report(run_dir, SENTENCE, fmt="json", out=tmp_path / "r.json")
    n_tq, n_tk = report["shape"][2:]
    assert png_size(tmp_path / "attention.png") == expected_pixels(1, N_LAYERS, n_tq, n_tk, 100)
    stdout = capsys.readouterr().out
    assert "layer 1, head mean" in stdout and "layer 2, head mean" in stdout
    assert stdout.count("  mean  ") == N_LAYERS  # a mean line closes each table
    assert [m["head"] for m in report["maps"]] == ["mean"] * N_LAYERS
    for m in report["maps"]:
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
    assert png_size(path) == expected_pixels(*grid, *report["shape"][2:], 100)


def test_svg_from_the_suffix(run_dir, tmp_path):
    path = tmp_path / "attn.svg"
    report = attention_report(run_dir, SENTENCE, layer=1, out=path)
    assert report["format"] == "svg"
    width, height = figure_size(1, 1, *report["shape"][2:])
    text = path.read_text()
    assert f'width="{width * 72:g}pt"' in text and f'height="{height * 72:g}pt"' in text


def test_reference_is_teacher_forced(run_dir, tmp_path):
    record = run_json(run_dir, tmp_path, "--reference", REFERENCE)
    _, tokenizer, _ = load_run(run_dir)
    n_ref = len(tokenizer.encode(REFERENCE, "tgt"))
    assert record["shape"][2] == n_ref + 1 == len(record["tgt_tokens"])
    assert record["metadata"]["decoding"] == TEACHER_FORCED
    assert record["metadata"]["teacher_forced"] is True
    assert record["translation"] == tokenizer.normalize(REFERENCE, "tgt")


def test_html_page(run_dir, tmp_path):
    path = tmp_path / "page.html"
    assert (
        main(["attention", str(run_dir), SENTENCE, "-o", str(path), "--reference", REFERENCE]) == 0
    )
    page = path.read_text(encoding="utf-8")
    assert CAPTION in page and TEACHER_FORCED in page and '"n_heads": 4' in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such/run", SENTENCE], "no such run directory"),
        (["RUN", "   "], "the sentence is empty"),
        (["RUN", SENTENCE, "--layer", "3"], "--layer 3: the decoder has layers 1..2"),
        (["RUN", SENTENCE, "--layer", "0"], "--layer 0: the decoder has layers 1..2"),
        (["RUN", SENTENCE, "--head", "5"], "--head 5: the decoder has heads 1..4"),
        (["RUN", SENTENCE, "--reference", ""], "--reference is empty"),
        (["RUN", SENTENCE, "-o", "attn.pdf"], "unknown format 'pdf'"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    run_dir, tmp_path, monkeypatch, capsys, args, message
):
    monkeypatch.chdir(tmp_path)
    args = [str(run_dir) if a == "RUN" else a for a in args]
    assert main(["attention", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert list(tmp_path.iterdir()) == []


def test_attention_report_takes_a_translator(run_dir, tmp_path):
    from seq2seq.translate import Translator

    translator = Translator.from_run(run_dir)
    report = attention_report(translator, SENTENCE, head="all", fmt="png", out=tmp_path / "g.png")
    assert [(m["layer"], m["head"]) for m in report["maps"]][:N_HEADS + 1] == [
        (1, "1"), (1, "2"), (1, "3"), (1, "4"), (1, "mean")
    ]  # fmt: skip
