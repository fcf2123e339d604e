"""Run directories: a fresh process rebuilds the model alone; broken or hostile files are refused."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from test_train import REPO, SUBPROCESS_TIMEOUT_S, subprocess_env, tiny_config, tiny_overrides

from seq2seq.commands.cli import main
from seq2seq.decoding.load import load_run
from seq2seq.errors import Seq2SeqError
from seq2seq.model.transformer import build_model
from seq2seq.run import checkpoint, rundir
from seq2seq.training.entry import train

SRC = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])  # (B, S): ids + EOS, padded
TGT = torch.tensor([[2, 11, 12, 13], [2, 14, 0, 0]])  # (B, T): BOS + ids, padded


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("checkpoint") / "run"
    train(tiny_config(train__max_steps=12), run, progress=False)  # validates at step 11
    return run


@pytest.fixture
def copy_of(run_dir, tmp_path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def test_a_fresh_process_gives_the_same_logits(run_dir, tmp_path):
    _, tokenizer, model = load_run(run_dir)
    assert not model.training
    with torch.inference_mode():
        logits = model(SRC, TGT)  # (B, T, V)
    assert logits.shape == (2, 4, tokenizer.tgt_vocab_size)

    script = (
        "import sys, numpy, torch\n"
        "torch.set_num_threads(1)\n"
        "from seq2seq.decoding.load import load_run\n"
        "_, _, model = load_run(sys.argv[1])\n"
        "src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])\n"
        "tgt = torch.tensor([[2, 11, 12, 13], [2, 14, 0, 0]])\n"
        "with torch.inference_mode():\n"
        "    numpy.save(sys.argv[2], model(src, tgt).numpy())\n"
    )
    out = tmp_path / "logits.npy"
    subprocess.run(
        [sys.executable, "-c", script, str(run_dir), str(out)],
        cwd=REPO,
        env=subprocess_env(),
        check=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    torch.testing.assert_close(torch.from_numpy(np.load(out)), logits, rtol=0, atol=1e-6)


def test_best_model_is_the_weights_of_the_best_validation(run_dir):
    tensors, metadata = checkpoint.read_tensors(run_dir / checkpoint.BEST_FILE)
    assert metadata["step"] == 11 and metadata["bleu"] >= 0
    config = checkpoint.load_config_file(run_dir)
    model = build_model(config.model)
    assert set(tensors) == set(checkpoint.unique_state(model))
    # Tied output and shared embeddings are stored once.
    assert len(tensors) < len(model.state_dict())


def test_best_model_holds_the_weights_validated_best_not_the_last_ones(tmp_path, monkeypatch):
    from seq2seq.training import validation

    snapshots, scores = {}, iter([1.0, 9.0, 3.0])  # the second validation is the best

    def bleu(model, *args):
        snapshots[len(snapshots)] = {
            k: v.clone() for k, v in checkpoint.unique_state(model).items()
        }
        return next(scores)

    monkeypatch.setattr(validation, "validation_bleu", bleu)
    state = train(tiny_config(train__max_steps=33), tmp_path / "run", progress=False)
    assert state["best_step"] == 22 and len(snapshots) == 3
    best, metadata = checkpoint.read_tensors(tmp_path / "run" / checkpoint.BEST_FILE)
    assert metadata == {"step": 22, "bleu": 9.0}
    for name, tensor in best.items():
        torch.testing.assert_close(tensor, snapshots[1][name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(best[n], snapshots[2][n]) for n in best)  # later weights differ


def test_averaging_copies_of_one_checkpoint_gives_it_back_exactly(run_dir, tmp_path):
    copies = [
        shutil.copy(run_dir / checkpoint.BEST_FILE, tmp_path / f"c{i}.safetensors")
        for i in range(3)
    ]
    averaged = checkpoint.average_checkpoints([Path(c) for c in copies])
    original, _ = checkpoint.read_tensors(run_dir / checkpoint.BEST_FILE)
    assert averaged.keys() == original.keys()
    for name, tensor in original.items():
        assert averaged[name].dtype == tensor.dtype and torch.equal(averaged[name], tensor), name


def test_the_average_of_two_checkpoints_is_their_mean(run_dir, tmp_path):
    a, _ = checkpoint.read_tensors(run_dir / checkpoint.BEST_FILE)
    b = {k: v * 3 + 1 for k, v in a.items()}
    checkpoint.write_tensors(tmp_path / "b.safetensors", b, {})
    averaged = checkpoint.average_checkpoints(
        [run_dir / checkpoint.BEST_FILE, tmp_path / "b.safetensors"]
    )
    for name in a:
        torch.testing.assert_close(averaged[name], (a[name] + b[name]) / 2, msg=name)


def test_average_command_writes_weights_every_command_loads(copy_of, tmp_path, capsys):
    kept = copy_of / checkpoint.KEPT_DIR
    kept.mkdir()
    for step in (11, 12):
        shutil.copy(copy_of / checkpoint.BEST_FILE, kept / f"step_{step}.safetensors")
    assert main(["average", str(copy_of), "--last", "2"]) == 0
    assert "averaged 2 checkpoints (steps 11, 12)" in capsys.readouterr().out
    averaged = copy_of / "averaged.safetensors"
    assert main(["translate", str(averaged), "ein Hund"]) == 0
    assert capsys.readouterr().out.count("\n") == 1  # one line (a 12-step model may say nothing)
    assert main(["evaluate", str(averaged), "--split", "validation"]) == 0
    assert "BLEU = " in capsys.readouterr().out  # its hypotheses beside the run's, not over them
    assert (copy_of / "hyps.validation.en.averaged.txt").is_file()
    assert not (copy_of / "hyps.validation.en.txt").exists()
    _, _, model = load_run(averaged)
    _, _, best = load_run(copy_of)
    for (name, x), (_, y) in zip(
        model.state_dict().items(), best.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), name  # the average of two copies of the best model
    assert main(["average", str(tmp_path)]) == 2
    assert "no checkpoints to average" in capsys.readouterr().err


def _keep_two(run: Path) -> None:
    kept = run / checkpoint.KEPT_DIR
    kept.mkdir(exist_ok=True)
    for step in (11, 12):
        shutil.copy(run / checkpoint.BEST_FILE, kept / f"step_{step}.safetensors")


def test_average_writes_a_named_file_into_its_run_which_every_command_loads(copy_of, capsys):
    _keep_two(copy_of)
    out = copy_of / "last2.safetensors"
    assert main(["average", str(copy_of), "--last", "2", "-o", str(out)]) == 0
    assert main(["translate", str(out), "ein Hund"]) == 0
    assert capsys.readouterr().out.count("\n") == 2  # the average's line, the translation


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("elsewhere.safetensors", "must be a .safetensors file in .*run itself"),
        ("run/averaged.pt", "must be a .safetensors file in"),
        ("run/checkpoints/avg.safetensors", "must be a .safetensors file in"),
        ("run/last.safetensors", "that is the run's own last.safetensors"),
        ("run/model.safetensors", "that is the run's own model.safetensors"),
    ],
)
def test_average_refuses_a_file_no_command_could_load_with_its_run(
    copy_of, tmp_path, capsys, where, message
):
    _keep_two(copy_of)
    before = _files(tmp_path)
    assert main(["average", str(copy_of), "-o", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: -o ") and err.count("\n") == 1
    assert re.search(message, err)
    assert _files(tmp_path) == before  # nothing written, nothing replaced


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "command", [["evaluate", "--split", "validation"], ["translate", "ein Hund"]]
)
def test_a_training_state_in_place_of_weights_says_what_to_pass(run_dir, capsys, command):
    assert main([command[0], str(run_dir / checkpoint.LAST_FILE), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert "last.safetensors is a training state (what train --resume reads)" in err
    assert f"pass the run directory {run_dir} for its best weights" in err
    assert err.count("\n") == 1


@pytest.mark.slow
def test_overwrite_leaves_nothing_the_old_run_or_its_commands_wrote(tmp_path, capsys):
    run = tmp_path / "run"
    recipe = dict(train__validate_every=2, train__keep_last=2, train__average_last=2)
    train(
        tiny_config(train__max_steps=4, train__attention_sentences=1, **recipe), run, progress=False
    )
    assert main(["average", str(run), "--last", "2"]) == 0
    assert main(["average", str(run), "--last", "1", "-o", str(run / "newest.safetensors")]) == 0
    for weights in (run, run / "averaged.safetensors", run / "checkpoints" / "step_4.safetensors"):
        assert main(["evaluate", str(weights), "--split", "validation", "--no-progress"]) == 0
    old = [p for p in run.rglob("*") if p.is_file() and p.name not in (".lock", rundir.MARKER)]
    assert {"averaged.safetensors", "newest.safetensors", "hyps.validation.en.txt"} <= {
        p.name for p in old
    }
    for path in old:
        os.utime(path, (0, 0))  # marked: whatever still has this time was not rewritten
    overrides = [x for o in tiny_overrides(train__max_steps=1) for x in ("--set", o)]
    assert main(["train", "--out", str(run), "--overwrite", "--no-progress", *overrides]) == 0
    survivors = [p for p in run.rglob("*") if p.is_file() and p.stat().st_mtime == 0]
    assert survivors == []


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:40] = b"x" * 32  # the JSON header starts at byte 8
    path.write_bytes(bytes(data))


def _rewrite(change):
    def tamper(path: Path) -> None:
        tensors, metadata = checkpoint.read_tensors(path)
        change(tensors)
        save_file(tensors, str(path), metadata={"seq2seq": json.dumps(metadata)})

    return tamper


def _rename_one(tensors):
    name = sorted(tensors)[0]
    tensors[name + "_x"] = tensors.pop(name)


def _reshape_one(tensors):
    name = sorted(tensors)[0]
    tensors[name] = torch.zeros(3, 3)


def _poison_one(tensors):
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")


def _to_float64(tensors):
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].double()


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_truncate, "not a readable safetensors file"),
        (_garble_header, "not a readable safetensors file"),
        (lambda p: p.write_bytes(b""), "not a readable safetensors file"),
        (_rewrite(_rename_one), "tensors do not match the model"),
        (_rewrite(_reshape_one), "the model needs torch.float32"),
        (_rewrite(_poison_one), "holds NaN or Inf"),
        (_rewrite(_to_float64), "is torch.float64"),
        (lambda p: p.unlink(), "model.safetensors missing"),
    ],
    ids=[
        "truncated",
        "garbled-header",
        "empty",
        "renamed",
        "reshaped",
        "nan",
        "float64",
        "missing",
    ],
)
def test_a_broken_best_model_is_one_clear_error(copy_of, tamper, message):
    tamper(copy_of / checkpoint.BEST_FILE)
    with pytest.raises(Seq2SeqError, match=message) as error:
        load_run(copy_of)
    assert "\n" not in str(error.value)


def test_a_truncated_training_state_exits_2_with_one_line(copy_of, capsys):
    _truncate(copy_of / checkpoint.LAST_FILE)
    args = ["train", "--out", str(copy_of), "--resume", "--no-progress"]
    for item in tiny_overrides(train__max_steps=20):
        args += ["--set", item]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    *notes, last = err.splitlines()  # corpus notes may come first; the error is one line
    assert all(line.startswith("note: ") for line in notes)
    assert (
        last.startswith("error: ") and "last.safetensors: not a readable safetensors file" in last
    )


class _RunsCommand:
    """Unpickling this calls ``os.system`` and creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _OpensFile:
    """Unpickling this calls ``open(marker, "w")``, creating the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.mark.parametrize("payload", [_RunsCommand, _OpensFile, "torch.save"])
def test_a_pickle_in_place_of_a_checkpoint_is_refused_not_run(copy_of, tmp_path, payload):
    marker = tmp_path / "pwned"
    for name in (checkpoint.BEST_FILE, checkpoint.LAST_FILE):
        path = copy_of / name
        if payload == "torch.save":  # a zip archive holding a pickle, which runs on load
            torch.save({"x": _RunsCommand(marker)}, path)
        else:
            path.write_bytes(pickle.dumps(payload(marker)))
    with pytest.raises(Seq2SeqError, match="not a readable safetensors file"):
        load_run(copy_of)
    with pytest.raises(Seq2SeqError, match="not a readable safetensors file"):
        train(tiny_config(train__max_steps=20), copy_of, resume=True, progress=False)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [_RunsCommand, _OpensFile])
def test_the_payloads_do_run_when_unpickled(tmp_path, payload):
    """So the test above proves refusal, not a harmless payload."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(payload(marker)))  # noqa: S301
    assert marker.exists()


