"""A user's own small corpus: a Tatoeba-style TSV (English, French, attribution; no header),
its language columns by position or header name, and a vocabulary sized to the corpus."""

import json
import random

import pytest
import yaml

from seq2seq.commands.cli import main
from seq2seq.config import DataConfig
from seq2seq.data.corpora import load_corpus
from seq2seq.data.tokenizer import Tokenizer, corpus_vocab_size
from seq2seq.errors import Seq2SeqError

SUBJECTS = [("The dog", "Le chien"), ("My sister", "Ma sœur"), ("The old man", "Le vieil homme")]
VERBS = [("sees", "voit"), ("likes", "aime"), ("is looking for", "cherche"), ("draws", "dessine")]
OBJECTS = [
    ("the red house", "la maison rouge"),
    ("a small cat", "un petit chat"),
    ("a river", "une rivière"),
]
PLACES = [("", ""), (" today", " aujourd'hui"), (" in the garden", " dans le jardin")]
SYLLABLES = ["ka", "lo", "mi", "ren", "tu", "sa", "vel", "do", "bri", "nu", "zo", "pe", "gar", "li"]


def tatoeba_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Short English-French pairs; made-up names give the corpus a few thousand word types."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        name = "".join(rng.choices(SYLLABLES, k=3)).capitalize()
        (s_en, s_fr), (v_en, v_fr) = rng.choice(SUBJECTS), rng.choice(VERBS)
        (o_en, o_fr), (p_en, p_fr) = rng.choice(OBJECTS), rng.choice(PLACES)
        if rng.random() < 0.5:
            s_en, s_fr = name, name
        pairs.append((f"{s_en} {v_en} {o_en}{p_en}.", f"{s_fr} {v_fr} {o_fr}{p_fr}."))
    return pairs


def write_tsv(path, rows):
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pairs():
    return tatoeba_pairs(3000)


@pytest.fixture(scope="module")
def tatoeba(tmp_path_factory, pairs):
    """English TAB French TAB attribution, no header: the file a new user downloads."""
    rows = [
        (en, fr, f"CC-BY 2.0 (France) Attribution: tatoeba.org #{i}")
        for i, (en, fr) in enumerate(pairs)
    ]
    return write_tsv(tmp_path_factory.mktemp("tatoeba") / "eng-fra.tsv", rows)


def test_extra_columns_are_ignored_with_one_note(tatoeba, pairs):
    corpus = load_corpus(str(tatoeba), "en", "fr")
    assert (
        set(corpus.splits["train"]) <= set(pairs) and sum(map(len, corpus.splits.values())) == 3000
    )
    [note] = [n for n in corpus.notes if "columns" in n]
    assert note == (
        "eng-fra.tsv has 3 columns: en from column 1, fr from column 2, the other 1 ignored "
        "(--columns or data.columns chooses)"
    )


def test_columns_by_position_choose_the_direction(tatoeba, pairs):
    corpus = load_corpus(str(tatoeba), "fr", "en", columns="2,1")
    assert set(corpus.splits["train"]) <= {(fr, en) for en, fr in pairs}


def test_columns_by_header_name(tmp_path, pairs):
    rows = [("attribution", "english", "french")] + [("x", en, fr) for en, fr in pairs[:50]]
    path = write_tsv(tmp_path / "named.tsv", rows)
    corpus = load_corpus(
        str(path), "en", "fr", columns="english,french", carve_valid=5, carve_test=5
    )
    assert len(corpus.splits["train"]) == 40 and set(corpus.splits["train"]) <= set(pairs[:50])
    header = write_tsv(
        tmp_path / "langs.tsv", [("source", "fr", "en")] + [("x", fr, en) for en, fr in pairs[:50]]
    )
    corpus = load_corpus(str(header), "en", "fr", carve_valid=5, carve_test=5)  # the header says
    assert set(corpus.splits["train"]) <= set(pairs[:50])
    assert any("en from column 3, fr from column 2" in note for note in corpus.notes)


