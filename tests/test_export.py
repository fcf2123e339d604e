"""CTranslate2 export: the exported model decodes as ours does (greedy on every sentence, beam 4
on >= 95%), keeps our stop rule, loads through ``translate --engine ctranslate2``; GQA, MQA
and MLA models, a non-empty output directory and a run given to the wrong engine are
one-line errors."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
from helpers import train_sample_run

from seq2seq.commands.cli import main
from seq2seq.config import Config, DecodeConfig, ModelConfig
from seq2seq.decoding.translate import Translator
from seq2seq.run.checkpoint import load_config_file, save_config

needs_ctranslate2 = pytest.mark.skipif(
    importlib.util.find_spec("ctranslate2") is None,
    reason='ctranslate2 is not installed (pip install -e ".[ctranslate2]")',
)
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def _sentences() -> list[str]:
    return [
        line
        for name in ("train.de", "valid.de", "test.de")
        for line in (SAMPLE / name).read_text(encoding="utf-8").splitlines()
    ]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny model trained long enough on data/sample to stop at EOS as well as at max_len."""
    run = tmp_path_factory.mktemp("export") / "run"
    return train_sample_run(
        run,
        steps=200,
        validate_every=200,
        lr=3e-3,
        dropout=0.1,
        max_positions=128,
        max_len=100,
        max_epochs=1000,
    )


@pytest.fixture(scope="module")
def export_dir(run_dir) -> Path:
    out = run_dir.parent / "ct2"
    if importlib.util.find_spec("ctranslate2") is not None:
        assert main(["export", str(run_dir), "-o", str(out), "--format", "ctranslate2"]) == 0
    return out


def _engines(run_dir: Path, export_dir: Path):
    from seq2seq.decoding.export import CTranslate2Translator

    return Translator.from_run(run_dir), CTranslate2Translator.from_export(export_dir, threads=1)


@needs_ctranslate2
def test_float32_greedy_equals_ours_on_every_sentence(run_dir, export_dir):
    ours, ct2 = _engines(run_dir, export_dir)
    lines = _sentences()
    expected = ours.translate(lines, DecodeConfig(beam=1))
    got = ct2.translate(lines, DecodeConfig(beam=1))
    stops = {hyps[0].stop_reason for hyps in expected}
    assert stops == {"eos", "max_len"}  # both ends of the stop rule are exercised
    for line, mine, theirs in zip(lines, expected, got, strict=True):
        assert theirs[0].tokens == mine[0].tokens, line
        assert theirs[0].text == mine[0].text
        assert theirs[0].stop_reason == mine[0].stop_reason
        # CTranslate2 renormalizes over the tokens that may be output (not PAD, BOS).
        assert theirs[0].score == pytest.approx(mine[0].score, rel=0.02)


@needs_ctranslate2
def test_float32_beam4_agrees_on_95_percent(run_dir, export_dir):
    ours, ct2 = _engines(run_dir, export_dir)
    lines = _sentences()
    decode = DecodeConfig(beam=4, nbest=2)
    expected = ours.translate(lines, decode)
    got = ct2.translate(lines, decode)
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(expected, got, strict=True))
    assert same >= math.ceil(0.95 * len(lines))
    assert all(len(hyps) == 2 for hyps in got)
    for hyps in got:  # best first, by the GNMT-normalized score
        assert hyps[0].normalized_score >= hyps[1].normalized_score


@needs_ctranslate2
def test_stop_rule_is_per_sentence_max_len(run_dir, export_dir):
    """With EOS banned every output runs to floor(a * S + b), S = source subwords + EOS."""
    _, ct2 = _engines(run_dir, export_dir)
    lines = _sentences()[:12]
    decode = DecodeConfig(max_len_a=0.5, max_len_b=1, ban_eos=True)
    for line, hyps in zip(lines, ct2.translate(lines, decode), strict=True):
        s = len(ct2.tokenizer.encode(line, "src")) + 1
        assert hyps[0].src_len == s
        assert len(hyps[0].tokens) == math.floor(0.5 * s + 1)
        assert hyps[0].stop_reason == "max_len"


@needs_ctranslate2
def test_translate_command_with_ctranslate2_engine(run_dir, export_dir, capsys):
    lines = _sentences()[:3]
    assert main(["translate", str(run_dir), *lines]) == 0
    ours = capsys.readouterr().out
    assert main(["translate", "--engine", "ctranslate2", str(export_dir), *lines]) == 0
    assert capsys.readouterr().out == ours
    assert main(["translate", str(export_dir), lines[0]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--engine ctranslate2" in err
    assert main(["translate", "--engine", "ctranslate2", str(run_dir), lines[0]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seq2seq export" in err


@needs_ctranslate2
@pytest.mark.parametrize("device", ["cuda:\u00b2", "cuda:\u0663", "cuda:x"])  # "²".isdigit()
def test_a_gpu_index_not_in_ascii_digits_is_one_line(export_dir, capsys, device):
    argv = ["translate", "--engine", "ctranslate2", "--device", device, str(export_dir), "Hund"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown device '{device}'" in err


@needs_ctranslate2
def test_int8_export_is_smaller_and_translates(run_dir, export_dir, tmp_path):
    from seq2seq.decoding.export import CTranslate2Translator

    out = tmp_path / "int8"
    assert main(["export", str(run_dir), "-o", str(out), "--quantization", "int8"]) == 0
    assert (out / "model.bin").stat().st_size < (export_dir / "model.bin").stat().st_size
    results = CTranslate2Translator.from_export(out, threads=1).translate(_sentences()[:5])
    assert all(hyps[0].stop_reason in ("eos", "max_len") for hyps in results)


@needs_ctranslate2
def test_export_into_non_empty_directory_is_one_line(run_dir, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["export", str(run_dir), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"n_kv_heads": 2}, "n_kv_heads"),
        ({"n_kv_heads": 1}, "n_kv_heads"),
        ({"d_latent": 8}, "d_latent"),
    ],
)
def test_gqa_mqa_mla_models_are_refused_in_one_line(overrides, named, tmp_path, capsys):
    """Refused from the config alone, before any weights or ctranslate2 are needed."""
    run = tmp_path / "run"
    run.mkdir()
    config = Config(model=ModelConfig(d_model=32, n_heads=4, **overrides))
    save_config(run, config)
    assert load_config_file(run).model == config.model
    out = tmp_path / "out"
    assert main(["export", str(run), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: cannot export") and named in err
    assert not out.exists()


@needs_ctranslate2
def test_export_of_a_weights_file_inside_a_run(run_dir, tmp_path):
    from seq2seq.decoding.export import CTranslate2Translator

    out = tmp_path / "from_file"
    assert main(["export", str(run_dir / "model.safetensors"), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".json")) == [
        "config.yaml",
        "model.bin",
        "spm.model",
    ]
    assert not list(tmp_path.glob(".from_file.*"))  # no partial directory left behind
    assert CTranslate2Translator.from_export(out).translate(["Ein Hund."])[0][0].stop_reason


def test_missing_ctranslate2_is_one_line(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 fails
    assert main(["export", str(run_dir), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install -e ".[ctranslate2]"' in err
    assert not (tmp_path / "out").exists()
