"""Training from Python as a notebook cell does it (``seq2seq.train``): the CLI's config and
``--set`` overrides, and the stop button (SIGINT to the kernel) saving the run so that running
the cell again resumes it to the weights an uninterrupted run reaches."""

import signal

import pytest
import torch
from helpers import TINY_RUN

import seq2seq
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