@pytest.mark.parametrize(
    ("data", "columns", "message"),
    [
        ("{tsv}", "1,4", "has no column '4' (line 1 has 3, and no header line)"),
        ("{tsv}", "english,french", "has no column 'english'"),
        # checked with the run's config, as `train` checks it
        ("{tsv}", "2,2", "config: data.columns must name two different columns"),
        # digits that are not ASCII (str.isdigit says yes to them, int() does not)
        ("{tsv}", "\u00b2,1", "has no column '\u00b2' (line 1 has 3, and no header line)"),
        ("{tsv}", "\u0661,2", "has no column '\u0661'"),
        ("sample", "1,2", "--columns applies to TSV corpora; --data sample is not"),
    ],
)
def test_bad_columns_are_one_line_errors(tatoeba, capsys, data, columns, message):
    args = [
        "data",
        "--data",
        data.format(tsv=tatoeba),
        "--src",
        "en",
        "--tgt",
        "fr",
        "--columns",
        columns,
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_row_with_another_column_count_is_named(tmp_path):
    path = write_tsv(tmp_path / "c.tsv", [("a", "b", "c"), ("d", "e", "f"), ("g", "h")])
    with pytest.raises(
        Seq2SeqError, match=r"c\.tsv: line 3 has 2 tab-separated columns, expected 3"
    ):
        load_corpus(str(path), "en", "fr")


def test_config_checks_columns():
    assert main(["train", "--out", "unused", "--columns", "1"]) == 2


def test_default_vocabulary_is_sized_to_a_small_corpus(tmp_path, pairs):
    en, fr = [e for e, _ in pairs], [f for _, f in pairs]
    words = sum(len(t.split()) for t in en + fr)
    sized = corpus_vocab_size(en + fr, DataConfig.vocab_size)
    assert sized == 4 + 256 + words // 30 < DataConfig.vocab_size
    tokenizer = Tokenizer.train(en, fr, tmp_path / "fit", DataConfig.vocab_size, fit_to_corpus=True)
    assert tokenizer.src_vocab_size == sized
    assert any(
        f"sized to {sized}" in note and f"{words:,} words" in note for note in tokenizer.notes
    )
    # A size the user chose is kept, with a warning when the corpus is too small for it.
    chosen = Tokenizer.train(en, fr, tmp_path / "set", 3000)
    assert chosen.src_vocab_size == 3000
    assert any(n.startswith("spm.model: vocabulary size 3000 is large") for n in chosen.notes)
    assert not Tokenizer.train(en, fr, tmp_path / "small", 600).notes  # fits: nothing to say


def test_a_large_corpus_keeps_the_default():
    assert corpus_vocab_size(["a b c d e f g h i j"] * 30_000, 8000) == 8000


def test_data_command_reports_columns_and_vocabulary(tatoeba, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert (
        main(["data", "--data", str(tatoeba), "--src", "en", "--tgt", "fr", "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "note: eng-fra.tsv has 3 columns" in printed and "sized to" in printed
    assert json.loads(out.read_text())["vocab"]["src"] < DataConfig.vocab_size


def test_train_and_evaluate_take_the_columns(tmp_path, pairs, capsys):
    """Column 1 empty (an id the export left out): only --columns 2,3 finds the pairs, and
    evaluate reads the run's corpus with the run's columns."""
    path = write_tsv(tmp_path / "ids.tsv", [("", en, fr, "CC-BY") for en, fr in pairs[:400]])
    run = tmp_path / "run"
    tiny = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_enc_layers=1"]
    tiny += ["model.n_dec_layers=1", "train.valid_bleu_sentences=8", "train.attention_sentences=0"]
    tiny += ["train.threads=1", "decode.max_len_b=2", "decode.max_len_a=0"]
    args = ["train", "--data", str(path), "--src", "en", "--tgt", "fr", "--columns", "2,3"]
    args += ["--out", str(run), "--max-steps", "2", "--device", "cpu", "--fp32", "--no-progress"]
    main(args + [x for setting in tiny for x in ("--set", setting)])
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["columns"] == "2,3"
    notes = json.loads((run / "data_summary.json").read_text())["notes"]
    assert any("4 columns: en from column 2, fr from column 3" in n for n in notes)
    assert any("sized to" in n for n in notes)
    printed = capsys.readouterr().err
    assert (
        "note: ids.tsv has 4 columns" in printed and "the default vocabulary size 8000" in printed
    )
    assert main(["evaluate", str(run), "--device", "cpu", "--no-progress"]) == 0
    assert "40 sentences" in capsys.readouterr().out  # the test pairs carved off 400
    assert main(["evaluate", str(run), "--device", "cpu", "--columns", "1,2"]) == 2
    assert "no pairs in split 'test'" in capsys.readouterr().err
