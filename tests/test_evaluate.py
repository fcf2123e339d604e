"""Evaluation: the ``evaluate`` command prints sacreBLEU scores with their signatures and
writes one hypothesis per test pair plus the scores as JSON."""

import json

import pytest
from helpers import tiny_run_dir

from seq2seq.cli import main
from seq2seq.data import load_corpus
from seq2seq.evaluate import evaluate_split
from seq2seq.search import SearchConfig


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
    search = SearchConfig(beam=3, max_len_a=0.0, max_len_b=4)
    report = evaluate_split(run_dir, "sample", "validation", search, hyp_file=hyp_file)
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
