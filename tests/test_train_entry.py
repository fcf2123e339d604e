"""Training from Python as a notebook cell does it (``seq2seq.train``): the CLI's config and
``--set`` overrides, and the stop button (SIGINT to the kernel) saving the run so that running
the cell again resumes it to the weights an uninterrupted run reaches; a run stopped before
its first checkpoint started afresh by the same cell or command; a second stop at once;
training from a thread."""

import json
import shutil
import signal
import threading
from pathlib import Path

import pytest
import torch
from helpers import TINY_RUN

import seq2seq
from seq2seq.commands.cli import main
from seq2seq.data import prepare
from seq2seq.run import checkpoint, rundir
from seq2seq.training.trainer import Trainer
from seq2seq.training.validation import Validation

REPO = Path(__file__).resolve().parents[1]
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


@pytest.fixture(autouse=True)
def interruptible():
    """SIGINT raises KeyboardInterrupt, as in a process started at a terminal: a suite started
    in the background (``pytest &``) inherits SIGINT ignored, and Ctrl-C would do nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


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
    err = capsys.readouterr().err
    assert f"stopped: signal SIGINT; not validated yet; {STOP} steps" in err
    assert "to continue it, call seq2seq.train again with resume=True" in err
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
    validate = Validation.validate

    def pressed_twice(self, *args, **kwargs):  # Ctrl-C, then again before validation ends
        if self.state.step == STEPS:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        validate(self, *args, **kwargs)

    half = ["--set", f"train.validate_every={STEPS // 2}"]
    with monkeypatch.context() as patch:
        patch.setattr(Validation, "validate", pressed_twice)
        assert command(tmp_path / "run", *half) == 130
    err = capsys.readouterr().err
    last = tmp_path / "run" / checkpoint.LAST_FILE
    assert f"a second SIGINT: stopped at once; last saved: step {STEPS // 2}, in {last}" in err
    assert "Traceback" not in err and "stopped: " not in err
    assert checkpoint.read_tensors(last)[1]["step"] == STEPS // 2
    assert command(tmp_path / "run", *half, "--resume") == 0
    assert f"resuming at step {STEPS // 2}" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stop_saves_exits_non_zero_and_says_how_to_continue(
    tmp_path, monkeypatch, capsys, sig
):
    after_step = Trainer.after_step

    def then_signal(self, *args):
        after_step(self, *args)
        if self.state.step == STOP:
            signal.raise_signal(sig)

    monkeypatch.setattr(Trainer, "after_step", then_signal)
    assert command(tmp_path / "run") == 128 + sig.value  # 130 for SIGINT, the shell's
    err = capsys.readouterr().err
    assert f"stopped: signal {sig.name}; not validated yet; {STOP} steps" in err
    assert "best validation BLEU" not in err  # there is none
    assert "to continue it, run the same command with --resume" in err
    assert checkpoint.read_tensors(tmp_path / "run" / checkpoint.LAST_FILE)[1]["step"] == STOP


def test_a_stop_just_after_the_first_validation_wrote_weights_leaves_a_run_that_resumes(
    tmp_path, monkeypatch, capsys
):
    save_model, run = checkpoint.save_model, tmp_path / "run"

    def then_stopped(*args):  # the best weights written, then Ctrl-C twice: stopped at once
        save_model(*args)
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "save_model", then_stopped)
        assert command(run) == 130
    last = run / checkpoint.LAST_FILE
    assert (run / checkpoint.BEST_FILE).is_file()
    assert f"stopped at once; last saved: step 0, in {last}" in capsys.readouterr().err
    assert command(run, "--resume") == 0
    assert "resuming at step 0" in capsys.readouterr().err


def test_a_corpus_that_data_max_len_drops_whole_is_one_line_and_keeps_no_model(tmp_path, capsys):
    pairs = len((REPO / "data" / "sample" / "train.de").read_text(encoding="utf-8").splitlines())
    run = tmp_path / "run"
    assert command(run, "--set", "data.max_len=1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"data.max_len 1 drops every training pair (all {pairs:,}: longer than 1" in err
    assert not list(run.glob("*.safetensors"))
    assert command(run) == 0  # the run's own, with no weights: started afresh
    with pytest.raises(seq2seq.Seq2SeqError, match="data.max_len 2 drops every training pair"):
        seq2seq.train(tmp_path / "cell", overrides=[*TINY, "data.max_len=2"], progress=False)


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
    with pytest.raises(seq2seq.Seq2SeqError, match="call seq2seq.train again without resume=True"):
        seq2seq.train(tmp_path / "cell", overrides=TINY, resume=True, progress=False)
    (tmp_path / "cell" / "spm.model").write_bytes(b"stale")  # the next run makes its own
    state = cell()  # the corpus mended, the cell run again
    assert state["step"] == STEPS
    assert "starting it afresh" in capsys.readouterr().err


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder``, hidden ones too, with a file's bytes (None: a folder)."""
    return {
        p.relative_to(folder).as_posix(): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


def a_users_folder(folder: Path) -> Path:
    """``folder`` as a user keeps one: their corpus in data/, their config, their notes."""
    shutil.copytree(REPO / "data" / "sample", folder / "data")
    (folder / "config.yaml").write_text("# mine\ntrain:\n  lr: 0.002\n", encoding="utf-8")
    (folder / "notes.txt").write_text("mine", encoding="utf-8")
    return folder


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"]])
def test_a_users_corpus_and_config_in_the_out_folder_are_refused_and_left_as_they_were(
    tmp_path, capsys, flags
):
    exp = a_users_folder(tmp_path / "exp")
    before = tree(exp)
    mine = ["--config", str(exp / "config.yaml"), "--data", str(exp / "data"), *flags]
    assert command(exp, *mine) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    if flags == ["--resume"]:
        assert f"cannot resume: {exp / checkpoint.LAST_FILE} does not exist" in err
    else:
        assert "config.yaml, data/, notes.txt; nothing in it was changed" in err
    assert tree(exp) == before  # not even a lock file was left


@pytest.mark.parametrize("flags", [[], ["--overwrite"]])
def test_out_dot_in_a_project_folder_is_refused_and_left_as_it_was(
    tmp_path, monkeypatch, capsys, flags
):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.txt").write_text("my corpus", encoding="utf-8")
    before = tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert command(".", *flags) == 2
    assert "already holds files and is not a seq2seq run" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_a_runs_own_directory_refuses_by_name_what_no_run_wrote(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    with monkeypatch.context() as patch:  # stopped while preparing: the run's, no weights
        patch.setattr(prepare, "_write_store", lambda *a: signal.raise_signal(signal.SIGINT))
        assert command(run) == 130
    assert (run / rundir.MARKER).is_file() and rundir.foreign_entries(run) == []
    for mine in ("notes.txt", "data/mine.txt", "subword/mine.txt", ".ipynb_checkpoints/x"):
        (run / mine).parent.mkdir(exist_ok=True)
        (run / mine).write_text("mine")
        before = tree(run)
        for flags in ([], ["--overwrite"]):
            assert command(run, *flags) == 2
            err = capsys.readouterr().err
            assert f"{run} holds {mine.split('/x')[0] + '/' * mine.endswith('/x')}" in err, err
            assert "which no run wrote" in err and tree(run) == before
        (run / mine).unlink()
        if mine.startswith("."):  # a folder of no run's, left empty
            (run / mine).parent.rmdir()
    assert command(run) == 0  # nothing of anyone else's left: started afresh
    assert "starting it afresh" in capsys.readouterr().err
    assert command(run) == 2
    assert "already holds a run; use --resume to continue it" in capsys.readouterr().err


def test_a_run_from_before_the_marker_resumes_and_is_overwritten_only_when_all_its_own(
    tmp_path, capsys
):
    run = tmp_path / "run"
    assert command(run, "--set", "train.max_steps=2") == 0
    (run / rundir.MARKER).unlink()  # as an earlier version wrote it
    assert command(run, "--set", "train.max_steps=3", "--resume") == 0
    assert "resuming at step 2" in capsys.readouterr().err
    assert json.loads((run / rundir.MARKER).read_text())["note"].startswith("resumed a run")
    (run / rundir.MARKER).unlink()
    (run / "notes.txt").write_text("mine")
    assert command(run, "--overwrite") == 2
    assert "holds notes.txt, which no run wrote" in capsys.readouterr().err
    (run / "notes.txt").unlink()
    assert command(run, "--overwrite") == 0
    (run / rundir.MARKER).unlink()
    (run / checkpoint.LAST_FILE).unlink()  # weights and no training state: not provably a run
    for flags in ([], ["--overwrite"]):
        assert command(run, *flags) == 2
        assert "is not a seq2seq run" in capsys.readouterr().err


def test_refusals_name_the_python_arguments_to_a_python_caller(tmp_path):
    seq2seq.train(tmp_path / "run", overrides=[*TINY, "train.max_steps=1"], progress=False)
    with pytest.raises(
        seq2seq.Seq2SeqError, match="use resume=True to continue it or overwrite=True"
    ):
        seq2seq.train(tmp_path / "run", overrides=TINY, resume=False, progress=False)


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
