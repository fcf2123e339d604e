"""Training from Python as a notebook cell does it (``seq2seq.train``): the CLI's config and
``--set`` overrides, and the stop button (SIGINT to the kernel) saving the run so that running
the cell again resumes it to the weights an uninterrupted run reaches; a run stopped before
its first checkpoint started afresh by the same cell or command; a second stop at once;
training from a thread."""

import signal
import threading

import pytest
import torch
from helpers import TINY_RUN

import seq2seq
from seq2seq.commands.cli import main
from seq2seq.data import prepare
from seq2seq.run import checkpoint
from seq2seq.training.trainer import Trainer

STEPS, STOP = 8, 3
TINY = [
    *TINY_RUN,
    "data.max_tokens=160",
    "model.dropout=0.1",
    "train.threads=1",
    "train.valid_bleu_sentences=2",
    "train.warmup_steps=4",
    "train.precision=fp32",
    "train.device=cpu",
    f"train.max_steps={STEPS}",
    f"train.validate_every={STEPS}",
]


@pytest.fixture
def stop_button(monkeypatch):
    """SIGINT to this process after step ``STOP``, once: what the kernel's stop button sends."""
    after_step, sent = Trainer.after_step, []

    def then_interrupt(self, *args):
        after_step(self, *args)
        if self.state.step == STOP and not sent:
            sent.append(STOP)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(Trainer, "after_step", then_interrupt)
    return sent


def test_the_stop_button_saves_and_the_same_cell_resumes_to_the_same_weights(
    tmp_path, stop_button, capsys
):
    def cell():
        return seq2seq.train(tmp_path / "cell", overrides=TINY, progress=False)

    state = cell()
    assert stop_button == [STOP]
    assert state["step"] == STOP and state["stop_reason"] == "signal SIGINT"
    assert "stopped: signal SIGINT" in capsys.readouterr().err
    state = cell()  # the cell run again
    assert state["step"] == STEPS and state["stop_reason"] == f"max_steps {STEPS}"
    assert f"resuming at step {STOP}" in capsys.readouterr().err

    seq2seq.train(tmp_path / "straight", overrides=TINY, progress=False, resume=False)
    a, _ = checkpoint.read_tensors(tmp_path / "straight" / checkpoint.LAST_FILE)
    b, _ = checkpoint.read_tensors(tmp_path / "cell" / checkpoint.LAST_FILE)
    assert a.keys() == b.keys()
    for name in a:  # weights, Adam moments and RNG state alike
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)

    state = cell()  # and again: a finished run stays as it is
    assert state["step"] == STEPS and "already finished" in capsys.readouterr().err


def test_a_config_file_and_overrides_are_the_clis(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text("train:\n  lr: 0.002\n", encoding="utf-8")
    seq2seq.train(tmp_path / "run", config, [*TINY, "train.max_steps=1"], progress=False)
    saved = checkpoint.load_config_file(tmp_path / "run")
    assert saved.train.lr == 0.002 and saved.train.max_steps == 1 and saved.model.d_model == 32
    with pytest.raises(seq2seq.Seq2SeqError, match="train.nope"):
        seq2seq.train(tmp_path / "bad", config, ["train.nope=1"])


# ---------------------------------------------------------------------------------------
# A run stopped before its first checkpoint, and training from a thread.


def command(out, *extra: str) -> int:
    """``seq2seq train --out OUT --set ...`` as the command line runs it, in this process."""
    settings = [arg for setting in TINY for arg in ("--set", setting)]
    return main(["train", "--out", str(out), "--no-progress", *settings, *extra])


def test_a_second_stop_during_validation_stops_at_once_and_the_saved_state_resumes(
    tmp_path, monkeypatch, capsys
):
    validate = Trainer.validate

    def pressed_twice(self, *args, **kwargs):  # Ctrl-C, then again before validation ends
        if self.state.step == STEPS:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        validate(self, *args, **kwargs)

    half = ["--set", f"train.validate_every={STEPS // 2}"]
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "validate", pressed_twice)
        assert command(tmp_path / "run", *half) == 130
    err = capsys.readouterr().err
    last = tmp_path / "run" / checkpoint.LAST_FILE
    assert f"a second SIGINT: stopped at once; last saved: step {STEPS // 2}, in {last}" in err
    assert "Traceback" not in err and "stopped: " not in err
    assert checkpoint.read_tensors(last)[1]["step"] == STEPS // 2
    assert command(tmp_path / "run", *half, "--resume") == 0
    assert f"resuming at step {STEPS // 2}" in capsys.readouterr().err


def test_a_run_interrupted_while_preparing_starts_afresh_with_the_same_command(
    tmp_path, monkeypatch, capsys
):
    with monkeypatch.context() as patch:  # Ctrl-C once the tokenizer is written
        patch.setattr(prepare, "_write_store", lambda *a: signal.raise_signal(signal.SIGINT))
        assert command(tmp_path / "run") == 130
    assert (tmp_path / "run" / "spm.model").is_file()
    assert not (tmp_path / "run" / checkpoint.LAST_FILE).exists()
    assert command(tmp_path / "run", "--resume") == 2
    assert "run the same command without --resume" in capsys.readouterr().err
    assert command(tmp_path / "run") == 0
    err = capsys.readouterr().err
    assert "stopped before its first checkpoint; starting it afresh" in err
    assert f"stopped: max_steps {STEPS}" in err


def test_an_error_while_preparing_leaves_a_run_that_the_same_cell_starts_afresh(
    tmp_path, monkeypatch, capsys
):
    def cell():
        return seq2seq.train(tmp_path / "cell", overrides=TINY, progress=False)

    def bad_corpus(*args):
        raise seq2seq.Seq2SeqError("train.de: a bad corpus")

    with monkeypatch.context() as patch:
        patch.setattr(prepare, "_write_store", bad_corpus)
        with pytest.raises(seq2seq.Seq2SeqError, match="a bad corpus"):
            cell()
    assert (tmp_path / "cell" / "spm.model").is_file()
    (tmp_path / "cell" / "spm.model").write_bytes(b"stale")  # the next run makes its own
    state = cell()  # the corpus mended, the cell run again
    assert state["step"] == STEPS
    assert "starting it afresh" in capsys.readouterr().err


def test_a_run_with_weights_or_files_of_its_owners_is_never_started_afresh(tmp_path):
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "config.yaml").write_text("")
    (run / ".spm-x1y2.model").write_text("")  # a temporary of a process killed mid-write
    assert checkpoint.never_checkpointed(run)
    for other in ("model.safetensors", "notes.txt", checkpoint.KEPT_DIR):
        (run / other).mkdir()
        assert not checkpoint.never_checkpointed(run), other
        with pytest.raises(seq2seq.Seq2SeqError, match="already holds a run"):
            checkpoint.prepare_run_dir(run, resume=False, overwrite=False)
        (run / other).rmdir()


def test_training_from_a_thread_runs_and_says_that_signals_cannot_stop_it(tmp_path, capsys):
    done, handler = {}, signal.getsignal(signal.SIGINT)

    def work():
        try:
            done["state"] = seq2seq.train(tmp_path / "run", overrides=TINY, progress=False)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            done["error"] = e

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=600)
    assert "error" not in done, done.get("error")
    assert done["state"]["step"] == STEPS
    assert "training in a thread, not the main one" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is handler  # the main thread's, untouched
