"""The tokenized training split on disk (seq2seq.data.store) and the run's data made from it
(seq2seq.data.prepare, its ranks seq2seq.training.prepare): what goes in comes out, nothing
half-written is ever read, and a resumed run with an unchanged corpus reads none of it."""

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import child_env

from seq2seq.config import Config, DataConfig, ModelConfig, config_to_dict
from seq2seq.data import prepare
from seq2seq.data.corpora import encode_pairs, load_corpus
from seq2seq.data.prepare import DATA_DIR
from seq2seq.data.store import (
    MANIFEST,
    PairStore,
    PairWriter,
    digest,
    ids_dtype,
    read_manifest,
    write_manifest,
    write_pairs,
)
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.run.runtime import Runtime
from seq2seq.training.prepare import prepare_data

# --- The store ----------------------------------------------------------------------------


def random_pairs(n: int, vocab: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(seed)

    def side() -> list[list[int]]:
        return [rng.integers(0, vocab, rng.integers(1, 30)).tolist() for _ in range(n)]

    return side(), side()


def write_store(directory: Path, src, tgt, vocab: int, chunk: int = 7) -> None:
    with write_pairs(directory, ids_dtype(vocab)) as writer:
        for start in range(0, len(src), chunk):
            writer.append(src[start : start + chunk], tgt[start : start + chunk])
    write_manifest(directory, writer.description())


@pytest.mark.parametrize(
    "vocab, dtype", [(8000, np.uint16), (2**16, np.uint16), (70_000, np.int32)]
)
def test_a_store_gives_back_every_pair_it_was_given(tmp_path, vocab, dtype):
    src, tgt = random_pairs(50, vocab)
    write_store(tmp_path, src, tgt, vocab)
    manifest = read_manifest(tmp_path)
    assert manifest["pairs"] == 50 and np.dtype(manifest["dtype"]) == dtype
    store = PairStore(tmp_path, manifest["dtype"])
    assert len(store) == 50
    assert store.src_lengths.dtype == np.int32
    assert store.src_lengths.tolist() == [len(x) for x in src]
    assert store.tgt_lengths.tolist() == [len(x) for x in tgt]
    indices = [49, 0, 17, 17, 3]
    got_src, got_tgt = store.pairs(indices)
    assert [x.tolist() for x in got_src] == [src[i] for i in indices]
    assert [x.tolist() for x in got_tgt] == [tgt[i] for i in indices]
    assert all(x.dtype == np.int64 for x in got_src + got_tgt)


def test_a_store_of_no_pairs_opens_empty(tmp_path):
    write_store(tmp_path, [], [], 100)
    store = PairStore(tmp_path, read_manifest(tmp_path)["dtype"])
    assert len(store) == 0 and store.pairs([]) == ([], [])


def test_an_error_mid_write_publishes_nothing_and_the_old_store_is_no_longer_trusted(tmp_path):
    src, tgt = random_pairs(30, 100)
    write_store(tmp_path, src, tgt, 100)
    assert read_manifest(tmp_path) is not None
    with pytest.raises(RuntimeError, match="interrupted"), write_pairs(tmp_path, np.uint16) as w:
        w.append(src[:10], tgt[:10])
        raise RuntimeError("interrupted")
    assert read_manifest(tmp_path) is None
    assert sorted(os.listdir(tmp_path)) == []  # no array, no temporary, no old manifest


def test_a_new_store_removes_only_the_files_a_store_is_made_of(tmp_path):
    write_store(tmp_path, *random_pairs(20, 100), 100)
    (tmp_path / "mine.txt").write_text("a corpus of mine")
    (tmp_path / ".src_ids-k3j_9x2a.bin").write_bytes(b"left by a killed writer")
    src, tgt = random_pairs(5, 100, seed=1)
    write_store(tmp_path, src, tgt, 100)
    assert (tmp_path / "mine.txt").read_text() == "a corpus of mine"
    assert not (tmp_path / ".src_ids-k3j_9x2a.bin").exists()
    store = PairStore(tmp_path, read_manifest(tmp_path)["dtype"])
    assert [x.tolist() for x in store.pairs(range(5))[0]] == src


def tamper(name: str, how: str):
    def apply(directory: Path) -> None:
        path = directory / name
        if how == "truncate":
            os.truncate(path, path.stat().st_size - 2)
        elif how == "delete":
            path.unlink()
        elif how == "garble":
            path.write_text("{not json")
        else:  # another format
            manifest = json.loads(path.read_text())
            path.write_text(json.dumps({**manifest, "format": manifest["format"] + 1}))

    return apply


@pytest.mark.parametrize(
    "damage",
    [
        tamper("src_ids.bin", "truncate"),
        tamper("tgt_offsets.bin", "truncate"),
        tamper("tgt_ids.bin", "delete"),
        tamper(MANIFEST, "delete"),
        tamper(MANIFEST, "garble"),
        tamper(MANIFEST, "format"),
    ],
    ids=["ids cut", "offsets cut", "ids gone", "no manifest", "bad manifest", "other format"],
)
def test_a_store_that_disagrees_with_its_manifest_is_not_trusted(tmp_path, damage):
    write_store(tmp_path, *random_pairs(20, 100), 100)
    damage(tmp_path)
    assert read_manifest(tmp_path) is None


def test_a_store_pickles_as_its_files_not_its_arrays(tmp_path):
    src, tgt = random_pairs(2000, 8000)
    write_store(tmp_path, src, tgt, 8000, chunk=500)
    store = PairStore(tmp_path, read_manifest(tmp_path)["dtype"])
    data = pickle.dumps(store)
    assert len(data) < 1000  # the arrays are ~60 kB
    copy = pickle.loads(data)
    assert [x.tolist() for x in copy.pairs([5, 1999])[1]] == [tgt[5], tgt[1999]]


def _mapped_file_kb() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(ln for ln in status.splitlines() if ln.startswith("RssFile:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="Linux's /proc")
def test_reading_pairs_maps_none_of_the_store_into_the_process(tmp_path):
    # A memory map would count every page a batch touched (and its neighbours) in the
    # process's resident memory; the store is read, so the page cache holds it instead.
    src, tgt = random_pairs(50_000, 8000)
    write_store(tmp_path, src, tgt, 8000, chunk=5000)
    store = PairStore(tmp_path, read_manifest(tmp_path)["dtype"])
    files = sum(f.stat().st_size for f in tmp_path.iterdir()) // 1024
    before = _mapped_file_kb()
    picked = np.random.default_rng(1).integers(0, len(store), 5000)
    got_src, _ = store.pairs(picked)
    assert _mapped_file_kb() - before < files // 4  # a map of them grows by about all of it
    assert [got_src[i].tolist() for i in (0, 4999)] == [src[picked[0]], src[picked[4999]]]
    with pytest.raises(IndexError, match=r"pair indices must be in \[0, 50000\)"):
        store.pairs([0, 50_000])


def test_without_pread_a_store_reads_the_same_pairs(tmp_path, monkeypatch):
    # Windows has no os.pread: a seek and a read on the call's own descriptor stand in
    src, tgt = random_pairs(300, 8000)
    write_store(tmp_path, src, tgt, 8000)
    store = PairStore(tmp_path, read_manifest(tmp_path)["dtype"])
    picked = [299, 0, 17, 17, 150]
    with_pread = store.pairs(picked)
    monkeypatch.delattr(os, "pread")
    without = store.pairs(picked)
    for side, expected in zip(without, (src, tgt), strict=True):
        assert [x.tolist() for x in side] == [expected[i] for i in picked]
    assert all(np.array_equal(a, b) for a, b in zip(with_pread[1], without[1], strict=True))


def test_a_writer_refuses_sides_of_different_lengths(tmp_path):
    with write_pairs(tmp_path, np.uint16) as writer:
        assert isinstance(writer, PairWriter)
        with pytest.raises(ValueError, match="2 sources but 1 targets"):
            writer.append([[1], [2]], [[3]])


# --- A run's data ---------------------------------------------------------------------------


def tsv_corpus(path: Path, n: int, extra: str = "") -> Path:
    rows = ["de\ten"]
    for i in range(n):
        if i % 50 == 7:
            rows.append(" \t ")  # empty: dropped and counted
        elif i % 10 == 3:
            rows.append(" ".join(["Hund"] * 40) + f"\tdog {i}")  # too long for max_len
        else:
            rows.append(f"{extra}der Hund Nummer {i} läuft\t{extra}the dog number {i} runs")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def config_for(data: Path) -> Config:
    return Config(
        data=DataConfig(data=str(data), vocab_size=200, max_len=30, carve_valid=30, carve_test=20),
        model=ModelConfig(max_positions=32),
    )


def prepared_pairs(data) -> list:
    return [[x.tolist() for x in side] for side in data.train.pairs(range(len(data.train)))]


def test_the_store_holds_the_encoded_training_pairs_and_the_summary_counts_the_rest(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(prepare, "_ENCODE_CHUNK", 9)  # many chunks
    config = config_for(tsv_corpus(tmp_path / "c.tsv", 400))
    run = tmp_path / "run"
    data = prepare_data(config, run, Runtime(), resume=False)
    corpus = load_corpus(str(tmp_path / "c.tsv"), "de", "en", carve_valid=30, carve_test=20)
    src, tgt, n_long = encode_pairs(corpus.splits["train"], data.tokenizer, 30)
    assert prepared_pairs(data) == [src, tgt]
    assert data.train.src_lengths.tolist() == [len(x) for x in src]
    assert 0 < n_long <= 40  # the 40-word sources left in train
    assert data.summary["pairs"] == {"train": len(src), "validation": 30, "test": 20}
    assert data.summary["dropped"] == {"train": {"empty": 8, "longer than 30 subwords": n_long}}
    assert data.valid_refs == [t for _, t in corpus.splits["validation"]]
    assert data.valid_sources == [s for s, _ in corpus.splits["validation"]]
    valid_src = encode_pairs(corpus.splits["validation"], data.tokenizer, None)[0]
    assert data.valid_src == [ids[:31] for ids in valid_src]  # room for EOS in 32 positions
    assert max(map(len, valid_src)) > 31  # a long pair was carved into validation


def test_a_resume_with_the_corpus_unchanged_reads_no_corpus_and_trains_no_tokenizer(
    tmp_path, monkeypatch
):
    config = config_for(tsv_corpus(tmp_path / "c.tsv", 300))
    run = tmp_path / "run"
    first = prepare_data(config, run, Runtime(), resume=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("a resume with an unchanged corpus read it or trained a tokenizer")

    monkeypatch.setattr(prepare, "open_corpus", forbidden)
    monkeypatch.setattr(Tokenizer, "train", forbidden)
    again = prepare_data(config, run, Runtime(), resume=True)
    assert prepared_pairs(again) == prepared_pairs(first)
    assert (again.valid_src, again.valid_tgt) == (first.valid_src, first.valid_tgt)
    assert (again.valid_refs, again.valid_sources) == (first.valid_refs, first.valid_sources)
    assert again.summary == first.summary


def test_a_resume_after_the_corpus_changed_encodes_it_again_with_the_runs_tokenizer(
    tmp_path, monkeypatch, capsys
):
    corpus = tsv_corpus(tmp_path / "c.tsv", 300)
    run = tmp_path / "run"
    first = prepare_data(config_for(corpus), run, Runtime(), resume=False)
    spm = (run / "spm.model").read_bytes()
    tsv_corpus(corpus, 350)
    monkeypatch.setattr(Tokenizer, "train", lambda *a, **k: pytest.fail("tokenizer retrained"))
    again = prepare_data(config_for(corpus), run, Runtime(), resume=True)
    assert len(again.train) > len(first.train)
    assert (run / "spm.model").read_bytes() == spm
    said = capsys.readouterr().err
    assert "note: the corpus files changed since this run's data was prepared" in said
    assert "the training pairs differ" in said and "the resume is no longer exact" in said


def test_a_resume_whose_corpus_files_were_only_touched_says_it_stays_exact(tmp_path, capsys):
    corpus = tsv_corpus(tmp_path / "c.tsv", 300)
    run = tmp_path / "run"
    first = prepare_data(config_for(corpus), run, Runtime(), resume=False)
    # A store written before stores kept their digest: the resume computes the old one.
    manifest = read_manifest(run / DATA_DIR)
    written = manifest.pop("sha256")
    write_manifest(run / DATA_DIR, manifest)
    os.utime(corpus, (1, 1))  # a fresh clone or a copy: new times, the same text
    capsys.readouterr()
    again = prepare_data(config_for(corpus), run, Runtime(), resume=True)
    assert prepared_pairs(again) == prepared_pairs(first)
    assert read_manifest(run / DATA_DIR)["sha256"] == written
    assert "the same training pairs, so the resume stays exact" in capsys.readouterr().err


@pytest.mark.parametrize("vocab", [8000, 70_000])
def test_a_stores_digest_is_that_of_its_pairs_whatever_the_chunks_or_id_type(tmp_path, vocab):
    src, tgt = random_pairs(40, 8000)
    write_store(tmp_path / "a", src, tgt, 8000, chunk=3)
    write_store(tmp_path / "b", src, tgt, vocab, chunk=40)
    a, b = read_manifest(tmp_path / "a"), read_manifest(tmp_path / "b")
    assert a["sha256"] == b["sha256"] == digest(tmp_path / "a", a) == digest(tmp_path / "b", b)
    write_store(tmp_path / "c", src, [*tgt[:-1], tgt[-1] + [1]], 8000)
    assert read_manifest(tmp_path / "c")["sha256"] != a["sha256"]


STALE_RANK = """
import sys
from pathlib import Path
import torch.distributed as dist
from seq2seq.config import config_from_dict
from seq2seq.errors import Seq2SeqError
from seq2seq.training.prepare import prepare_data
from seq2seq.run.runtime import Runtime
import json

dist.init_process_group("gloo")
rank = dist.get_rank()
config = config_from_dict(json.loads(sys.argv[1]))
run = Path(sys.argv[2 + rank])  # rank 1 reads a copy of the run directory: another machine's
try:
    prepare_data(config, run, Runtime(rank=rank, world=2), resume=True)
    print(f"rank {rank}: prepared")
except Seq2SeqError as e:
    print(f"rank {rank}: error: {e}")
dist.destroy_process_group()
"""


def test_every_rank_checks_that_its_store_was_made_for_rank_0s_corpus(tmp_path):
    corpus = tsv_corpus(tmp_path / "c.tsv", 300)
    config = config_for(corpus)
    prepare_data(config, tmp_path / "run", Runtime(), resume=False)
    shutil.copytree(tmp_path / "run", tmp_path / "stale")
    tsv_corpus(corpus, 350)  # rank 0's corpus changes; the stale copy keeps the old store
    script = tmp_path / "stale_rank.py"
    script.write_text(STALE_RANK)
    env = child_env(MASTER_ADDR="127.0.0.1")
    result = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(script), json.dumps(config_to_dict(config)),
            str(tmp_path / "run"), str(tmp_path / "stale"),
        ],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert "rank 0: prepared" in result.stdout, result.stderr[-2000:]
    assert (
        "rank 1: error: rank 1 finds in " in result.stdout
        and "a corpus prepared for another corpus files than rank 0's" in result.stdout
    ), result.stdout


KILLED_PREPARATION = """
import json, os, signal, sys
from pathlib import Path
from seq2seq.data import prepare, store
from seq2seq.config import config_from_dict
from seq2seq.run.runtime import Runtime
from seq2seq.training.prepare import prepare_data

prepare._ENCODE_CHUNK = 10
append = store.PairWriter.append

def append_then_die(self, src, tgt):
    append(self, src, tgt)
    if self.n_pairs >= 50:
        os.kill(os.getpid(), signal.SIGKILL)

store.PairWriter.append = append_then_die
config = config_from_dict(json.loads(sys.argv[1]))
prepare_data(config, Path(sys.argv[2]), Runtime(), resume=False)
"""


def test_a_preparation_killed_mid_write_is_not_trusted_and_is_redone(tmp_path):
    config = config_for(tsv_corpus(tmp_path / "c.tsv", 300))
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_PREPARATION, json.dumps(config_to_dict(config)), str(run)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    left = os.listdir(run / DATA_DIR)
    assert left and MANIFEST not in left  # temporaries of the arrays, and no manifest
    assert read_manifest(run / DATA_DIR) is None
    resumed = prepare_data(config, run, Runtime(), resume=True)
    whole = prepare_data(config, tmp_path / "whole", Runtime(), resume=False)
    assert prepared_pairs(resumed) == prepared_pairs(whole)
    assert not [name for name in os.listdir(run / DATA_DIR) if name.startswith(".")]


def test_a_corpus_smaller_than_the_sample_trains_the_tokenizer_on_every_pair(tmp_path, monkeypatch):
    prepare_data(Config(data=DataConfig(data="sample")), tmp_path / "run", Runtime(), False)
    train = load_corpus("sample", "de", "en").splits["train"]
    Tokenizer.train(
        [s for s, _ in train], [t for _, t in train], tmp_path / "all", fit_to_corpus=True
    )
    spm = (tmp_path / "run" / "spm.model").read_bytes()
    assert spm == (tmp_path / "all" / "spm.model").read_bytes()
    monkeypatch.setattr(prepare, "TOKENIZER_SAMPLE", 20)  # fewer than sample's 40 pairs
    prepare_data(Config(data=DataConfig(data="sample")), tmp_path / "run20", Runtime(), False)
    assert (tmp_path / "run20" / "spm.model").read_bytes() != spm
