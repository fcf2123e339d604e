"""The trainer: learning, exact resume, early stopping, attention maps, signals, precision, DDP.

Every run is a tiny model on the committed sample corpus (40 training pairs, which a
308-piece vocabulary cuts into ~35 subwords a sentence): ``data.max_tokens=160`` makes an
epoch 11 batches, so a run can stop mid-epoch and resume from a data position.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from helpers import TINY_RUN, assert_trained_alike, child_env, no_host_reads

from seq2seq.config import load_config
from seq2seq.errors import Seq2SeqError
from seq2seq.run import checkpoint
from seq2seq.run.precision import autocast_dtype
from seq2seq.run.runtime import Runtime, seed_ranks
from seq2seq.training.entry import train

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
SUBPROCESS_TIMEOUT_S = 300  # importing torch alone takes ~20 s on the shared 2-core machine

TINY = {
    **dict(setting.split("=", 1) for setting in TINY_RUN),
    "data.max_len": 60,
    "data.max_tokens": 160,
    "model.max_positions": 64,
    "model.dropout": 0.1,
    "train.threads": 1,
    "train.valid_bleu_sentences": 2,
    "train.log_every": 1,
    "train.warmup_steps": 10,
    "train.lr": 0.003,
    "train.precision": "fp32",  # bf16 where the CPU has it changes the last digits compared
    "train.keep_last": 0,  # no checkpoint averaging unless a test asks for it
    "train.average_last": 0,
    # The cool-down follows a step budget too; these tests interrupt a run by giving it a
    # smaller budget, which resumes exactly only without one (tests that want it set it).
    "train.cooldown": 0,
}


def tiny_overrides(**changes: object) -> list[str]:
    """``--set`` strings for the tiny config; ``train__max_steps=5`` sets ``train.max_steps``."""
    values = {**TINY, **{k.replace("__", "."): v for k, v in changes.items()}}
    return [f"{k}={'null' if v is None else v}" for k, v in values.items()]


def tiny_config(**changes: object):
    return load_config(None, tiny_overrides(**changes))


def write_tiny_yaml(path: Path, **changes: object) -> Path:
    """The tiny config as a ``--config`` file."""
    sections: dict[str, dict] = {}
    for text in tiny_overrides(**changes):
        key, value = text.split("=", 1)
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(sections))
    return path


def read_metrics(run_dir: Path, kind: str) -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")}


def file_digests(folder: Path) -> dict[str, str]:
    """The sha256 of every file under ``folder``, by relative path."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def subprocess_env() -> dict[str, str]:
    return child_env(PYTHONPATH=str(REPO))


@pytest.mark.parametrize("optimizer", ["adam", "muon"])
def test_loss_falls_well_below_the_start(tmp_path, optimizer):
    config = tiny_config(train__max_steps=100, train__optimizer=optimizer)
    state = train(config, tmp_path / "run", progress=False)
    losses = list(train_losses(tmp_path / "run").values())
    assert state["step"] == 100 and len(losses) == 100
    assert max(losses[-10:]) < 0.6 * losses[0], (losses[0], losses[-10:])
    valid = read_metrics(tmp_path / "run", "valid")
    assert valid[-1]["loss"] < valid[0]["loss"]
    assert (tmp_path / "run" / checkpoint.BEST_FILE).is_file()


def test_two_vocabularies_train_with_their_own_embeddings(tmp_path):
    config = tiny_config(
        train__max_steps=2, data__joint_vocab="false", model__share_embeddings="false"
    )
    assert train(config, tmp_path / "run", progress=False)["step"] == 2
    model = checkpoint.load_config_file(tmp_path / "run").model
    assert model.src_vocab_size != model.tgt_vocab_size, "the sample's sides share every piece"


@pytest.mark.parametrize(
    "subwords",
    # subword sampling with a vocabulary that has merges to drop (the default 308 has none)
    # and Muon for the layers' matrices, with a moving average of the weights, in fp16 whose
    # loss scale (2**17, doubling after 5 clean steps to 2**18, which overflows) skips steps
    [
        {},
        {"data__subword_alpha": 0.2, "data__subword_epochs": "[0,1]", "data__vocab_size": 400},
        {"train__optimizer": "muon", "train__ema": 0.9, "train__precision": "fp16"},
    ],
    ids=["store", "subword-sampling", "muon-ema-fp16"],
)
def test_resume_reaches_the_same_loss_as_an_uninterrupted_run(tmp_path, monkeypatch, subwords):
    from seq2seq.training import scaling

    monkeypatch.setattr(scaling, "LOSS_SCALE", {"init_scale": 2.0**17, "growth_interval": 5})
    total = 26  # crosses two epoch ends (11 batches an epoch)
    # with dropout rising from 0 to 0.3 over epoch 1: the schedule is resumed with the rest;
    # with subword sampling too, each epoch's pairs are sampled again from the seed
    ramp = {"model__dropout": 0.3, "train__early_dropout": 0.0, "train__dropout_epochs": "[1,2]"}
    ramp |= subwords
    whole = train(
        tiny_config(train__max_steps=total, **ramp), tmp_path / "straight", progress=False
    )
    # Interrupted twice, both times mid-epoch: step 7 of epoch 0 and step 5 of epoch 1.
    for stop, resume in ((7, False), (16, True), (total, True)):
        state = train(
            tiny_config(train__max_steps=stop, **ramp),
            tmp_path / "interrupted",
            resume=resume,
            progress=False,
        )
        assert state["step"] == stop
    assert (state["epoch"], state["batch"]) == (whole["epoch"], whole["batch"])
    assert state["scaler_skips"] == whole["scaler_skips"]
    assert (state["scaler_skips"] > 0) == ("train__precision" in subwords)
    # 26 batches in 11-batch epochs, unless sampling changed the epochs or skips took batches
    if not subwords.keys() & {"data__subword_alpha", "train__precision"}:
        assert (state["epoch"], state["batch"]) == (2, 4)

    straight, interrupted = (
        train_losses(tmp_path / "straight"),
        train_losses(tmp_path / "interrupted"),
    )
    assert sorted(interrupted) == list(range(1, total + 1))  # nothing logged twice or lost
    for step in range(1, total + 1):
        assert interrupted[step] == pytest.approx(straight[step], rel=0, abs=1e-6), step
    a, saved_a = checkpoint.read_tensors(tmp_path / "straight" / checkpoint.LAST_FILE)
    b, saved_b = checkpoint.read_tensors(tmp_path / "interrupted" / checkpoint.LAST_FILE)
    assert a.keys() == b.keys()
    for name in a:  # weights, optimizer moments, the moving average and RNG state alike
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    assert any(name.startswith("ema.") for name in a) == ("train__ema" in subwords)
    # fp16's loss scaler: its scale and its count of clean steps towards growing it
    assert saved_a.get("loss_scaler") == saved_b.get("loss_scaler")
    assert ("loss_scaler" in saved_a) == ("train__precision" in subwords)


