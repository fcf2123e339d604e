from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_train import tiny_config

from seq2seq.data.tokenizer import Tokenizer
from seq2seq.drawing.words import word_index
from seq2seq.errors import Seq2SeqError
from seq2seq.training.entry import train
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def sample_texts() -> tuple[list[str], list[str]]:
    de = (SAMPLE / "train.de").read_text(encoding="utf-8").splitlines()
    en = (SAMPLE / "train.en").read_text(encoding="utf-8").splitlines()
    return de, en


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    de, en = sample_texts()
    return Tokenizer.train(de, en, tmp_path_factory.mktemp("tok"), vocab_size=400)


def test_special_ids_are_fixed(tokenizer):
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tokenizer.pieces([PAD_ID, UNK_ID, BOS_ID, EOS_ID], "tgt") == [
        "<pad>",
        "<unk>",
        "<s>",
        "</s>",
    ]


def test_encode_adds_no_specials_and_batch_agrees(tokenizer):
    texts = ["Ein Hund läuft über die Wiese.", "A dog runs across the meadow."]
    ids = tokenizer.encode_batch(texts, "src")
    assert ids == [tokenizer.encode(t, "src") for t in texts]
    assert all(i not in (PAD_ID, BOS_ID, EOS_ID) for row in ids for i in row)


@pytest.mark.parametrize(
    "text, normalised",
    [
        ("Zwei Kinder spielen im Sand.", "Zwei Kinder spielen im Sand."),
        # never seen in training: byte fallback, not <unk>
        ("Ein Hund 🐶 läuft nach 東京 und 서울.", "Ein Hund 🐶 läuft nach 東京 und 서울."),
        # NFKC spells ½ as 1⁄2 and collapses spaces
        ("Ωμέγα  — «quoted» ½ café ", "Ωμέγα — «quoted» 1⁄2 café"),
    ],
)
def test_round_trip_including_unseen_characters(tokenizer, text, normalised):
    ids = tokenizer.encode(text, "src")
    assert UNK_ID not in ids
    assert tokenizer.decode(ids, "src") == tokenizer.normalize(text, "src") == normalised


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp")), max_size=40))
def test_round_trip_on_normalised_text(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text, "tgt"), "tgt") == tokenizer.normalize(
        text, "tgt"
    )


def test_decode_stops_at_eos_and_skips_bos_and_pad(tokenizer):
    ids = tokenizer.encode("Ein Mann kocht.", "src")
    assert tokenizer.decode([BOS_ID, *ids, EOS_ID, *ids, PAD_ID], "src") == "Ein Mann kocht."
    assert tokenizer.decode([*ids, PAD_ID, PAD_ID], "src") == "Ein Mann kocht."


def test_joint_model_saved_and_loaded(tokenizer, tmp_path):
    de, en = sample_texts()
    trained = Tokenizer.train(de, en, tmp_path, vocab_size=400)
    assert (tmp_path / "spm.model").is_file()
    loaded = Tokenizer.load(tmp_path)
    assert loaded.joint and loaded.src_vocab_size == loaded.tgt_vocab_size == trained.src_vocab_size
    assert Tokenizer.load(tmp_path / "spm.model").encode("Ein Hund", "tgt") == trained.encode(
        "Ein Hund", "tgt"
    )


def test_separate_vocabularies_and_unigram(tmp_path):
    de, en = sample_texts()
    trained = Tokenizer.train(de, en, tmp_path, vocab_size=350, model_type="unigram", joint=False)
    assert (tmp_path / "spm_src.model").is_file() and (tmp_path / "spm_tgt.model").is_file()
    loaded = Tokenizer.load(tmp_path)
    assert not loaded.joint
    assert loaded.encode("Ein Hund", "src") == trained.encode("Ein Hund", "src")
    assert loaded.decode(loaded.encode("A dog", "tgt"), "tgt") == "A dog"


def test_vocabulary_too_big_for_corpus_is_reduced_and_said(tmp_path):
    de, en = sample_texts()
    tokenizer = Tokenizer.train(de, en, tmp_path, vocab_size=8000)
    assert tokenizer.src_vocab_size < 8000
    assert any("8000" in note for note in tokenizer.notes)


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(Seq2SeqError, match="no tokenizer in"):
        Tokenizer.load(tmp_path)
    (tmp_path / "spm.model").write_bytes(b"not a model at all")
    with pytest.raises(Seq2SeqError, match="not a SentencePiece model"):
        Tokenizer.load(tmp_path)
    with pytest.raises(Seq2SeqError, match="unknown SentencePiece model type"):
        Tokenizer.train(["a"], ["b"], tmp_path, model_type="wordpiece")


def test_the_specials_are_the_control_and_unknown_pieces_and_bytes_stay_in_their_word(tokenizer):
    assert tokenizer.special_pieces == {"<pad>", "<unk>", "<s>", "</s>"}
    text = "Ein Hund🐶 läuft 東京"  # never seen in training: byte-fallback pieces
    pieces = tokenizer.pieces(tokenizer.encode(text, "src") + [EOS_ID], "src")
    assert sum(p.startswith("<0x") for p in pieces) >= 8
    index = word_index(pieces, tokenizer.special_pieces)
    assert index[-1] + 1 == len(text.split()) + 1  # the words, and </s>


def test_sentencepiece_uses_the_threads_a_run_is_given(tmp_path, monkeypatch):
    threads = 3  # neither this machine's cores nor the tests' one thread
    seen = []
    train_spm, encode = spm.SentencePieceTrainer.train, spm.SentencePieceProcessor.encode

    def train_spy(**kwargs):
        seen.append(("train", kwargs["num_threads"]))
        return train_spm(**kwargs)

    def encode_spy(self, *args, **kwargs):
        seen.append(("encode", kwargs.get("num_threads")))
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", train_spy)
    monkeypatch.setattr(spm.SentencePieceProcessor, "encode", encode_spy)
    before = torch.get_num_threads()
    try:
        train(tiny_config(train__max_steps=1, train__threads=threads), tmp_path, progress=False)
    finally:
        torch.set_num_threads(before)
    trainings = [n for kind, n in seen if kind == "train"]
    batches = [n for kind, n in seen if kind == "encode" and n is not None]  # encode_batch
    assert trainings and set(trainings) == {threads}
    assert batches and set(batches) == {threads}
