"""Subword regularisation: BPE-dropout that is SentencePiece's segmentation at alpha 0, a
function of (seed, epoch, side), sampled per epoch from the store, training pairs only."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys

import numpy as np
import pytest
import sentencepiece as spm
from helpers import child_env
from test_train import SAMPLE, read_metrics, tiny_config

from seq2seq.data.prepare import DATA_DIR
from seq2seq.data.store import PairStore, read_manifest
from seq2seq.data.subword import (
    SAMPLED_DIR,
    BpeDropout,
    EpochSampler,
    subword_rng,
    write_sampled_epoch,
)
from seq2seq.data.tokenizer import JOINT_FILE, Tokenizer
from seq2seq.training.trainer import train

MERGES = {"data__vocab_size": 400}  # the tiny runs' 308 pieces are characters: nothing to drop
UNSEEN = "Ein Ölgemälde ☃ zeigt 日本 — naïve Grüße!"  # characters the sample never shows


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> spm.SentencePieceProcessor:
    texts = [
        line
        for name in ("train.de", "train.en")
        for line in (SAMPLE / name).read_text(encoding="utf-8").splitlines()
    ]
    folder = tmp_path_factory.mktemp("spm")
    Tokenizer.train(texts, texts, folder, vocab_size=400)
    return spm.SentencePieceProcessor(model_file=str(folder / JOINT_FILE))


def sentences() -> list[str]:
    lines = (SAMPLE / "train.de").read_text(encoding="utf-8").splitlines()
    return lines + (SAMPLE / "train.en").read_text(encoding="utf-8").splitlines() + [UNSEEN]


def test_without_dropout_the_merges_are_sentencepieces_own(model):
    dropout = BpeDropout(model)
    for text in sentences():
        ids = model.encode(text, out_type=int)
        assert dropout.text(np.array(ids)) == model.normalize(text)
        assert dropout.sample(dropout.text(np.array(ids)), 0.0, random.Random(0)) == ids, text


def test_dropout_spells_the_same_text_in_more_pieces_as_sentencepieces_sampler_does(model):
    dropout, texts = BpeDropout(model), sentences() * 20
    rng = random.Random(0)
    ours = [dropout.sample(dropout.text(np.array(model.encode(t))), 0.1, rng) for t in texts]
    theirs = model.encode(texts, out_type=int, enable_sampling=True, alpha=0.1, nbest_size=-1)
    plain = model.encode(texts, out_type=int)
    assert [model.decode(ids) for ids in ours] == [model.decode(ids) for ids in plain]
    mean = {name: statistics.mean(map(len, x)) for name, x in [("ours", ours), ("spm", theirs)]}
    assert mean["ours"] > 1.1 * statistics.mean(map(len, plain))
    assert mean["ours"] == pytest.approx(mean["spm"], rel=0.03), mean


def test_the_sample_is_a_function_of_seed_epoch_and_side(model):
    dropout = BpeDropout(model)
    text = dropout.text(np.array(model.encode(sentences()[0])))

    def draws(seed, epoch, side):
        rng = subword_rng(seed, epoch, side)
        return [dropout.sample(text, 0.3, rng) for _ in range(20)]

    assert draws(1, 3, "src") == draws(1, 3, "src")
    for other in [(2, 3, "src"), (1, 4, "src"), (1, 3, "tgt")]:
        assert draws(*other) != draws(1, 3, "src"), other


def test_an_epoch_is_sampled_from_the_store_into_a_store_of_its_own(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(train__max_steps=1, **MERGES), run, progress=False)
    store = PairStore(run / DATA_DIR, read_manifest(run / DATA_DIR)["dtype"])
    models = Tokenizer.model_files(run)
    for epoch in (0, 1):
        write_sampled_epoch(store, models, 0.2, 1, epoch, 60, tmp_path / f"e{epoch}")
    e0, e1 = (PairStore(tmp_path / f"e{e}", store.dtype.name) for e in (0, 1))
    assert len(e0) == len(e1) == len(store)
    assert (e0.tgt_lengths >= store.tgt_lengths).all() and (e0.src_lengths.max() <= 60)
    assert e0.src_lengths.sum() > store.src_lengths.sum()
    every = range(len(store))
    lists = [[ids.tolist() for ids in found.pairs(every)[1]] for found in (e0, e1)]
    assert lists[0] != lists[1]  # each epoch its own
    tokenizer = Tokenizer.load(run)
    decoded = [
        [tokenizer.decode(ids.tolist(), "src") for ids in found.pairs(range(len(store)))[0]]
        for found in (store, e0)
    ]
    assert decoded[0] == decoded[1]  # the same sentences, other pieces


def test_off_before_its_epochs_trains_exactly_as_without_and_then_changes_the_batches(tmp_path):
    # epoch 0 is the store's segmentation in both runs, epoch 1 is not
    plain = tiny_config(train__max_steps=12, **MERGES)
    sampled = tiny_config(
        train__max_steps=12, data__subword_alpha=0.3, data__subword_epochs="[1,1]", **MERGES
    )
    rows = {}
    for name, config in (("plain", plain), ("sampled", sampled)):
        train(config, tmp_path / name, progress=False)
        rows[name] = [(r["epoch"], r["loss"]) for r in read_metrics(tmp_path / name, "train")]
    epoch0 = [row for row in rows["plain"] if row[0] == 0]
    assert 0 < len(epoch0) < 11  # the run reaches epoch 1
    assert rows["sampled"][: len(epoch0)] == epoch0  # bit for bit
    assert rows["sampled"][len(epoch0)] != rows["plain"][len(epoch0)]
    # the store (and the validation pairs in its manifest) are the deterministic ones
    stores = [(tmp_path / run / DATA_DIR) for run in ("plain", "sampled")]
    for name in ("src_ids.bin", "tgt_ids.bin"):
        assert (stores[0] / name).read_bytes() == (stores[1] / name).read_bytes()
    assert read_manifest(stores[0])["valid"] == read_manifest(stores[1])["valid"]
    assert not (tmp_path / "plain" / SAMPLED_DIR).exists()
    assert [p.name for p in (tmp_path / "sampled" / SAMPLED_DIR).iterdir()] == ["epoch_1"]


def test_a_run_that_stops_leaves_no_half_sampled_epoch(tmp_path):
    """The next epoch's worker, stopped with the run, may have written part of its store: it
    goes with the worker (a resumed run samples that epoch again), whatever the timing."""
    directory = tmp_path / SAMPLED_DIR
    sampler = EpochSampler(None, {}, lambda epoch: 0.1, 0, 100, directory)
    (directory / "epoch_1").mkdir(parents=True)  # the current epoch's finished store
    (directory / "epoch_2").mkdir()
    (directory / "epoch_2" / "src_ids.bin").write_bytes(b"\0" * 64)  # written so far
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    sampler.workers[2] = subprocess.Popen(sleeper, env=child_env(), text=True)
    with sampler:
        pass
    assert [p.name for p in directory.iterdir()] == ["epoch_1"]
    assert sampler.workers == {}