def test_resuming_a_finished_run_takes_no_extra_step_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    averaging = dict(train__validate_every=2, train__keep_last=2, train__average_last=2)
    train(tiny_config(train__max_steps=4, **averaging), run, progress=False)
    (run / "hyps.test.en.txt").write_text("scored\n")  # the weights stay, so do their scores
    before = file_digests(run)
    # budgets that end the run where it is, some of them new: none is written into config.yaml
    again = tiny_config(train__max_steps=4, train__patience=7, train__log_every=2, **averaging)
    state = train(again, run, resume=True, progress=False)
    assert state["step"] == 4 and state["stop_reason"] == "max_steps 4"
    assert "already finished (max_steps 4); nothing to do" in capsys.readouterr().err
    # nothing redone or rewritten: no config, environment segment, log line or metrics row
    assert file_digests(run) == before


def test_a_step_budget_alone_means_no_time_budget_and_cools_down_over_its_steps(tmp_path, capsys):
    from seq2seq.training.optim import inverse_sqrt

    config = tiny_config(train__max_steps=20, train__cooldown=0.5)
    assert config.train.max_time is None  # not the default 30 minutes as well
    train(config, tmp_path / "run", progress=False)
    err = capsys.readouterr().err
    assert "budget: 20 steps; the learning rate cools down to zero over its last 50%" in err
    schedule = inverse_sqrt(10)
    factors = [
        r["lr"] / (0.003 * schedule(r["step"])) for r in read_metrics(tmp_path / "run", "train")
    ]
    # step k is taken with (k - 1) / 20 of the budget spent: full rate to step 11, then linear
    expected = [min(1.0, (1 - (k - 1) / 20) / 0.5) for k in range(1, 21)]
    assert factors == pytest.approx(expected)
    timed = tiny_config(train__max_steps=20, train__max_time=5)  # both given: both in force
    assert (timed.train.max_time, timed.train.max_steps) == (5, 20)


def test_early_stopping_with_patience(tmp_path):
    # A learning rate this small leaves greedy output, hence BLEU, unchanged: the first
    # validation is the best and the second one uses up a patience of 1.
    config = tiny_config(
        train__lr="0.000000001", train__patience=1, train__max_epochs=10, data__max_tokens=1000
    )
    state = train(config, tmp_path / "run", progress=False)
    assert state["stop_reason"] == "no BLEU improvement in 1 validations"
    assert state["epoch"] == 2 and state["best_step"] < state["step"]
    assert len(read_metrics(tmp_path / "run", "valid")) == 2


def test_validation_line_and_attention_maps(tmp_path, capsys):
    state = train(  # validated at the end of epoch 1 (step 11), then at the budget's end
        tiny_config(train__max_steps=13, train__attention_sentences=2),
        tmp_path / "run",
        progress=False,
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("step 11 epoch 1: valid loss")]
    assert len(lines) == 1 and all(w in lines[0] for w in (" ppl ", " BLEU ", " min")), err
    assert "; fp32 on cpu" in err  # as the config pins it, even on a CPU with native bf16
    assert [r["step"] for r in read_metrics(tmp_path / "run", "valid")] == [11, 13]
    assert all(r["valid_s"] > 0 for r in read_metrics(tmp_path / "run", "valid"))  # its cost

    first = tmp_path / "run" / "attention" / "step_11"  # the weights only: drawn at the end
    assert sorted(p.name for p in first.iterdir()) == ["sentence_0.json", "sentence_1.json"]
    step_dir = tmp_path / "run" / "attention" / f"step_{state['step']}"
    assert state["step"] == 13 and sorted(p.name for p in step_dir.iterdir()) == [
        "sentence_0.json",
        "sentence_0.png",
        "sentence_1.json",
        "sentence_1.png",
    ]
    for i in range(2):
        assert (step_dir / f"sentence_{i}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        record = json.loads((step_dir / f"sentence_{i}.json").read_text())
        n_layers, n_heads, n_tgt, n_src = record["shape"]
        assert (n_layers, n_heads) == (1, 4)
        assert (n_tgt, n_src) == (len(record["tgt_tokens"]), len(record["src_tokens"]))
        rows = torch.tensor(record["weights"]).sum(-1)  # each query's weights sum to 1
        torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-4, rtol=0)
        source = (SAMPLE / "valid.de").read_text().splitlines()[i]
        assert record["metadata"]["source"] == source


def test_refuses_to_overwrite_a_run_and_overwrite_starts_afresh(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(train__max_steps=2), run, progress=False)
    with pytest.raises(Seq2SeqError, match="already holds a run; use resume=True"):
        train(tiny_config(train__max_steps=2), run, progress=False)
    (run / "attention" / "step_999").mkdir(parents=True)  # as if the old run had drawn maps
    (run / "attention" / "step_999" / "sentence_0.json").write_text("{}")
    (run / "notes.txt").write_text("mine")
    before = sorted(run.rglob("*"))
    with pytest.raises(Seq2SeqError, match="holds notes.txt, which no run wrote, and overwrite="):
        train(tiny_config(train__max_steps=1), run, overwrite=True, progress=False)
    assert sorted(run.rglob("*")) == before  # refused before anything was removed
    (run / "notes.txt").unlink()

    state = train(tiny_config(train__max_steps=1), run, overwrite=True, progress=False)
    assert state["step"] == 1
    assert [r["step"] for r in read_metrics(run, "train")] == [1]  # not appended to the old log
    assert not (run / "attention").exists()

    with pytest.raises(Seq2SeqError, match="cannot resume"):
        train(tiny_config(), tmp_path / "missing", resume=True, progress=False)


