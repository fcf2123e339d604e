"""Subword regularisation: BPE-dropout that is SentencePiece's segmentation at alpha 0, a
function of (seed, epoch, side), sampled per epoch from the store, training pairs only; the
worker in a session of its own at low priority, stopped by the trainer on a signal; under
torchrun sampled by rank 0 alone."""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from helpers import child_env
from test_train import (
    REPO,
    SAMPLE,
    SUBPROCESS_TIMEOUT_S,
    needs_gloo,
    read_metrics,
    subprocess_env,
    tiny_config,
    torchrun,
    train_losses,
    write_tiny_yaml,
)

from seq2seq.data.prepare import DATA_DIR
from seq2seq.data.store import PairStore, read_manifest
from seq2seq.data.subword import (
    SAMPLED_DIR,
    BpeDropout,
    EpochSampler,
    subword_rng,
    worker_env,
    write_sampled_epoch,
)
from seq2seq.data.tokenizer import JOINT_FILE, Tokenizer
from seq2seq.run import checkpoint
from seq2seq.training.entry import train

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


# ---------------------------------------------------------------------------------------
# The worker process: its session, priority and environment, and stopping it.

SAMPLING = {"data__subword_alpha": 0.3, "data__subword_epochs": "[0,0]", **MERGES}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[PairStore, dict[str, Path]]:
    """A tiny run's store and tokenizer models, to sample from."""
    run = tmp_path_factory.mktemp("prepared") / "run"
    train(tiny_config(train__max_steps=1, **MERGES), run, progress=False)
    store = PairStore(run / DATA_DIR, read_manifest(run / DATA_DIR)["dtype"])
    return store, Tokenizer.model_files(run)


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="waits for the worker without reaping it")
def test_the_worker_runs_in_a_session_of_its_own_at_low_priority(prepared, tmp_path):
    sampler = EpochSampler(*prepared, lambda epoch: 0.2, 1, 60, tmp_path / SAMPLED_DIR)
    with sampler:
        assert sampler.sample(0)  # epoch 0 sampled, epoch 1's worker started
        worker = sampler.workers[1]
        # a Ctrl-C at the terminal goes to its foreground process group: not the worker's
        assert os.getsid(worker.pid) == worker.pid != os.getsid(0)
        assert os.getpgid(worker.pid) != os.getpgid(0)
        os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, worker.pid) == min(ours + 10, 19)
        assert len(sampler.read(1)) == len(prepared[0])


def test_the_workers_pythonpath_has_this_seq2seq_first_and_no_empty_entry():
    root = str(REPO)
    assert worker_env({"HOME": "/h"}) == {"HOME": "/h", "PYTHONPATH": root}
    for given in ("", os.pathsep, f"/a{os.pathsep}{os.pathsep}/b{os.pathsep}"):
        found = worker_env({"PYTHONPATH": given})["PYTHONPATH"].split(os.pathsep)
        assert found[0] == root and "" not in found, given


def test_a_stop_while_waiting_for_the_sampling_stops_the_worker(prepared, tmp_path):
    sampler, started = (
        EpochSampler(*prepared, lambda epoch: 0.2, 1, 60, tmp_path / SAMPLED_DIR),
        [],
    )

    def stopping() -> bool:  # a signal came while the trainer waited
        started.extend(sampler.workers.values())
        return True

    with sampler:
        assert not sampler.sample(0, stopping)
        assert sampler.workers == {} and started[0].returncode == -signal.SIGKILL
    assert list((tmp_path / SAMPLED_DIR).glob("epoch_*")) == []


def test_a_signal_while_the_trainer_waits_on_the_sampling_is_a_clean_stop(
    tmp_path, monkeypatch, capsys
):
    run, sample = tmp_path / "run", EpochSampler.sample

    def signalled(self, *args):  # the stop button, pressed as the first epoch's sampling starts
        signal.raise_signal(signal.SIGINT)
        return sample(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(EpochSampler, "sample", signalled)
        state = train(tiny_config(train__max_steps=3, **SAMPLING), run, progress=False)
    assert (state["step"], state["stop_reason"]) == (0, "signal SIGINT")
    assert "stopped: signal SIGINT" in capsys.readouterr().err
    assert list((run / SAMPLED_DIR).glob("epoch_*")) == []
    state = train(tiny_config(train__max_steps=3, **SAMPLING), run, resume=True, progress=False)
    assert state["step"] == 3


def sampling_worker(parent: int) -> int | None:
    """The pid of a subword worker that ``parent`` started, if one runs."""
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or int((proc / "stat").read_text().split()[3]) != parent:
                continue
            if b"seq2seq.data.subword" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except (OSError, IndexError, ValueError):
            continue
    return None


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the worker in /proc")
def test_ctrl_c_at_the_terminal_while_the_trainer_waits_on_the_sampling_stops_cleanly(tmp_path):
    corpus = tmp_path / "corpus.tsv"  # 8,000 pairs: a worker busy for a while
    de, en = ((SAMPLE / f"train.{lang}").read_text().splitlines() for lang in ("de", "en"))
    lines = "".join(f"{s}\t{t}\n" for s, t in zip(de, en, strict=True))
    corpus.write_text(lines * 200, encoding="utf-8")
    config = write_tiny_yaml(
        tmp_path / "tiny.yaml", data__data=str(corpus), train__max_steps=100000, **SAMPLING
    )
    command = [sys.executable, "-m", "seq2seq", "train", "--no-progress", "--config", str(config)]
    proc = subprocess.Popen(
        [*command, "--out", str(tmp_path / "run")],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's foreground process group, of its own
    )
    try:
        deadline = time.time() + SUBPROCESS_TIMEOUT_S
        while sampling_worker(proc.pid) is None:  # epoch 0's: the trainer waits on it
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]  # saved, not finished
    assert "stopped: signal SIGINT" in err and "Traceback" not in err and "error" not in err
    assert list((tmp_path / "run" / SAMPLED_DIR).glob("epoch_*")) == []


@needs_gloo
def test_under_torchrun_rank_0_alone_samples_and_the_ranks_train_as_one_process(tmp_path):
    steps = 6  # an epoch is 4 steps of 2 batches here: into the second sampled epoch
    changes = {"train__max_steps": steps, "model__dropout": 0.0, **SAMPLING}
    config_file = write_tiny_yaml(tmp_path / "tiny.yaml", **changes)
    args = ["-m", "seq2seq", "train", "--no-progress", "--config", str(config_file)]
    result = torchrun([*args, "--out", str(tmp_path / "ddp")])
    assert result.returncode == 0, result.stderr[-3000:]
    train(tiny_config(**changes, train__accum_steps=2), tmp_path / "single", progress=False)
    ddp, single = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "single")
    assert sorted(ddp) == sorted(single) == list(range(1, steps + 1))
    for step in ddp:  # every rank read rank 0's sampled pairs
        assert ddp[step] == pytest.approx(single[step], rel=1e-4), step
    sampled = [
        sorted(p.name for p in (tmp_path / run / SAMPLED_DIR).iterdir())
        for run in ("ddp", "single")
    ]
    epoch = checkpoint.read_tensors(tmp_path / "ddp" / checkpoint.LAST_FILE)[1]["epoch"]
    assert epoch >= 1
    assert sampled[0] == sampled[1] == [f"epoch_{epoch}"]  # one store an epoch, not one a rank
