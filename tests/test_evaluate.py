"""Evaluation: the ``evaluate`` command prints sacreBLEU scores with their signatures and
writes one hypothesis per test pair plus the scores as JSON; BLEU's tokenizer follows the
target language; empty pairs left out are counted; BLEU on the Multi30k papers' scale
tokenizes the raw references exactly as the dataset's published tokenized files."""

import gzip
import hashlib
import io
import json
import logging
import shutil
import sys
from pathlib import Path

import hypothesis
import pytest
import sacrebleu
from helpers import tiny_run_dir
from hypothesis import strategies as st
from sacrebleu.metrics import BLEU

from seq2seq.commands.cli import main
from seq2seq.config import DecodeConfig
from seq2seq.data.corpora import load_corpus
from seq2seq.decoding import translate
from seq2seq.decoding.evaluate import (
    LITERATURE_SCALE,
    bleu_tokenize,
    evaluate_split,
    format_report,
    lc_norm_tok,
    literature_bleu,
)
from seq2seq.decoding.load import load_run
from seq2seq.errors import Seq2SeqError
from seq2seq.run.checkpoint import BEST_FILE, average_run, describe_weights, read_tensors
from seq2seq.training.validation import reference_bleu

MULTI30K = Path(__file__).resolve().parents[1] / "data" / "multi30k"


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
    assert len(signatures) == 4
    assert "case:mixed" in signatures[0] and "tok:13a" in signatures[0]
    assert "nc:6" in signatures[1]  # chrF's character n-gram order
    assert "case:lc" in signatures[2]
    assert f"{LITERATURE_SCALE}: BLEU = " in out and "tok:none" in signatures[3]
    assert "length ratio hyp/ref" in out and "stop reasons:" in out

    hyps = (run_dir / "hyps.test.en.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == len(test_pairs)
    scores = json.loads((run_dir / "hyps.test.en.json").read_text(encoding="utf-8"))
    assert scores["sentences"] == len(test_pairs)
    assert scores["bleu_signature"] == signatures[0].removeprefix("signature ")
    assert scores["bleu_lc_norm_tok_signature"] == signatures[3].removeprefix("signature ")
    assert 0 <= scores["bleu_lc_norm_tok"] <= 100
    assert scores["length_ratio"] == pytest.approx(scores["sys_len"] / scores["ref_len"], abs=1e-4)


def test_a_beam_search_writes_beside_greedy_not_over_it(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)  # the session's run stays as other tests expect it
    assert main(["evaluate", str(run), "--device", "cpu"]) == 0
    assert main(["evaluate", str(run), "--device", "cpu", "--beam", "2"]) == 0
    beam = json.loads((run / "hyps.test.en.beam2.json").read_text(encoding="utf-8"))
    assert beam["search"]["beam"] == 2 and (run / "hyps.test.en.beam2.txt").is_file()
    assert json.loads((run / "hyps.test.en.json").read_text())["search"]["beam"] == 1


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


def test_the_scores_name_the_weights_they_scored(run_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    averaged, _ = average_run(run, last=2)
    kept = run / "checkpoints" / "step_30.safetensors"
    for given, file, weights in (
        (run, "model.safetensors", describe_weights(read_tensors(run / BEST_FILE)[1])),
        (averaged, "averaged.safetensors", "average of steps 30–60"),
        (kept, "checkpoints/step_30.safetensors", "step 30"),
    ):
        report = evaluate_split(given, split="validation")
        digest = hashlib.sha256((run / file).read_bytes()).hexdigest()
        assert (report["weights_file"], report["weights"], report["sha256"]) == (
            file,
            weights,
            digest,
        )
        assert json.loads(Path(report["scores_file"]).read_text())["sha256"] == digest

    def replaced_while_loading(*args):  # as a training still running would
        loaded = load_run(*args)
        shutil.copyfile(averaged, run / BEST_FILE)
        return loaded

    monkeypatch.setattr(translate, "load_run", replaced_while_loading)
    with pytest.raises(Seq2SeqError, match="model.safetensors changed while it loaded"):
        evaluate_split(run, split="validation")


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
    de = ["Ein Hund läuft.", "", "Zwei Kinder spielen.", "Eine Frau liest.", "Hund", "\u200b"]
    zh = ["一只狗在跑。", "空的", "两个孩子在玩。", "", "狗", "狗"]
    for split in ("train", "test"):
        (corpus / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
        (corpus / f"{split}.zh").write_text("\n".join(zh) + "\n", encoding="utf-8")
    hyp_file = tmp_path / "hyps.txt"
    report = evaluate_split(run_dir, str(corpus), src="de", tgt="zh", hyp_file=hyp_file)
    assert report["sentences"] == 4 and report["empty_pairs_dropped"] == 2
    # A source of no subwords (U+200B) is scored, with an empty hypothesis that says so.
    assert hyp_file.read_text(encoding="utf-8").split("\n")[3] == ""
    assert report["stop_reasons"]["empty"] == 0.25 and "empty 25.0%" in format_report(report)
    assert "tok:zh" in report["bleu_signature"] and "tok:zh" in report["bleu_lowercase_signature"]
    saved = json.loads((tmp_path / "hyps.json").read_text(encoding="utf-8"))
    assert saved["empty_pairs_dropped"] == 2
    assert "4 sentences (2 empty pairs dropped)" in format_report(report)

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


# --- BLEU on the Multi30k papers' scale ----------------------------------------------------


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_shipped_tokenized_references_are_the_published_ones():
    listed = (MULTI30K / "tok" / "SHA256SUMS").read_text().splitlines()
    assert len(listed) == 4
    for line in listed:
        digest, name = line.split("  ")
        assert hashlib.sha256((MULTI30K / "tok" / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("split", ["val", "test_2016_flickr"])
@pytest.mark.parametrize("lang", ["en", "de"])
def test_lc_norm_tok_reproduces_the_published_tokenized_multi30k(split, lang):
    raw = _lines(MULTI30K / f"{split}.{lang}.gz")
    published = _lines(MULTI30K / "tok" / f"{split}.lc.norm.tok.{lang}")
    assert len(raw) == len(published) >= 1000
    ours = lc_norm_tok(raw, lang)
    wrong = [(n, a, b) for n, (a, b) in enumerate(zip(ours, published, strict=True)) if a != b]
    assert wrong == []


def test_literature_bleu_ignores_case_and_quote_style_but_not_words():
    refs = ['Er sagt: "hallo".', "Ein Hund läuft über die Wiese."]
    same = ["er sagt: „Hallo.“", "ein HUND läuft über die Wiese ."]
    assert literature_bleu(same, refs, "de")["bleu_lc_norm_tok"] == 100.0
    assert lc_norm_tok(same[:1], "de-DE") == ["er sagt : &quot; hallo &quot; ."]
    assert lc_norm_tok(["Sie sagt ’Ja’ zu McDonald’s"], "en") == [
        "sie sagt &quot; ja &quot; zu mcdonald &apos;s"  # a lone ’ is a double quote in Perl
    ]
    other = ["er sagt: „Hallo.“", "ein Hund läuft über die Straße."]
    assert literature_bleu(other, refs, "de")["bleu_lc_norm_tok"] < 100.0


def test_literature_bleu_does_not_warn_that_its_tokenized_text_looks_tokenized(caplog):
    lines = [f"Hund {i} läuft über die Wiese." for i in range(120)]  # each ends " ." once tokenized
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        assert literature_bleu(lines, lines, "de")["bleu_lc_norm_tok"] == 100.0
    assert "detokenize" not in caplog.text


_words = st.lists(st.sampled_from(["a", "dog", "runs", "the", "Hund", ",", "."]), max_size=8)


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    st.lists(st.tuples(_words, _words), min_size=1, max_size=6),
    st.sampled_from(["13a", "char", "intl"]),
)
def test_validation_bleu_against_cached_references_is_corpus_bleus(pairs, tokenize):
    """The validation's BLEU, whose reference statistics are computed once per run, scores
    what ``sacrebleu.corpus_bleu`` scores, to the bit, and a second scoring (cached) too."""
    hyps = [" ".join(h) for h, _ in pairs]
    refs = tuple(" ".join(r) for _, r in pairs)
    expected = sacrebleu.corpus_bleu(hyps, [list(refs)], tokenize=tokenize).score
    for _ in range(2):
        assert reference_bleu(refs, tokenize).corpus_score(hyps, None).score == expected