def test_resume_survives_a_metrics_line_cut_short(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(train__max_steps=2), run, progress=False)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')  # a kill in the middle of a write
    train(tiny_config(train__max_steps=3), run, resume=True, progress=False)
    assert sorted(train_losses(run)) == [1, 2, 3]


def test_precision_choice(monkeypatch):
    cpu = torch.device("cpu")
    assert autocast_dtype("fp32", cpu) is None
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert autocast_dtype("bf16", cpu) is None  # emulated bf16 is slower than fp32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert autocast_dtype("bf16", cpu) == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert autocast_dtype("bf16", cpu) == torch.bfloat16


def test_bf16_autocast_trains(tmp_path, monkeypatch, capsys):
    # This CPU has no native bf16 (so the trainer would pick fp32); force the bf16 path.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    train(
        tiny_config(train__max_steps=3, train__precision="bf16"), tmp_path / "run", progress=False
    )
    assert "bf16 autocast on cpu" in capsys.readouterr().err
    losses = list(train_losses(tmp_path / "run").values())
    assert len(losses) == 3 and all(0 < loss < 20 for loss in losses)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_training_loop_keeps_no_tensor_from_one_step_to_the_next(
    tmp_path, monkeypatch, precision
):
    """A tensor (a loss, a graph, a cast weight) kept by any step is memory that grows for the
    whole run: the live tensors after step 4 and after step 12 are the same count."""
    import gc
    import warnings

    from seq2seq.training.trainer import Trainer

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    config = tiny_config(
        train__max_steps=12, train__precision=precision, train__validate_every=10**6
    )
    trainer = Trainer(config, tmp_path, Runtime(), False, False, False)
    counts, after_step = {}, trainer.after_step

    def counted(*args: object) -> None:
        after_step(*args)
        gc.collect()
        with warnings.catch_warnings():  # a deprecated torch alias warns when it is looked at
            warnings.simplefilter("ignore", FutureWarning)
            counts[trainer.state.step] = sum(torch.is_tensor(o) for o in gc.get_objects())

    trainer.after_step = counted
    trainer.model.train()
    while trainer.state.stop_reason is None:
        trainer.train_epoch()
    trainer.log.close()
    assert trainer.state.epoch >= 1  # the count spans an epoch's end too
    assert counts[12] == counts[4]


def test_sigterm_saves_the_state_and_the_run_resumes(tmp_path):
    run = tmp_path / "run"
    config_file = write_tiny_yaml(tmp_path / "tiny.yaml", train__max_steps=100000)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "seq2seq",
            "train",
            "--config",
            str(config_file),
            "--out",
            str(run),
            "--no-progress",
        ],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + SUBPROCESS_TIMEOUT_S
        while not ((run / "metrics.jsonl").is_file() and len(read_metrics(run, "train")) >= 3):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err  # saved, not finished
    assert "stopped: signal SIGTERM" in err and "Traceback" not in err
    _, counters = checkpoint.read_tensors(run / checkpoint.LAST_FILE)
    stopped_at = counters["step"]
    assert stopped_at >= 3

    state = train(tiny_config(train__max_steps=stopped_at + 2), run, resume=True, progress=False)
    assert state["step"] == stopped_at + 2
    assert sorted(train_losses(run)) == list(range(1, stopped_at + 3))


# ---------------------------------------------------------------------------------------
# Several processes: ``torchrun --nproc_per_node=2`` with gloo on CPU.

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)


def torchrun(args: list[str]) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *args,
    ]
    return subprocess.run(
        command,
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )


