import gzip
import hashlib
import itertools
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seq2seq.commands.cli import format_data_report, main
from seq2seq.config import Config, DataConfig
from seq2seq.data import batching, hub, prepare, registry
from seq2seq.data.batching import N_BUCKETS, Buckets, TokenBatchSampler, collate
from seq2seq.data.corpora import encode_pairs, load_corpus, open_corpus
from seq2seq.data.prepare import prepare_store
from seq2seq.data.report import data_report
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.errors import Seq2SeqError
from seq2seq.run.runtime import Runtime
from seq2seq.training.prepare import prepare_data
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID

MULTI30K = Path(__file__).resolve().parents[1] / "data" / "multi30k"  # ships with the repository


def pairs(n: int, prefix: str = "") -> list[tuple[str, str]]:
    return [(f"{prefix}Satz Nummer {i} .", f"{prefix}sentence number {i} .") for i in range(n)]


def write_lines(path: Path, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)


def write_parallel(
    folder: Path, split: str, split_pairs: list[tuple[str, str]], gz: bool = False
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    write_lines(folder / f"{split}.de{suffix}", [s for s, _ in split_pairs])
    write_lines(folder / f"{split}.en{suffix}", [t for _, t in split_pairs])


def sizes(corpus) -> dict[str, int]:
    return {split: len(p) for split, p in corpus.splits.items()}


# --- Sources ------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_parallel_folder_plain_and_gz(tmp_path, gz):
    write_parallel(tmp_path, "train", pairs(20), gz)
    write_parallel(tmp_path, "dev", pairs(4, "d"), gz)
    write_parallel(tmp_path, "test_2016_flickr", pairs(3, "t"), gz)
    (tmp_path / "README.md").write_text("not a split\n")
    corpus = load_corpus(str(tmp_path), "de", "en")
    assert sizes(corpus) == {"train": 20, "validation": 4, "test": 3}
    assert corpus.splits["validation"][0] == ("dSatz Nummer 0 .", "dsentence number 0 .")
    reverse = load_corpus(str(tmp_path), "en", "de")
    assert reverse.splits["test"][2] == ("tsentence number 2 .", "tSatz Nummer 2 .")


def test_several_test_splits_need_test_split(tmp_path):
    write_parallel(tmp_path, "train", pairs(20))
    write_parallel(tmp_path, "test_2016", pairs(3))
    write_parallel(tmp_path, "test_2017", pairs(5))
    with pytest.raises(
        Seq2SeqError, match=r"\(test_2016, test_2017\); choose one with --test-split"
    ):
        load_corpus(str(tmp_path), "de", "en")
    corpus = load_corpus(str(tmp_path), "de", "en", test_split="test_2017")
    assert len(corpus.splits["test"]) == 5
    assert any("carved 2 validation" in note for note in corpus.notes)


def test_tsv_with_header_any_column_order(tmp_path):
    rows = ["fr\ten\tde"] + [f"phrase {i}\tsentence {i}\tSatz {i}" for i in range(30)]
    write_lines(tmp_path / "corpus.tsv", rows)
    corpus = load_corpus(str(tmp_path / "corpus.tsv"), "de", "fr", carve_valid=2, carve_test=3)
    assert sizes(corpus) == {"train": 25, "validation": 2, "test": 3}
    assert all(s.startswith("Satz") and t.startswith("phrase") for s, t in corpus.splits["train"])
    with pytest.raises(Seq2SeqError, match="no 'cs' side; languages it holds: de, en, fr"):
        load_corpus(str(tmp_path / "corpus.tsv"), "de", "cs")


def test_tsv_without_header_takes_src_tgt(tmp_path):
    write_lines(tmp_path / "corpus.tsv", [f"Satz {i}\tsentence {i}" for i in range(30)])
    corpus = load_corpus(str(tmp_path / "corpus.tsv"), "de", "en", carve_valid=1, carve_test=1)
    assert corpus.splits["train"][0] == ("Satz 0", "sentence 0")
    assert sum(sizes(corpus).values()) == 30


def test_tsv_folder_with_splits(tmp_path):
    for split, n in (("train", 12), ("validation", 3), ("test", 2)):
        write_lines(tmp_path / f"{split}.tsv", ["en\tde"] + [f"s {i}\tS {i}" for i in range(n)])
    corpus = load_corpus(str(tmp_path), "de", "en")
    assert sizes(corpus) == {"train": 12, "validation": 3, "test": 2}
    assert corpus.splits["test"][1] == ("S 1", "s 1")
    assert corpus.notes == []


def test_train_only_corpus_is_carved_deterministically(tmp_path):
    write_parallel(tmp_path, "train", pairs(100))
    first = load_corpus(str(tmp_path), "de", "en", carve_valid=5, carve_test=7)
    again = load_corpus(str(tmp_path), "de", "en", carve_valid=5, carve_test=7)
    assert sizes(first) == {"train": 88, "validation": 5, "test": 7}
    assert first.splits == again.splits
    all_pairs = sorted(p for split in first.splits.values() for p in split)
    assert all_pairs == sorted(pairs(100))  # nothing lost, nothing shared
    assert "carved 5 validation pairs off train" in first.notes
    assert "carved 7 test pairs off train" in first.notes


def test_carving_a_small_corpus_keeps_most_for_training(tmp_path):
    write_parallel(tmp_path, "train", pairs(30))
    corpus = load_corpus(str(tmp_path), "de", "en")
    assert sizes(corpus) == {"train": 24, "validation": 3, "test": 3}
    assert any("1000 asked" in note for note in corpus.notes)


def test_registry_sample_corpus():
    corpus = load_corpus("sample", "de", "en")
    assert sizes(corpus) == {"train": 40, "validation": 6, "test": 6}


# --- Through Hugging Face datasets --------------------------------------------------------


def test_hub_schema_via_datasets_on_local_jsonl(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "CACHE_DIR", tmp_path / "cache")
    folder = tmp_path / "multi30k_copy"
    folder.mkdir()
    for split, n in (("train", 8), ("validation", 3), ("test", 2)):
        rows = [{"en": f"sentence {i}", "de": f"Satz {i}"} for i in range(n)] + [
            {"en": " ", "de": "x"}
        ]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = load_corpus(str(folder), "de", "en")
    assert sizes(corpus) == {"train": 8, "validation": 3, "test": 2}
    assert corpus.splits["train"][7] == ("Satz 7", "sentence 7")
    assert corpus.dropped == {
        "train": {"empty": 1},
        "validation": {"empty": 1},
        "test": {"empty": 1},
    }
    with pytest.raises(Seq2SeqError, match="no 'fr' side; languages it holds: de, en"):
        load_corpus(str(folder), "fr", "en")


def test_wmt_style_translation_column_via_datasets(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "CACHE_DIR", tmp_path / "cache")
    folder = tmp_path / "wmt_copy"
    folder.mkdir()
    rows = [{"translation": {"de": f"Satz {i}", "en": f"sentence {i}"}} for i in range(30)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = load_corpus(str(folder), "en", "de", carve_valid=2, carve_test=2)
    assert sizes(corpus) == {"train": 26, "validation": 2, "test": 2}
    assert ("sentence 0", "Satz 0") in corpus.splits["train"]


def test_hub_id_without_network_fails_fast_naming_the_shipped_copy():
    if hub.hub_unreachable() is None:
        pytest.skip(
            "the Hub is reachable (or HF_HUB_OFFLINE/proxy set): this checks the offline error"
        )
    start = time.monotonic()
    with pytest.raises(Seq2SeqError, match="cannot reach the Hugging Face Hub") as error:
        load_corpus("bentrevett/multi30k", "de", "en")
    assert time.monotonic() - start < 5
    assert "try a local copy: --data multi30k or --data sample" in str(error.value)


def test_the_default_corpus_is_the_shipped_multi30k_from_any_working_directory(
    tmp_path, monkeypatch
):
    assert DataConfig().data == "multi30k"
    monkeypatch.chdir(tmp_path)
    corpus = load_corpus("multi30k", "de", "en")
    assert sizes(corpus) == {"train": 29000, "validation": 1014, "test": 1000}
    assert str(MULTI30K) in corpus.source_description


def test_without_the_repository_a_registry_name_is_one_line_saying_what_to_do(
    tmp_path, monkeypatch
):
    # as in a plain pip install
    monkeypatch.setattr(registry, "REGISTRY", tmp_path / "corpora.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Seq2SeqError, match="no corpus registry .* point --data at a corpus folder"):
        load_corpus("multi30k", "de", "en")
    entries = tmp_path / "registry.yaml"
    entries.write_text("gone:\n  path: data/not-here\n")
    monkeypatch.setattr(registry, "REGISTRY", entries)
    with pytest.raises(
        Seq2SeqError, match="corpus 'gone' should be in .*not-here, which is missing"
    ):
        load_corpus("gone", "de", "en")


# --- The real Multi30k copy ----------------------------------------------------------------


@pytest.mark.parametrize("src, tgt", list(itertools.permutations(["en", "de", "fr", "cs"], 2)))
def test_multi30k_every_ordered_pair(src, tgt):
    corpus = load_corpus(str(MULTI30K), src, tgt)
    assert sizes(corpus) == {"train": 29000, "validation": 1014, "test": 1000}
    assert corpus.dropped == {}


def test_the_shipped_multi30k_files_are_the_published_ones():
    listed = (MULTI30K / "README.md").read_text()
    files = sorted(MULTI30K.glob("*.gz"))
    assert len(files) == 12
    for path in files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"{digest}  {path.name}" in listed, path.name


# --- Bad data ------------------------------------------------------------------------------


@pytest.mark.parametrize("n_de, n_en", [(3, 2), (2, 5)])
def test_line_count_mismatch_names_both_files_and_counts(tmp_path, n_de, n_en):
    write_lines(tmp_path / "train.de.gz", ["a", "b", "c", "d", "e"][:n_de])
    write_lines(tmp_path / "train.en.gz", ["a", "b", "c", "d", "e"][:n_en])
    with pytest.raises(
        Seq2SeqError, match=rf"train\.de\.gz has {n_de} lines but .*train\.en\.gz has {n_en}"
    ):
        load_corpus(str(tmp_path), "de", "en")


@pytest.mark.parametrize(
    "content",  # mtime=0: the same bytes (and test name) in every worker that collects it
    [b"not gzip at all\n", gzip.compress(b"eins\nzwei\n" * 500, mtime=0)[:-20]],
    ids=["not-gzip", "cut-short"],
)
def test_a_broken_gzip_file_is_one_line(tmp_path, content):
    (tmp_path / "train.de.gz").write_bytes(content)
    write_lines(tmp_path / "train.en.gz", ["one", "two"])
    with pytest.raises(Seq2SeqError, match=r"train\.de\.gz is not a valid gzip file"):
        load_corpus(str(tmp_path), "de", "en")


def test_missing_split_lists_what_exists(tmp_path):
    write_parallel(tmp_path, "val", pairs(3))
    write_parallel(tmp_path, "test", pairs(3))
    with pytest.raises(Seq2SeqError, match="no train split .*splits it has: test, val"):
        load_corpus(str(tmp_path), "de", "en")
    write_parallel(tmp_path, "train", pairs(10))
    with pytest.raises(Seq2SeqError, match="no split 'test_2018'; splits it has: test, train, val"):
        load_corpus(str(tmp_path), "de", "en", test_split="test_2018")


def test_unknown_language_lists_those_held(tmp_path):
    write_parallel(tmp_path, "train", pairs(3))
    with pytest.raises(Seq2SeqError, match="no 'fr' side; languages it holds: de, en"):
        load_corpus(str(tmp_path), "de", "fr")
    with pytest.raises(Seq2SeqError, match="both 'de'"):
        load_corpus(str(tmp_path), "de", "de")


@pytest.mark.parametrize("name", ["train.de", "train.de.gz"])
def test_invalid_utf8_names_file_and_line(tmp_path, name):
    raw = b"gut\nauch gut\nkaputt \xff\xfe hier\n"
    (tmp_path / name).write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    write_lines(tmp_path / "train.en", ["good", "also good", "broken here"])
    with pytest.raises(Seq2SeqError, match=rf"{name}: invalid UTF-8 on line 3"):
        load_corpus(str(tmp_path), "de", "en")


def test_empty_and_whitespace_pairs_are_dropped_and_counted(tmp_path):
    write_lines(tmp_path / "train.de", ["eins", "", "drei", "   ", "fünf", "sechs"])
    write_lines(tmp_path / "train.en", ["one", "two", "\t", " ", "five", "six "])
    write_parallel(tmp_path, "valid", pairs(2))
    write_parallel(tmp_path, "test", pairs(2))
    corpus = load_corpus(str(tmp_path), "de", "en")
    assert corpus.splits["train"] == [("eins", "one"), ("fünf", "five"), ("sechs", "six")]
    assert corpus.dropped == {"train": {"empty": 3}}


def test_line_separators_inside_a_sentence_keep_alignment(tmp_path):
    write_lines(tmp_path / "train.de", ["eins\u2028zwei", "drei"])
    write_lines(tmp_path / "train.en", ["one two", "three"])
    corpus = load_corpus(str(tmp_path), "de", "en", carve_valid=0, carve_test=0)
    assert corpus.splits["train"][1] == ("drei", "three")


def test_windows_line_ends_and_a_lone_carriage_return_keep_alignment(tmp_path):
    write_lines(tmp_path / "train.de", ["eins\r", "zwei\rdrei\r", "vier\r"])
    write_lines(tmp_path / "train.en", ["one", "two three", "four"])
    corpus = load_corpus(str(tmp_path), "de", "en", carve_valid=0, carve_test=0)
    assert corpus.splits["train"] == [
        ("eins", "one"),
        ("zwei\rdrei", "two three"),
        ("vier", "four"),
    ]


# --- Big corpora: the training split streams -----------------------------------------------


def big_tsv(folder: Path, n: int) -> Path:
    rows = [
        f"Satz Nummer {i} mit ein paar Wörtern\tsentence number {i} with words" for i in range(n)
    ]
    write_lines(folder / "big.tsv", ["de\ten", *rows])
    return folder / "big.tsv"


def big_parallel(folder: Path, n: int) -> Path:
    write_parallel(folder, "train", pairs(n, "ein etwas längerer "), gz=True)
    write_parallel(folder, "valid", pairs(5, "v"), gz=True)
    write_parallel(folder, "test", pairs(5, "t"), gz=True)
    return folder


@pytest.mark.parametrize("make", [big_tsv, big_parallel], ids=["tsv", "parallel gz"])
def test_the_training_split_streams_instead_of_being_held(tmp_path, make):
    path = make(tmp_path, 40_000)
    text = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    text = max(text, 40_000 * 50)  # the gzipped files' text is larger than the files
    tracemalloc.start()
    try:
        corpus = open_corpus(str(path), "de", "en", carve_valid=10, carve_test=10)
        n_read = sum(1 for _ in corpus.train)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n_read == len(corpus.train) == 40_000 - 20 * (make is big_tsv)
    assert peak < text / 3, f"peak {peak:,} bytes traced while reading {text:,} of text"


def test_a_sample_of_the_training_pairs_is_seeded_uniform_and_in_corpus_order(tmp_path):
    write_parallel(tmp_path, "train", pairs(2000))
    corpus = open_corpus(str(tmp_path), "de", "en", carve_valid=10, carve_test=10)
    train = list(corpus.train)
    sample = corpus.train.sample(100)
    assert len(sample) == 100 and sample == corpus.train.sample(100)
    where = {pair: k for k, pair in enumerate(train)}
    positions = [where[pair] for pair in sample]
    assert positions == sorted(set(positions))  # distinct training pairs, in corpus order
    assert 1000 - 300 < sum(positions) / 100 < 1000 + 300  # from all of it, not its start
    assert corpus.train.sample(len(train)) == train


def test_tsv_row_with_wrong_column_count(tmp_path):
    write_lines(tmp_path / "corpus.tsv", ["de\ten", "a\tb", "c\td\te"])
    with pytest.raises(
        Seq2SeqError, match=r"corpus\.tsv: line 3 has 3 tab-separated columns, expected 2"
    ):
        load_corpus(str(tmp_path / "corpus.tsv"), "de", "en")


def test_unusable_data_values(tmp_path):
    with pytest.raises(Seq2SeqError, match="no such file or folder"):
        load_corpus(str(tmp_path / "missing"), "de", "en")
    with pytest.raises(Seq2SeqError, match="holds no corpus"):
        load_corpus(str(tmp_path), "de", "en")
    with pytest.raises(Seq2SeqError, match="not a file, a folder, a Hub id"):
        load_corpus("no such corpus", "de", "en")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    corpus = load_corpus("sample", "de", "en")
    train = corpus.splits["train"]
    return Tokenizer.train(
        [s for s, _ in train], [t for _, t in train], tmp_path_factory.mktemp("tok"), 400
    )


def test_long_pairs_dropped_from_training_only_and_counted(tokenizer, tmp_path):
    corpus = load_corpus("sample", "de", "en")
    long_pair = (" ".join(["Hund"] * 60), "dog")
    train = [*corpus.splits["train"], long_pair]
    src_ids, tgt_ids, n_long = encode_pairs(train, tokenizer, max_len=50)
    assert n_long == 1 and len(src_ids) == len(tgt_ids) == 40
    assert all(len(ids) <= 50 for ids in src_ids + tgt_ids)
    assert encode_pairs(train, tokenizer, None)[2] == 0
    for split, split_pairs in corpus.splits.items():  # the long pair in train and test
        extra = [long_pair] if split != "validation" else []
        write_parallel(tmp_path / "corpus", split, split_pairs + extra)
    config = Config(data=DataConfig(data=str(tmp_path / "corpus"), vocab_size=400, max_len=50))
    prepare_store(config, tmp_path / "run", False, print)
    report = data_report(config, tmp_path / "run")
    assert report["dropped"] == {"train": {"longer than 50 subwords": 1}}
    assert report["splits"]["train"]["pairs"] == 40 and report["splits"]["test"]["pairs"] == 7
    assert "dropped: train: 1 longer than 50 subwords" in format_data_report(report)


# --- Batches -------------------------------------------------------------------------------

lengths = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=300)


@settings(max_examples=50, deadline=None)
@given(lengths, st.integers(60, 2000), st.integers(0, 2**31), st.integers(0, 5))
def test_batches_respect_the_bound_and_cover_every_pair_once(pair_lengths, max_tokens, seed, epoch):
    src, tgt = [s for s, _ in pair_lengths], [t for _, t in pair_lengths]
    batches = TokenBatchSampler(src, tgt, max_tokens, seed).batches(epoch)
    assert sorted(i for batch in batches for i in batch) == list(range(len(src)))
    for batch in batches:
        assert (
            len(batch) * max(max(src[i] for i in batch), max(tgt[i] for i in batch)) <= max_tokens
        )


def test_same_seed_same_batches_and_epochs_differ():
    src = [5 + i % 17 for i in range(500)]
    tgt = [3 + i % 13 for i in range(500)]

    def batches(sampler, epoch):
        return [b.tolist() for b in sampler.batches(epoch)]

    sampler = TokenBatchSampler(src, tgt, 300, seed=7)
    assert batches(sampler, 0) == batches(TokenBatchSampler(src, tgt, 300, seed=7), 0)
    assert batches(sampler, 0) != batches(sampler, 1)
    assert batches(sampler, 0) != batches(TokenBatchSampler(src, tgt, 300, seed=8), 0)
    unshuffled = TokenBatchSampler(src, tgt, 300, seed=7, shuffle=False)
    assert batches(unshuffled, 0) == batches(unshuffled, 3)


def test_pair_longer_than_the_bound_gets_its_own_batch():
    batches = TokenBatchSampler([5, 50, 5], [5, 5, 5], 20, seed=0).batches(0)
    assert sorted(map(sorted, batches)) == [[0, 2], [1]]


def test_similar_lengths_share_batches_so_padding_is_low():
    src = [1 + (i * 7919) % 40 for i in range(2000)]
    tgt = [s + (i % 3) for i, s in enumerate(src)]
    assert TokenBatchSampler(src, tgt, 1000, seed=1).padding_fraction() < 0.05


def test_the_buckets_are_about_a_dozen_lengths_covering_max_len():
    buckets = Buckets.covering(max_len=100, max_tokens=2048, max_positions=512)
    assert buckets.lengths == tuple(range(16, 105, 8))  # 12 lengths, multiples of 8
    assert Buckets.covering(60, 160, 64).lengths[-1] == 64  # max_len + 1 = 61, rounded up
    assert Buckets.covering(61, 160, 63).lengths[-1] == 63  # at most max_positions
    assert Buckets.covering(60, 62, 64).lengths[-1] == 62  # and at most a batch's tokens
    assert len(Buckets.covering(1000, 4096, 2048).lengths) == N_BUCKETS


@settings(max_examples=40, deadline=None)
@given(lengths, st.integers(62, 2000), st.integers(0, 2**31))
def test_bucketed_batches_fit_their_shape_and_cover_every_pair_once(pair_lengths, max_tokens, seed):
    """Every batch bounded by its bucket's length fits the bucket's shape: one of at most
    a dozen, whatever the pairs' lengths, each at most max_tokens slots a side."""
    buckets = Buckets.covering(max_len=60, max_tokens=max_tokens, max_positions=64)
    src, tgt = [s for s, _ in pair_lengths], [t for _, t in pair_lengths]
    sampler = TokenBatchSampler(src, tgt, max_tokens, seed, buckets=buckets)
    batches, shapes = sampler.batches(0), set()
    assert sorted(i for batch in batches for i in batch) == list(range(len(src)))
    src_ids, tgt_ids = [[7] * (n - 1) for n in src], [[7] * (n - 1) for n in tgt]  # + EOS: n
    for batch in batches:
        padded = collate([src_ids[i] for i in batch], [tgt_ids[i] for i in batch], buckets)
        rows, length = padded.src.shape
        assert padded.tgt_in.shape == padded.tgt_out.shape == (rows, length)
        assert length in buckets.lengths and rows == max_tokens // length
        assert rows * length <= max_tokens
        shapes.add((rows, length))
    assert len(shapes) <= N_BUCKETS


def test_padding_rows_hold_a_source_to_read_and_no_target():
    batch = collate([[10, 11], [12]], [[20], [21, 22]]).padded_to(4, 8)
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (4, 8)
    assert batch.src[:2, :3].tolist() == [[10, 11, EOS_ID], [12, EOS_ID, PAD_ID]]
    assert batch.src[2:, 0].tolist() == [EOS_ID, EOS_ID]  # attention always has a key
    assert batch.tgt_in[2:, 0].tolist() == [BOS_ID, BOS_ID]
    assert (batch.tgt_out[2:] == PAD_ID).all() and (batch.src[:, 3:] == PAD_ID).all()
    assert batch.n_tgt_tokens == 5  # what the loss averages over: the real tokens alone


def test_collate_shapes_and_contents():
    batch = collate([[10, 11, 12], [13]], [[20], [21, 22]])
    assert batch.src.shape == (2, 4) and batch.src.dtype == torch.long
    assert batch.src.tolist() == [[10, 11, 12, EOS_ID], [13, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 20, PAD_ID], [BOS_ID, 21, 22]]
    assert batch.tgt_out.tolist() == [[20, EOS_ID, PAD_ID], [21, 22, EOS_ID]]
    assert batch.n_tgt_tokens == 5
    source_only = collate([[10]], None)
    assert source_only.src.tolist() == [[10, EOS_ID]] and source_only.tgt_in is None


# --- The data command ----------------------------------------------------------------------


def test_data_command_prints_and_saves_the_report(tmp_path, capsys):
    out = tmp_path / "summary.json"
    assert main(["data", "--data", "sample", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "padding" in printed and "does not fit" in printed
    report = json.loads(out.read_text())
    assert report["splits"]["train"]["pairs"] == 40
    assert set(report["splits"]["validation"]["src_lengths"]) == {"p50", "p90", "p99", "max"}
    # Its batches are the trainer's: the same per-side token bound by default.
    assert report["batches"]["max_tokens_per_side"] == DataConfig().max_tokens


def test_the_data_command_reports_the_tokenizer_and_pairs_a_run_prepares(tmp_path, monkeypatch):
    """``seq2seq data`` prepares through the trainer's own assembly: on a corpus larger than
    the tokenizer's sample, the same tokenizer (trained on the sample) and the same counts."""
    monkeypatch.setattr(prepare, "TOKENIZER_SAMPLE", 20)  # fewer than sample's 40 pairs
    run = prepare_data(
        Config(data=DataConfig(data="sample", max_len=36)), tmp_path / "run", Runtime(), False
    )
    out = tmp_path / "report.json"
    assert main(["data", "--data", "sample", "--max-train-len", "36", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    tok = run.tokenizer
    assert report["vocab"] == {"joint": True, "src": tok.src_vocab_size, "tgt": tok.tgt_vocab_size}
    train = report["splits"]["train"]
    assert 0 < train["pairs"] == len(run.train) < 40  # some dropped by length, as in the run
    assert train["src_tokens"] == run.train.src_lengths.sum()
    assert train["tgt_tokens"] == run.train.tgt_lengths.sum()
    assert report["splits"]["validation"]["src_tokens"] == sum(map(len, run.valid_src))
    assert (report["dropped"], report["notes"]) == (run.summary["dropped"], run.summary["notes"])
    # A tokenizer trained on every pair, as the command once trained its own, counts otherwise.
    every = load_corpus("sample", "de", "en").splits["train"]
    whole = Tokenizer.train(
        [s for s, _ in every], [t for _, t in every], tmp_path / "all", fit_to_corpus=True
    )
    assert whole.src_vocab_size != tok.src_vocab_size


def test_a_dataset_with_several_configurations_takes_one_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "CACHE_DIR", tmp_path / "cache")
    folder = tmp_path / "hub_copy"  # the Hub's layout: configurations declared in README.md
    for config, lang in (("de-en", "de"), ("fr-en", "fr")):
        (folder / config).mkdir(parents=True)
        for split, n in (("train", 20), ("validation", 3), ("test", 4)):
            rows = [{"translation": {lang: f"{lang} {i}", "en": f"en {i}"}} for i in range(n)]
            lines = "".join(json.dumps(r) + "\n" for r in rows)
            (folder / config / f"{split}.jsonl").write_text(lines)
    card = ["---", "configs:"]
    for config in ("de-en", "fr-en"):
        card += [f"- config_name: {config}", "  data_files:"]
        card += [
            f"  - split: {s}\n    path: {config}/{s}.jsonl" for s in ("train", "validation", "test")
        ]
    (folder / "README.md").write_text("\n".join([*card, "---", ""]))
    corpus = load_corpus(f"{folder}:fr-en", "fr", "en")
    assert sizes(corpus) == {"train": 20, "validation": 3, "test": 4}
    assert ("fr 0", "en 0") in corpus.splits[
        "train"
    ] and "configuration fr-en" in corpus.source_description
    with pytest.raises(
        Seq2SeqError,
        match=r"Config name is missing.*--data .*:CONFIG \(configurations: de-en, fr-en\)",
    ):
        load_corpus(str(folder), "de", "en")
    assert hub.split_configuration("wmt/wmt14:de-en") == ("wmt/wmt14", "de-en")
    assert hub.split_configuration("pairs.tsv") == ("pairs.tsv", None)


def test_batches_follow_the_per_pair_rule_at_any_size():
    # The rule written pair by pair: add the next pair (sorted by its longer side) unless the
    # batch would then hold more than max_tokens per side, padding included.
    def reference(src, tgt, max_tokens, order):
        batches, batch, longest = [], [], 0
        for i in order:
            longest = max(longest, src[i], tgt[i])
            if batch and (len(batch) + 1) * longest > max_tokens:
                batches.append(batch)
                batch, longest = [], max(src[i], tgt[i])
            batch.append(i)
        return batches + ([batch] if batch else [])

    rng = np.random.default_rng(3)
    for max_tokens in (7, 64, 300, 2048):
        src, tgt = rng.integers(1, 90, 700), rng.integers(1, 90, 700)
        sampler = TokenBatchSampler(src, tgt, max_tokens, seed=0, shuffle=False)
        order = np.lexsort((tgt, src, np.maximum(src, tgt))).tolist()
        got = [b.tolist() for b in sampler.batches(0)]
        assert got == reference(src.tolist(), tgt.tolist(), max_tokens, order), max_tokens


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 2**20)), max_size=400),
    st.sampled_from([3, 90, 2**21]),
    st.integers(0, 2**31),
)
def test_the_packed_length_sort_orders_pairs_as_lexsort_does(pairs, cap, seed):
    # _by_length packs (longer side, source, target, position) into one uint64 sorted in
    # place; lengths too long to pack take np.lexsort. Either way: lexsort's stable order.
    src = np.array([s % cap for s, _ in pairs], dtype=np.int32)
    tgt = np.array([t % cap for _, t in pairs], dtype=np.int32)
    order = np.random.default_rng(seed).permutation(len(pairs)).astype(np.int32)
    got, longer = batching._by_length(order, src, tgt)
    expected = order[np.lexsort((tgt[order], src[order], np.maximum(src, tgt)[order]))]
    assert got.tolist() == expected.tolist()
    assert longer.tolist() == np.maximum(src, tgt)[expected].tolist()
