"""Evaluation: the ``evaluate`` command prints sacreBLEU scores with their signatures and
writes one hypothesis per test pair plus the scores as JSON; BLEU's tokenizer follows the
target language; empty pairs left out are counted."""

import io
import json
import sys

import pytest
from helpers import tiny_run_dir
from sacrebleu.metrics import BLEU

from seq2seq.cli import main
from seq2seq.config import DecodeConfig
from seq2seq.corpora import load_corpus
from seq2seq.errors import Seq2SeqError
from seq2seq.evaluate import bleu_tokenize, evaluate_split, format_report


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def test_pairs():
    return load_corpus("sample", "de", "en").splits["test"]


def test_cli_evaluate_prints_signatures_and_writes_hypotheses(run_dir, test_pairs, capsys):
    assert main(["evaluate", str(run_dir), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "BLEU = " in out and "chrF2 = " in out and "lowercased BLEU = " in out
    signatures = [
        line.strip() for line in out.splitlines() if line.strip().startswith("signature ")
    ]
    assert len(signatures) == 3
    assert "case:mixed" in signatures[0] and "tok:13a" in signatures[0]
    assert "nc:6" in signatures[1]  # chrF's character n-gram order
    assert "case:lc" in signatures[2]
    assert "length ratio hyp/ref" in out and "stop reasons:" in out

    hyps = (run_dir / "hyps.test.en.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == len(test_pairs)
    scores = json.loads((run_dir / "hyps.test.en.json").read_text(encoding="utf-8"))
    assert scores["sentences"] == len(test_pairs)
    assert scores["bleu_signature"] == signatures[0].removeprefix("signature ")
    assert scores["length_ratio"] == pytest.approx(scores["sys_len"] / scores["ref_len"], abs=1e-4)


def test_evaluate_split_library(run_dir, test_pairs, tmp_path):
    hyp_file = tmp_path / "beam.txt"
    decode = DecodeConfig(beam=3, max_len_a=0.0, max_len_b=4)
    report = evaluate_split(run_dir, "sample", "validation", decode, hyp_file=hyp_file)
    n = len(load_corpus("sample", "de", "en").splits["validation"])
    assert report["sentences"] == n
    assert len(hyp_file.read_text(encoding="utf-8").split("\n")[:-1]) == n
    assert json.loads((tmp_path / "beam.json").read_text())["search"]["beam"] == 3
    assert sum(report["stop_reasons"].values()) == pytest.approx(1.0)
    assert set(report["stop_reasons"]) <= {"eos", "max_len"}
    assert 0 <= report["bleu"] <= 100 and 0 <= report["chrf"] <= 100


def test_cli_evaluate_missing_data_is_one_line(run_dir, capsys):
    assert main(["evaluate", str(run_dir), "--data", "no/such/folder"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def _builds(tokenize):
    try:
        BLEU(tokenize=tokenize)
    except RuntimeError:  # MeCab's optional packages are not installed
        return False
    return True


def test_bleu_tokenizer_follows_the_target_language():
    assert bleu_tokenize("en") == bleu_tokenize("de") == "13a"
    assert bleu_tokenize("zh") == bleu_tokenize("zh-CN") == bleu_tokenize("zh_Hans") == "zh"
    assert bleu_tokenize("th") == "char"
    assert bleu_tokenize("ja") == ("ja-mecab" if _builds("ja-mecab") else "char")
    assert bleu_tokenize("ko-KR") == ("ko-mecab" if _builds("ko-mecab") else "char")


def test_target_language_tokenizer_and_empty_pairs_in_the_report(run_dir, tmp_path):
    corpus = tmp_path / "de-zh"
    corpus.mkdir()
    de = ["Ein Hund läuft.", "", "Zwei Kinder spielen.", "Eine Frau liest.", "Hund"]
    zh = ["一只狗在跑。", "空的", "两个孩子在玩。", "", "狗"]
    for split in ("train", "test"):
        (corpus / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
        (corpus / f"{split}.zh").write_text("\n".join(zh) + "\n", encoding="utf-8")
    hyp_file = tmp_path / "hyps.txt"
    report = evaluate_split(run_dir, str(corpus), src="de", tgt="zh", hyp_file=hyp_file)
    assert report["sentences"] == 3 and report["empty_pairs_dropped"] == 2
    assert "tok:zh" in report["bleu_signature"] and "tok:zh" in report["bleu_lowercase_signature"]
    saved = json.loads((tmp_path / "hyps.json").read_text(encoding="utf-8"))
    assert saved["empty_pairs_dropped"] == 2
    assert "3 sentences (2 empty pairs dropped)" in format_report(report)

    chosen = evaluate_split(
        run_dir, str(corpus), src="de", tgt="zh", hyp_file=hyp_file, tokenize="char"
    )
    assert "tok:char" in chosen["bleu_signature"]
    unusable = ["nope"] + [name for name in ("ja-mecab", "ko-mecab") if not _builds(name)]
    for bad in unusable:
        with pytest.raises(Seq2SeqError, match=f"--tokenize {bad}") as caught:
            evaluate_split(run_dir, str(corpus), src="de", tgt="zh", tokenize=bad)
        assert "\n" not in str(caught.value)


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("no_progress", [False, True])
def test_evaluate_progress_bar_on_terminal_stderr_only(
    run_dir, tmp_path, monkeypatch, capsys, no_progress
):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    args = ["evaluate", str(run_dir), "--device", "cpu", "-o", str(tmp_path / "hyps.txt")]
    assert main(args + ["--no-progress"] * no_progress) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out
    assert "\r" not in out and "sent/s" not in out
    assert ("sent/s" in terminal.getvalue()) is not no_progress