@needs_gloo
def test_torchrun_two_processes_equal_one_process_and_only_rank_0_writes(tmp_path):
    steps = 6
    changes = {
        "train__max_steps": steps,
        "model__dropout": 0.0,
    }  # dropout masks differ by process count
    config_file = write_tiny_yaml(tmp_path / "tiny.yaml", **changes)
    result = torchrun(
        [
            "-m",
            "seq2seq",
            "train",
            "--config",
            str(config_file),
            "--out",
            str(tmp_path / "ddp"),
            "--no-progress",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # data.max_tokens is per process: two processes step like one accumulating two batches
    train(tiny_config(**changes, train__accum_steps=2), tmp_path / "single", progress=False)

    ddp, single = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "single")
    assert sorted(ddp) == list(range(1, steps + 1))  # one line per step: one writer
    for step in range(1, steps + 1):  # the same batches in each step; only the sum order differs
        assert ddp[step] == pytest.approx(single[step], rel=1e-4), step
    # validation is decoded in shares and gathered: the same scores as one process's
    (ddp_valid,), (single_valid,) = (
        read_metrics(tmp_path / "ddp", "valid"),
        read_metrics(tmp_path / "single", "valid"),
    )
    assert ddp_valid["loss"] == pytest.approx(single_valid["loss"], rel=1e-4)
    assert ddp_valid["bleu"] == pytest.approx(single_valid["bleu"], abs=1e-6)
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == sorted(
        p.name for p in (tmp_path / "single").iterdir()
    )
    assert result.stderr.count("stopped: max_steps") == 1
    assert result.stderr.count("x2 processes; a step takes 2 batch(es) of up to 160 tokens") == 1
    assert result.stderr.count("valid loss") == len(read_metrics(tmp_path / "ddp", "valid")) == 1


def rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` under the launcher ``parent``, if started."""
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or int((proc / "stat").read_text().split()[3]) != parent:
                continue
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(proc.name)
    return None


@needs_gloo
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rank in /proc")
def test_torchrun_a_signal_to_one_rank_stops_every_rank_and_the_resume_is_exact(tmp_path):
    # Each segment is a torchrun job of its own, as a real interruption and resume are: a
    # job stopped by SIGTERM to rank 1 alone, resumed past the next epoch's start, against
    # one job straight to the same step. With dropout on, each rank draws different masks;
    # both ranks' RNG states must survive the interruption.
    run, straight = tmp_path / "interrupted", tmp_path / "straight"
    config_file = write_tiny_yaml(tmp_path / "tiny.yaml", train__max_steps=100000)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "seq2seq", "train", "--no-progress", "--config", str(config_file)]
    proc = subprocess.Popen(
        [*command, "--out", str(run)],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the workers too are killed below
    )
    try:
        deadline = time.time() + SUBPROCESS_TIMEOUT_S
        while not ((run / "metrics.jsonl").is_file() and len(read_metrics(run, "train")) >= 3):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        os.kill(rank_pid(proc.pid, 1), signal.SIGTERM)  # rank 1 alone, not the launcher
        # an epoch is 11 steps: a rank that validated alone would wait forever at its end
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # a hung job: the launcher and its workers
    # every rank saved and exited 128 + SIGTERM, which the launcher reports, with its own
    # traceback of ChildFailedError: a job stopped, not finished; no other traceback
    assert proc.returncode != 0 and "exitcode  : 143" in err, err[-3000:]
    assert err.count("stopped: signal SIGTERM") == 1 and "to continue it" in err
    assert err.count("Traceback") == err.count("raise ChildFailedError(") <= 1
    stopped_at = checkpoint.read_tensors(run / checkpoint.LAST_FILE)[1]["step"]
    steps = max(stopped_at + 3, 14)  # the resumed job starts at least one epoch anew
    for args in (["--resume", "--out", str(run)], [*command[9:], "--out", str(straight)]):
        job = torchrun([*command[5:9], *args, "--max-steps", str(steps)])
        assert job.returncode == 0, job.stderr[-3000:]
    interrupted, uninterrupted = train_losses(run), train_losses(straight)
    assert sorted(interrupted) == sorted(uninterrupted) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        assert interrupted[step] == pytest.approx(uninterrupted[step], rel=0, abs=1e-6), step
    tensors, _ = checkpoint.read_tensors(straight / checkpoint.LAST_FILE)
    assert not torch.equal(tensors["rng.torch"], tensors["rng.torch.1"])  # one state per rank


def test_once_the_model_is_built_each_rank_draws_its_own_masks_and_rank_0_a_single_ones():
    def draws(rank: int) -> list[float]:
        torch.manual_seed(5)
        seed_ranks(5, Runtime(rank, 2))
        return torch.rand(3).tolist()

    torch.manual_seed(5)
    single = torch.rand(3).tolist()
    assert draws(0) == single != draws(1)


def test_cli_train_flags_reach_the_config(tmp_path):
    from seq2seq.commands.cli import main

    args = ["train", "--out", str(tmp_path / "run"), "--max-steps", "2", "--fp32", "--no-progress"]
    for item in tiny_overrides():
        args += ["--set", item]
    assert main(args) == 0
    saved = checkpoint.load_config_file(tmp_path / "run")
    assert (saved.train.precision, saved.train.max_steps) == ("fp32", 2)


def test_resume_keeps_the_recipe_and_takes_only_the_budgets(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(train__max_steps=3, train__label_smoothing=0.2), run, progress=False)
    # Resumed with the plain defaults for the recipe, a new budget, and a different seed.
    resumed = load_config(None, [f"data.data={SAMPLE}", "train.max_steps=5", "train.seed=99"])
    state = train(resumed, run, resume=True, progress=False)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert state["step"] == 5
    assert saved["train"]["max_steps"] == 5  # budget from the command line
    assert saved["train"]["label_smoothing"] == 0.2
    assert (saved["train"]["lr"], saved["train"]["seed"]) == (0.003, 1)  # recipe from the run


def test_dropout_follows_the_epochs_seen_and_a_given_dropout_is_kept(tmp_path, capsys):
    ramp = {"model__dropout": 0.3, "train__early_dropout": 0.1, "train__dropout_epochs": "[1,3]"}
    train(tiny_config(train__max_steps=40, **ramp), tmp_path / "ramp", progress=False)
    assert "dropout: 0.1 until epoch 1, then rising to 0.3 at epoch 3" in capsys.readouterr().err
    # Step n trains batch n - 1: with 11 batches an epoch, epoch 1 begins at step 12.
    dropout = {r["step"]: r["dropout"] for r in read_metrics(tmp_path / "ramp", "train")}
    assert {dropout[n] for n in range(1, 13)} == {0.1}
    rising = [dropout[n] for n in range(12, 35)]
    assert rising == sorted(rising) and len(set(rising)) == len(rising)
    assert dropout[23] == pytest.approx(0.2)  # batch 0 of epoch 2, halfway up
    assert {dropout[n] for n in range(34, 41)} == {0.3}

    # A dropout given alone (TINY gives 0.1) holds from the first step, on any corpus size.
    train(tiny_config(train__max_steps=3), tmp_path / "given", progress=False)
    assert "dropout: 0.1 throughout" in capsys.readouterr().err
    assert checkpoint.load_config_file(tmp_path / "given").train.early_dropout is None
    assert {r["dropout"] for r in read_metrics(tmp_path / "given", "train")} == {0.1}


def test_resume_from_the_command_line_keeps_every_budget_not_given(tmp_path, capsys):
    from seq2seq.commands.cli import main

    run = tmp_path / "run"
    budgets = ["train.max_time=30", "train.patience=3", "train.validate_every=50"]
    first = ["train", "--out", str(run), "--max-steps", "2", "--no-progress"]
    for item in tiny_overrides() + budgets:  # the tiny recipe sets train.threads=1
        first += ["--set", item]
    assert main(first) == 0
    resumed = ["train", "--out", str(run), "--resume", "--max-steps", "3", "--no-progress"]
    assert main([*resumed, "--set", "train.lr=0.5"]) == 0
    saved = checkpoint.load_config_file(run).train
    # a step budget given alone is the only budget, on --resume too: no time limit
    assert (saved.max_time, saved.patience, saved.validate_every) == (None, 3, 50)
    assert (saved.max_steps, saved.threads, saved.lr) == (3, 1, 0.003)
    err = capsys.readouterr().err
    assert "note: --resume keeps the run's recipe; ignored: train.lr" in err
    # as if killed before its end-of-run scoring, so that the resume has something to do
    tensors, counters = checkpoint.read_tensors(run / checkpoint.LAST_FILE)
    checkpoint.write_tensors(run / checkpoint.LAST_FILE, tensors, {**counters, "finished": False})
    assert main([*resumed[:-3], "--set", "train.patience=4", "--no-progress"]) == 0
    saved = checkpoint.load_config_file(run).train  # no budget given: every one kept
    assert (saved.max_time, saved.max_steps, saved.patience) == (None, 3, 4)


def test_a_budget_stops_final_validation_does_not_count_toward_patience(tmp_path, monkeypatch):
    from seq2seq.training import validation

    monkeypatch.setattr(validation, "validation_bleu", lambda *args: 5.0)  # never improves
    # Epochs of 11 batches: validations at the ends of epochs 0 and 1, then a budget stop
    # at step 27 validates the state it ended on.
    state = train(
        tiny_config(train__max_steps=27, train__patience=5), tmp_path / "r", progress=False
    )
    assert [v["step"] for v in read_metrics(tmp_path / "r", "valid")] == [11, 22, 27]
    assert state["bad_validations"] == 1  # step 22 only: step 11 set the reference


def test_overwrite_and_a_resume_that_trains_further_remove_the_scored_hypotheses(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config(train__max_steps=1), run, progress=False)
    for trains_again in (dict(resume=True), dict(overwrite=True)):
        (run / "hyps.test.txt").write_text("old\n")
        (run / "hyps.test.scores.json").write_text("{}")
        train(tiny_config(train__max_steps=2), run, progress=False, **trains_again)
        assert not list(run.glob("hyps.*")), trains_again
    err = capsys.readouterr().err
    assert "removed hyps.test.scores.json, hyps.test.txt: scores of the weights trained" in err


def test_a_resume_that_fails_before_it_writes_weights_keeps_the_scores(tmp_path, monkeypatch):
    from seq2seq.training import trainer as train_module

    run = tmp_path / "run"
    train(tiny_config(train__max_steps=1), run, progress=False)
    (run / "hyps.test.en.txt").write_text("scored\n")

    def fails(*args):
        raise Seq2SeqError("the corpus is gone")

    monkeypatch.setattr(train_module, "build_model", fails)  # after the run's files are read
    with pytest.raises(Seq2SeqError, match="the corpus is gone"):
        train(tiny_config(train__max_steps=2), run, resume=True, progress=False)
    assert (run / "hyps.test.en.txt").read_text() == "scored\n"  # its weights are untouched


def test_accumulating_micro_batches_equals_one_large_batch(tmp_path):
    import copy

    from seq2seq.run.runtime import Runtime
    from seq2seq.training.trainer import Trainer

    config = tiny_config(model__dropout=0.0, train__accum_steps=2)
    trainer = Trainer(config, tmp_path, Runtime(), False, False, False)
    model0, optim0 = (
        copy.deepcopy(trainer.model.state_dict()),
        copy.deepcopy(trainer.optimizer.state_dict()),
    )
    first, second = list(range(0, 3)), list(range(3, 8))
    loss_accum, n_accum = trainer.train_step([first, second], trainer.my_batches([first, second]))
    accumulated = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.model.load_state_dict(model0)
    trainer.optimizer.load_state_dict(optim0)
    loss_one, n_one = trainer.train_step([first + second], trainer.my_batches([first + second]))
    assert n_accum == n_one
    assert loss_accum == pytest.approx(loss_one, rel=1e-6)
    state = trainer.model.state_dict()
    assert_trained_alike(trainer.model, accumulated, state, rtol=1e-5, atol=1e-7)
    assert not torch.equal(
        accumulated["src_embed.tokens.weight"], model0["src_embed.tokens.weight"]
    )


def test_a_step_on_batches_padded_to_their_buckets_equals_the_unpadded_step(tmp_path, monkeypatch):
    """Padding rows and columns add nothing to the loss or its gradient (data.pad_to_buckets)."""
    from seq2seq.run.runtime import Runtime
    from seq2seq.training.trainer import Trainer

    config = tiny_config(model__dropout=0.0, data__pad_to_buckets="true", train__accum_steps=2)
    trainer = Trainer(config, tmp_path, Runtime(), False, False, False)
    start = [{k: v.clone() for k, v in trainer.model.state_dict().items()}]
    start.append(trainer.optimizer.state_dict())
    step, grads = trainer.scaling.step, []

    def step_recording_gradients(optimizer) -> None:
        grads.append([p.grad.clone() for p in trainer.model.parameters()])
        step(optimizer)

    monkeypatch.setattr(trainer.scaling, "step", step_recording_gradients)
    batches = trainer.sampler.batches(0)
    rows = [trainer.my_batches([b])[0][0].src.shape[0] for b in batches]
    short = next(i for i, b in enumerate(batches) if len(b) < rows[i])  # padded with rows
    group = [batches[short], batches[short - 1]]
    padded = trainer.my_batches(group)
    loss_padded, _ = trainer.train_step(group, padded)
    trainer.model.load_state_dict(start[0])
    trainer.optimizer.load_state_dict(start[1])
    buckets, trainer.buckets = trainer.buckets, None
    unpadded = trainer.my_batches(group)
    loss, _ = trainer.train_step(group, unpadded)
    for (a, _), (b, _) in zip(padded, unpadded, strict=True):
        assert a.src.shape == a.tgt_in.shape and a.src.shape[1] in buckets.lengths
        assert a.src.shape[0] >= b.src.shape[0] and a.src.shape[1] >= b.src.shape[1]
    pairs = zip(padded, unpadded, strict=True)
    assert any(a.src.shape[0] > b.src.shape[0] for (a, _), (b, _) in pairs)  # padding rows
    assert loss_padded == pytest.approx(loss, rel=1e-6)
    names = [name for name, _ in trainer.model.named_parameters()]
    for name, g_padded, g in zip(names, *grads, strict=True):
        torch.testing.assert_close(g_padded, g, rtol=1e-5, atol=1e-7, msg=name)


def test_learning_rate_warms_up_linearly_then_decays_as_one_over_root_step(tmp_path):
    from seq2seq.training.optim import inverse_sqrt

    factor = inverse_sqrt(10)
    assert [factor(s) for s in (1, 5, 10)] == pytest.approx([0.1, 0.5, 1.0])
    assert factor(40) == pytest.approx(0.5) and factor(1000) == pytest.approx(0.1)
    assert inverse_sqrt(0)(4) == pytest.approx(0.5)  # no warmup: 1/sqrt(step) from step 1
    train(tiny_config(train__max_steps=15), tmp_path / "run", progress=False)
    logged = {r["step"]: r["lr"] for r in read_metrics(tmp_path / "run", "train")}
    for step, lr in logged.items():  # step N ran with the rate for step N (warmup 10, peak 3e-3)
        assert lr == pytest.approx(0.003 * factor(step)), step


def test_the_learning_rate_cools_down_to_zero_over_the_end_of_the_time_budget(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from seq2seq.training.optim import cooldown, inverse_sqrt

    assert [cooldown(u, 0.3) for u in (0.0, 0.7, 0.85, 1.0, 1.2)] == pytest.approx(
        [1, 1, 0.5, 0, 0]
    )
    assert cooldown(0.99, 0.0) == 1.0  # train.cooldown=0: the schedule alone
    clock = SimpleNamespace(now=0.0)

    def fake_time() -> float:  # every reading of the clock: half a second later
        clock.now += 0.5
        return clock.now

    for module in ("budget", "trainer", "validation"):  # the budget's clock, and its readers'
        monkeypatch.setattr(f"seq2seq.training.{module}.time", SimpleNamespace(monotonic=fake_time))
    schedule = inverse_sqrt(10)
    shares = {}
    for share in (0.5, 0.0):
        run = tmp_path / f"cooldown-{share}"
        config = tiny_config(train__max_time=0.5, train__cooldown=share)
        state = train(config, run, progress=False)
        assert state["stop_reason"] == "max_time 0.5 min"
        logged = read_metrics(run, "train")
        shares[share] = [r["lr"] / (0.003 * schedule(r["step"])) for r in logged]
        assert len(logged) >= 10
    assert shares[0.0] == pytest.approx([1.0] * len(shares[0.0]))  # no cool-down
    cooled = shares[0.5]
    assert cooled[: len(cooled) // 3] == pytest.approx([1.0] * (len(cooled) // 3))
    assert cooled[-1] < 0.25 and all(a >= b for a, b in itertools.pairwise(cooled))


def test_train_log_and_environment_record_the_run(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(train__max_steps=12), run, progress=False)
    train(tiny_config(train__max_steps=13), run, resume=True, progress=False)
    log = (run / "train.log").read_text()
    assert log.count("stopped: max_steps") == 2  # appended across --resume
    assert "valid loss" in log and "resuming at step 12" in log
    segments = json.loads((run / "environment.json").read_text())["segments"]
    assert [seg["from_step"] for seg in segments] == [0, 12]  # one entry per segment
    for environment in segments:
        assert {"python", "torch", "sentencepiece", "sacrebleu", "seq2seq"} <= set(
            environment["versions"]
        )
        assert environment["threads"] >= 1 and environment["cpu"]
        assert environment["git_commit"] is None or len(environment["git_commit"]) == 40
        # the flags a bf16 figure depends on, read from /proc/cpuinfo; torch reads them apart
        has_avx512_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        assert ("avx512_bf16" in environment["cpu_bf16_flags"]) == has_avx512_bf16
    # a start line per segment and every training line carry the peak memory so far,
    # which never falls and is at least the model's fp32 weights
    starts = read_metrics(run, "start")
    assert [r["step"] for r in starts] == [0, 12]
    train_lines = read_metrics(run, "train")
    for first, last in ((0, 12), (12, 13)):  # within a segment: one process, a running peak
        peaks = [r["peak_rss_mb"] for r in train_lines if first < r["step"] <= last]
        assert peaks and peaks == sorted(peaks)
    # in MB: a process that imported torch holds more than 50, this one far less than 50,000
    assert all(50 < r["peak_rss_mb"] < 50_000 for r in train_lines)
    assert starts[0]["peak_rss_mb"] <= train_lines[0]["peak_rss_mb"]
    assert "cuda_peak_mb" not in starts[0]  # on the CPU


@pytest.mark.parametrize(
    "device, message",
    [
        ("cuda", "no CUDA device is available"),
        ("cuda:1", "no CUDA device is available"),
        ("mps", "MPS is not available here"),
        ("tpu", "train.device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
    ],
)
def test_an_unavailable_device_is_one_line(tmp_path, capsys, device, message):
    from seq2seq.commands.cli import main

    if torch.cuda.is_available() and device.startswith("cuda"):
        pytest.skip("this machine has CUDA")
    args = ["train", "--out", str(tmp_path / "run"), "--device", device, "--max-steps", "1"]
    assert main([*args, "--set", f"data.data={SAMPLE}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_device_auto_takes_cuda_then_mps_then_cpu(monkeypatch):
    from seq2seq.run import runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "_mps_available", lambda: True)
    assert runtime.setup_runtime("auto").device.type == "mps"
    monkeypatch.setattr(runtime, "_mps_available", lambda: False)
    assert runtime.setup_runtime("auto").device == torch.device("cpu")
    assert runtime.setup_runtime("cpu", threads=1).device == torch.device("cpu")


def test_under_torchrun_each_rank_takes_its_local_gpu_and_an_explicit_one_is_refused(
    monkeypatch,
):
    from seq2seq.run import runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert runtime._resolve("cuda", local_rank=3) == torch.device("cuda", 3)
    assert runtime._resolve("auto", local_rank=2) == torch.device("cuda", 2)
    assert runtime._resolve("cuda:1", local_rank=None) == torch.device("cuda", 1)
    with pytest.raises(Seq2SeqError, match="each process takes the GPU of its local rank"):
        runtime._resolve("cuda:1", local_rank=0)


@pytest.mark.parametrize("average_bleu, kept", [(4.0, True), (3.0, False), (2.5, False)])
def test_averaging_at_the_end_keeps_the_average_only_when_it_validates_better(
    tmp_path, monkeypatch, average_bleu, kept
):
    from seq2seq.training import validation

    # validation BLEU at steps 10, 20 (the best single state), 30 and 40, then the average's
    scores = iter([1.0, 3.0, 2.0, 1.5, average_bleu])
    monkeypatch.setattr(validation, "validation_bleu", lambda *args, **kwargs: next(scores))
    run = tmp_path / "run"
    config = tiny_config(
        train__max_steps=40, train__validate_every=10, train__keep_last=3, train__average_last=3
    )
    state = train(config, run, progress=False)
    assert [r["bleu"] for r in read_metrics(run, "valid")] == [1.0, 3.0, 2.0, 1.5]
    states = checkpoint.kept_checkpoints(run)
    assert [p.name for p in states] == [f"step_{n}.safetensors" for n in (20, 30, 40)]
    [average] = read_metrics(run, "average")
    assert average["steps"] == [20, 30, 40] and average["bleu"] == average_bleu
    assert average["kept"] is kept  # the line says whether the average became the model
    weights, best = checkpoint.read_tensors(run / checkpoint.BEST_FILE)
    if kept:
        expected = checkpoint.average_checkpoints(states)
        assert best["averaged_steps"] == [20, 30, 40] and best["bleu"] == average_bleu
        assert state["best_bleu"] == average_bleu
    else:
        expected, _ = checkpoint.read_tensors(states[0])  # step 20's weights
        assert "averaged_steps" not in best and (best["step"], best["bleu"]) == (20, 3.0)
        assert (state["best_bleu"], state["best_step"]) == (3.0, 20)
    assert weights.keys() == expected.keys()
    for name in weights:
        torch.testing.assert_close(weights[name], expected[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("ema_bleu", [0.5, 4.0], ids=["not-kept", "kept"])
def test_the_moving_average_is_kept_only_when_it_validates_better(tmp_path, monkeypatch, ema_bleu):
    from seq2seq.training import validation

    # validation BLEU at steps 10 and 20 (the best state), then the moving average's
    scores = iter([1.0, 3.0, ema_bleu])
    monkeypatch.setattr(validation, "validation_bleu", lambda *args, **kwargs: next(scores))
    run = tmp_path / "run"
    state = train(
        tiny_config(train__max_steps=20, train__validate_every=10, train__ema=0.99),
        run,
        progress=False,
    )
    [line] = read_metrics(run, "ema")
    assert (line["bleu"], line["decay"], line["kept"]) == (ema_bleu, 0.99, ema_bleu > 3.0)
    weights, best = checkpoint.read_tensors(run / checkpoint.BEST_FILE)
    last, _ = checkpoint.read_tensors(run / checkpoint.LAST_FILE)
    kept = ema_bleu > 3.0
    assert (best.get("ema"), best["bleu"], state["best_bleu"]) == (
        (0.99, ema_bleu, ema_bleu) if kept else (None, 3.0, 3.0)
    )
    for name, tensor in weights.items():  # the average's, or not the average's
        assert torch.equal(tensor, last[f"ema.{name}"]) is kept, name


# -- train.compile ----------------------------------------------------------------------


def test_compiled_training_gives_the_eager_losses(tmp_path, monkeypatch):
    # Dropout off (compiled dropout draws other random numbers), fp32, the same seed: the
    # compiled forward and backward must give eager's losses, step after step. The backend is
    # aot_eager: dynamo's capture of the model with dynamic shapes and AOTAutograd's backward
    # graph, what inductor is handed, run by eager kernels; inductor's code generation for
    # them (a minute of compiling on two cores) is torch's to test, and
    # `experiments/bench_train.py --compile` runs it.
    from seq2seq.training import compiling
    from seq2seq.training import trainer as train_module

    real = compiling.compiled
    monkeypatch.setattr(train_module, "compiled", lambda m: real(m, backend="aot_eager"))
    torch._dynamo.reset()
    same = dict(train__max_steps=3, model__dropout=0.0, train__precision="fp32")
    train(tiny_config(**same, train__compile="false"), tmp_path / "eager", progress=False)
    train(tiny_config(**same, train__compile="true"), tmp_path / "compiled", progress=False)
    eager, compiled = train_losses(tmp_path / "eager"), train_losses(tmp_path / "compiled")
    assert sorted(compiled) == [1, 2, 3]
    for step, loss in eager.items():
        assert compiled[step] == pytest.approx(loss, rel=1e-5, abs=1e-6), step
    log = (tmp_path / "compiled" / "train.log").read_text()
    assert "; torch.compile" in log  # the run says it compiled


@pytest.fixture
def counted_compile(monkeypatch):
    """torch.compile with a backend that runs each graph as traced (fast) and keeps a list of
    them: the graphs a run compiled, from a fresh dynamo cache."""
    from seq2seq.training import compiling
    from seq2seq.training import trainer as train_module

    graphs = []

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    real = compiling.compiled
    monkeypatch.setattr(train_module, "compiled", lambda m: real(m, backend=counting))
    torch._dynamo.reset()
    yield graphs
    torch._dynamo.reset()


def test_a_compiled_run_compiles_no_more_graphs_when_its_dropout_moves_every_step(
    tmp_path, counted_compile
):
    # The default schedule (0.1 rising to 0.3) squeezed into two epochs of 11 steps: 14 steps
    # at 14 dropouts, past dynamo's limit of 8 recompiles, compile what a fixed dropout does.
    same = dict(train__max_steps=14, train__compile="true", model__dropout=0.3)
    ramp = dict(train__early_dropout=0.1, train__dropout_epochs="[0,2]")
    train(tiny_config(**same, **ramp), tmp_path / "ramp", progress=False)
    dropouts = {r["dropout"] for r in read_metrics(tmp_path / "ramp", "train")}
    assert len(dropouts) == 14
    moving = len(counted_compile)
    counted_compile.clear()
    torch._dynamo.reset()
    train(tiny_config(**same), tmp_path / "fixed", progress=False)
    assert 1 <= moving == len(counted_compile)
    assert "torch.compile stopped" not in (tmp_path / "ramp" / "train.log").read_text()


def test_a_compile_that_stops_compiling_says_so_and_trains_on_eagerly(tmp_path, counted_compile):
    # dropout 0 at step 1, then on: one recompile, which a limit of 1 refuses. The limit is
    # set through dynamo's own patch: a monkeypatch of its config module is undone (pytest
    # 9.2) by deleting the attribute, which hides the entry from every later compile.
    ramp = dict(train__early_dropout=0.0, train__dropout_epochs="[0,1]")
    with torch._dynamo.config.patch(recompile_limit=1):
        state = train(
            tiny_config(train__max_steps=3, train__compile="true", **ramp),
            tmp_path / "r",
            progress=False,
        )
    assert state["step"] == 3
    log = (tmp_path / "r" / "train.log").read_text()
    assert "note: torch.compile stopped at step 2: dynamo recompiled past its limit of 1" in log
    assert "training eagerly from here" in log


def failing_backend(graph, example_inputs):
    raise RuntimeError("no C++ compiler found")


@pytest.fixture
def compile_fails(monkeypatch):
    """torch.compile as on a machine where compiling fails (at the first call, as inductor's
    does), through a backend that raises."""
    from seq2seq.training import compiling
    from seq2seq.training import trainer as train_module

    real = compiling.compiled
    monkeypatch.setattr(train_module, "compiled", lambda m: real(m, backend=failing_backend))
    return compiling


def test_compile_true_that_fails_here_exits_with_one_line(tmp_path, capsys, compile_fails):
    from seq2seq.commands.cli import main

    args = ["train", "--out", str(tmp_path / "r"), "--max-steps", "2", "--no-progress"]
    for item in tiny_overrides(train__compile="true"):
        args += ["--set", item]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: train.compile: torch.compile failed on this machine")
    assert "no C++ compiler found" in err[-1] and "train.compile=false" in err[-1]
    assert not any("Traceback" in line for line in err)


def test_compile_auto_that_fails_falls_back_to_eager(tmp_path, monkeypatch, compile_fails):
    monkeypatch.setattr(compile_fails, "COMPILE_WINS", frozenset({"cpu"}))
    state = train(tiny_config(train__max_steps=2), tmp_path / "r", progress=False)
    assert state["step"] == 2
    log = (tmp_path / "r" / "train.log").read_text()
    assert "note: torch.compile failed here" in log and "training eagerly" in log


def test_compile_auto_is_eager_where_no_measurement_showed_a_win(monkeypatch):
    from seq2seq.training import compiling
    from seq2seq.training.compiling import wants_compile

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not wants_compile("auto", cpu)  # measured slower than eager (compiling.py)
    monkeypatch.setattr(compiling, "COMPILE_WINS", frozenset({"cuda"}))
    assert wants_compile("auto", cuda) and not wants_compile("auto", cpu)
    assert wants_compile(True, cpu) and wants_compile("true", cpu)
    assert not wants_compile(False, cpu) and not wants_compile("false", cpu)


# -- no host reads in the training step's forward ----------------------------------------


def test_the_training_forward_reads_nothing_on_the_host(tmp_path, monkeypatch):
    # A read of a tensor's values on the host makes a GPU step wait for the device: the
    # training (and validation loss) forward may make none. Decoding checks its sources.
    from seq2seq.model.transformer import Seq2Seq

    forward, calls = Seq2Seq.forward, []

    def guarded(self, *args, **kwargs):
        calls.append(1)
        with no_host_reads():  # test_model checks that it catches each kind of read
            return forward(self, *args, **kwargs)

    monkeypatch.setattr(Seq2Seq, "forward", guarded)
    config = tiny_config(train__max_steps=2, train__compile="false")
    assert train(config, tmp_path / "run", progress=False)["step"] == 2
    assert len(calls) >= 3  # two steps and a validation loss


def test_cooldown_validate_every_validates_densely_in_the_cool_down(tmp_path):
    """Every 10 steps, then every 4 once the learning rate cools down (after step 28 of 40 at
    cooldown 0.3): the last validated states, which the run averages, are late ones."""
    run = tmp_path / "run"
    settings = {"train__validate_every": 10, "train__cooldown_validate_every": 4}
    train(tiny_config(train__max_steps=40, train__cooldown=0.3, **settings), run, progress=False)
    assert [r["step"] for r in read_metrics(run, "valid")] == [10, 20, 32, 36, 40]


@pytest.mark.parametrize(("save_every", "written"), [(0.0, "every"), (1e6, "first and last")])
def test_save_every_writes_the_state_and_curves_at_most_that_often(
    tmp_path, monkeypatch, save_every, written
):
    """train.save_every: last.safetensors and curves.png no sooner than that many seconds
    after the last; before the first step, the drawing at the end and the last state are
    always written. 0: after every validation, as before."""
    from seq2seq.training import trainer as trainer_module
    from seq2seq.training import validation

    saves, draws = [], []
    save, draw = checkpoint.save_training_state, validation.update_run_curves

    def counted_save(path, model, optimizer, counters, *args, **kwargs):
        saves.append(counters["step"])
        return save(path, model, optimizer, counters, *args, **kwargs)

    monkeypatch.setattr(trainer_module.checkpoint, "save_training_state", counted_save)
    monkeypatch.setattr(validation, "update_run_curves", lambda *a: draws.append(1) or draw(*a))
    config = tiny_config(train__max_steps=20, train__validate_every=5, train__save_every=save_every)
    train(config, tmp_path / "run", progress=False)
    if written == "every":
        assert saves[0] == 0 and {5, 10, 15, 20} <= set(saves) and len(draws) == 4
    else:
        assert saves == [0, 20] and len(draws) == 2  # the first validation's, and the end's
    assert (tmp_path / "run" / "curves.png").is_file()


@pytest.mark.parametrize("recipe", ["gpu.yaml", "gpu-tiny.yaml"])
def test_the_gpu_recipes_load_and_train(tmp_path, recipe):
    """experiments/configs' GPU recipes are valid configs that train (two steps here, on the
    sample corpus, a CPU and a tenth of their batch): every key they set exists and fits."""
    path = Path(__file__).resolve().parents[1] / "experiments" / "configs" / recipe
    sample = ["data.data=sample", "data.vocab_size=200", "data.max_tokens=819", "train.threads=1"]
    sample += ["train.attention_sentences=0", "train.valid_bleu_sentences=2"]
    config = load_config(path, [*sample, "train.max_steps=2", "train.device=cpu"])
    assert config.data.max_tokens == 819 and config.train.save_every == 60
    result = train(config, tmp_path / "run", progress=False)
    assert result["step"] == 2