def _trained_pair():
    torch.manual_seed(0)
    model = build_model(tiny_config().model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    for _ in range(2):
        optimizer.zero_grad()
        model(SRC, TGT).sum().backward()
        optimizer.step()
    return model, optimizer


def test_training_state_round_trip(tmp_path):
    model, optimizer = _trained_pair()
    path = tmp_path / checkpoint.LAST_FILE
    torch.manual_seed(123)
    checkpoint.save_training_state(path, model, optimizer, {"step": 2, "epoch": 0, "batch": 2})
    expected_draw = torch.rand(4)

    torch.manual_seed(999)
    fresh = build_model(tiny_config().model)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.5)
    counters = checkpoint.load_training_state(path, fresh, fresh_optimizer)
    assert counters == {"step": 2, "epoch": 0, "batch": 2}
    assert torch.equal(torch.rand(4), expected_draw)  # the RNG continues where it was saved
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert fresh.output.weight is fresh.tgt_embed.tokens.weight  # still tied after loading
    saved, loaded = optimizer.state_dict(), fresh_optimizer.state_dict()
    as_json = json.dumps  # betas come back as a list, not a tuple
    assert as_json(loaded["param_groups"]) == as_json(saved["param_groups"])  # lr 1e-3, not 0.5
    for index, entry in saved["state"].items():
        for key, value in entry.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(loaded["state"][index][key])
            ), (index, key)


