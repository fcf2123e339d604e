"""fp16's loss scaling on the CPU: the loss scaled, the gradients unscaled before clipping, an
overflowed step skipped (and not counted bad) with the scale halved, the scale grown after
clean steps, the run stopped when no scale is small enough; off in every other precision."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_train import read_metrics, tiny_config

from seq2seq.errors import Seq2SeqError
from seq2seq.run.precision import FP16, describe_precision
from seq2seq.run.runtime import Runtime
from seq2seq.training import scaling, steps
from seq2seq.training.entry import train
from seq2seq.training.scaling import LossScaling
from seq2seq.training.trainer import Trainer

NO_DROPOUT = {"model__dropout": 0.0, "train__early_dropout": None}


def fp16_trainer(tmp_path, monkeypatch, init_scale: float, **changes) -> Trainer:
    """A trainer of the tiny model whose loss scale starts at ``init_scale``: 2**17 and above
    overflow its fp16 gradients (the loss scale doubling from 2**17 shows it), below do not."""
    monkeypatch.setattr(scaling, "LOSS_SCALE", {**scaling.LOSS_SCALE, "init_scale": init_scale})
    config = tiny_config(train__precision="fp16", **NO_DROPOUT, **changes)
    return Trainer(config, tmp_path / "run", Runtime(), False, False, False)


def first_step(t: Trainer) -> tuple[float | None, int]:
    group = t.sampler.batches(0)[:1]
    return t.train_step(group, t.my_batches(group))


@pytest.fixture
def clipping(monkeypatch) -> list[tuple[float, float]]:
    """Each clip's (norm it measured, norm of the gradients it left)."""
    clip, seen = torch.nn.utils.clip_grad_norm_, []

    def recorded(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        norm = clip(parameters, max_norm, *args, **kwargs)
        left = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))
        seen.append((float(norm), float(left)))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recorded)
    return seen


def test_the_gradients_are_unscaled_before_clipping_measures_them(tmp_path, monkeypatch, clipping):
    """At a loss scale of 2**10 the fp16 step's clip measures fp32's norm (to fp16's rounding),
    not 1024 times it, and clips the gradients the optimizer takes to train.clip_norm."""
    t = fp16_trainer(tmp_path, monkeypatch, 2.0**10, train__clip_norm=0.05)
    start = [{k: v.clone() for k, v in t.model.state_dict().items()}, t.optimizer.state_dict()]
    assert math.isfinite(first_step(t)[0])
    assert t.scaling.scaler.get_scale() == 2.0**10  # a clean step: no change before 2000
    t.model.load_state_dict(start[0])
    t.optimizer.load_state_dict(start[1])
    t.dtype, t.scaling = None, LossScaling(None, t.runtime.device)  # the same step in fp32
    assert math.isfinite(first_step(t)[0])
    (norm16, left16), (norm32, left32) = clipping
    assert norm16 == pytest.approx(norm32, rel=1e-2) and norm32 > 0.05
    assert left16 == pytest.approx(0.05, rel=1e-3) and left32 == pytest.approx(0.05, rel=1e-3)


def test_an_overflowed_step_is_skipped_and_halves_the_scale(tmp_path, monkeypatch):
    t = fp16_trainer(tmp_path, monkeypatch, 2.0**24)
    before = {name: w.clone() for name, w in t.model.state_dict().items()}
    loss, n_tokens = first_step(t)
    assert loss is None and n_tokens > 0  # not NaN: the scaler's skip, not a bad step
    assert t.scaling.scaler.get_scale() == 2.0**23
    assert all(torch.equal(w, before[name]) for name, w in t.model.state_dict().items())
    assert t.optimizer.state_dict()["state"] == {}  # Adam never stepped
    assert all(p.grad is None for p in t.model.parameters())


def test_a_non_finite_loss_is_a_bad_step_in_fp16_too(tmp_path, monkeypatch):
    """Scaling cannot help a loss already NaN in the forward pass: the bad-step count does."""
    t = fp16_trainer(tmp_path, monkeypatch, 2.0**10)
    loss = steps.sequence_loss
    monkeypatch.setattr(steps, "sequence_loss", lambda *args: loss(*args) * math.nan)
    loss, _ = first_step(t)
    assert loss is not None and math.isnan(loss)


def test_skipped_steps_are_counted_apart_and_the_scale_grows_after_clean_steps(
    tmp_path, monkeypatch, capsys
):
    """From 2**20 the first steps overflow down to 2**17; then every 3 clean steps the scale
    doubles to 2**18, which overflows: skips in the metrics, none of them a bad step, and the
    step budget counts only the steps taken. The run says it is fp16, slow on a CPU."""
    monkeypatch.setattr(scaling, "LOSS_SCALE", {"init_scale": 2.0**20, "growth_interval": 3})
    config = tiny_config(train__precision="fp16", train__max_steps=7, train__max_bad_steps=0)
    state = train(config, tmp_path / "run", progress=False)
    line = next(x for x in capsys.readouterr().err.splitlines() if "parameters;" in x)
    assert describe_precision("fp16", torch.float16, torch.device("cpu")) in line
    [segment] = json.loads((tmp_path / "run" / "environment.json").read_text())["segments"]
    assert segment["precision"] == FP16
    lines = read_metrics(tmp_path / "run", "train")
    assert state["step"] == 7 and state["bad_steps"] == 0
    assert state["scaler_skips"] == lines[-1]["scaler_skips"] >= 4
    assert 11 * state["epoch"] + state["batch"] == 7 + state["scaler_skips"]  # batches used
    scales = [line["loss_scale"] for line in lines]
    assert scales[:3] == [2.0**17, 2.0**17, 2.0**18]  # three skips, then growth after three
    assert scales[3] == 2.0**17 and lines[3]["scaler_skips"] == 4  # 2**18 overflowed
    assert "loss_scale" not in read_metrics(tmp_path / "run", "valid")[0]


def test_a_scale_too_small_for_any_step_stops_the_run_in_one_line():
    s = LossScaling(torch.float16, torch.device("cpu"))
    s.scale(torch.ones(()))  # the scale is made at its first use
    assert s.count_skip(0) == 1
    s.scaler.update(new_scale=scaling.MIN_LOSS_SCALE / 2)
    with pytest.raises(Seq2SeqError, match="fp16 gradients overflow at any loss scale") as e:
        s.count_skip(7)
    assert "after 8 skipped steps" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_outside_fp16_the_scaler_changes_nothing(dtype):
    s = LossScaling(dtype, torch.device("cpu"))
    loss = torch.tensor(3.0)
    assert s.scale(loss) is loss
    assert not s.on and s.values(0) == {} and s.saved() == {}
    assert not s.overflowed(1.0)  # a non-finite gradient there is a bad step