def test_each_rank_gets_its_own_rng_state(tmp_path):
    model, optimizer = _trained_pair()
    states = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        states.append(checkpoint.rng_state())
    path = tmp_path / checkpoint.LAST_FILE
    checkpoint.save_training_state(path, model, optimizer, {"step": 2}, rng=states)
    for rank, want in (
        (0, states[0]),
        (1, states[1]),
        (2, states[0]),
    ):  # rank 2: a process more now
        checkpoint.load_training_state(path, model, optimizer, rank=rank)
        assert torch.equal(torch.get_rng_state(), want["torch"]), rank


def test_a_weights_file_is_not_a_training_state(run_dir):
    model, optimizer = _trained_pair()
    with pytest.raises(Seq2SeqError, match="not a training state"):
        checkpoint.load_training_state(run_dir / checkpoint.BEST_FILE, model, optimizer)


def test_a_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    model, _ = _trained_pair()
    path = tmp_path / checkpoint.BEST_FILE
    checkpoint.save_model(model, path, {"step": 1})
    before = path.read_bytes()

    def dies_half_way(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", dies_half_way)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_model(model, path, {"step": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.BEST_FILE]  # no temporary left


@pytest.mark.parametrize("make", ["missing", "empty", "no-tokenizer"])
def test_not_a_run_directory(tmp_path, run_dir, make):
    target = tmp_path / "run"
    if make == "empty":
        target.mkdir()
    elif make == "no-tokenizer":
        target.mkdir()
        shutil.copy(run_dir / checkpoint.CONFIG_FILE, target)
    with pytest.raises(Seq2SeqError):
        load_run(target)
