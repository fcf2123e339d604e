"""bf16 only where the device computes it natively; elsewhere fp32, said in the run's log."""

from __future__ import annotations

import json

import pytest
import torch
from fakes import FakeCuda, LegacyMatmul
from test_train import tiny_config, train_losses

from seq2seq.run import precision
from seq2seq.run.precision import autocast_dtype
from seq2seq.training.entry import train


@pytest.fixture
def gpus(monkeypatch) -> FakeCuda:
    """cuda:0 an A100 (compute capability 8.0), cuda:1 a T4 (7.5), as torch.cuda reports
    them: torch's ``is_bf16_supported()`` reads the current device and, by default, counts
    the T4's emulated bf16 (slower than fp32) as support."""
    fake = FakeCuda(count=2, capabilities={0: (8, 0), 1: (7, 5)}).install(monkeypatch)
    yield fake
    fake.restore()


def test_a_cuda_device_below_capability_8_gets_fp32(gpus):
    gpus.current = 1
    assert torch.cuda.is_bf16_supported()  # emulated: what native_bf16 must not take for bf16
    assert autocast_dtype("bf16", torch.device("cuda:1")) is None


def test_a_cuda_device_of_capability_8_gets_bf16(gpus):
    assert autocast_dtype("bf16", torch.device("cuda:0")) == torch.bfloat16
    assert autocast_dtype("fp32", torch.device("cuda:0")) is None


def test_the_device_asked_for_is_checked_not_the_current_one(gpus):
    gpus.current = 1
    assert autocast_dtype("bf16", torch.device("cuda:0")) == torch.bfloat16
    gpus.current = 0
    assert autocast_dtype("bf16", torch.device("cuda:1")) is None


def test_a_bf16_config_without_native_bf16_trains_in_fp32_and_says_so(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    train(
        tiny_config(train__max_steps=3, train__precision="bf16"), tmp_path / "bf16", progress=False
    )
    line = next(x for x in capsys.readouterr().err.splitlines() if "parameters;" in x)
    assert "; fp32 (note: bf16 is not native here, and emulated it is slower) on cpu" in line
    assert "bf16 autocast" not in line
    [segment] = json.loads((tmp_path / "bf16" / "environment.json").read_text())["segments"]
    assert segment["precision"] == "fp32"
    assert "fp32 (note: bf16 is not native here" in (tmp_path / "bf16" / "train.log").read_text()

    # The same numbers as a run that asked for fp32 (bf16 autocast changes the last digits).
    train(
        tiny_config(train__max_steps=3, train__precision="fp32"), tmp_path / "fp32", progress=False
    )
    assert train_losses(tmp_path / "bf16") == train_losses(tmp_path / "fp32")
    assert "; fp32 on cpu" in capsys.readouterr().err


def test_auto_is_bf16_on_a_cpu_tf32_on_cuda_and_fp16_without_bf16(gpus):
    from seq2seq.run.precision import describe_precision, resolved_precision, wants_tf32

    cpu, gpu, t4 = torch.device("cpu"), torch.device("cuda:0"), torch.device("cuda:1")
    assert resolved_precision("auto", cpu) == "bf16"
    assert resolved_precision("auto", gpu) == precision.CUDA_AUTO == "tf32"
    assert autocast_dtype("auto", gpu) is None  # fp32 tensors, TF32 matrix multiplies
    assert describe_precision("auto", None, gpu) == "fp32 with TF32 matrix multiplies on cuda:0"
    # Below compute capability 8.0 there is neither bf16 nor TF32 in hardware: fp16, scaled.
    assert resolved_precision("auto", t4) == "fp16" and not wants_tf32("auto", t4)
    assert autocast_dtype("auto", t4) == torch.float16
    assert describe_precision("auto", torch.float16, t4) == (
        "fp16 autocast with loss scaling on cuda:1"
    )


def test_fp16_is_fp16_on_every_device_and_a_cpu_is_told_it_is_slow():
    """Asked for, fp16 runs where it is asked, as fairseq's --fp16 does on a device without
    fast fp16, with a note on a CPU (a run's line: test_scaling)."""
    from seq2seq.run.precision import FP16, describe_precision, precision_name

    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    assert autocast_dtype("fp16", cpu) == autocast_dtype("fp16", gpu) == torch.float16
    assert precision_name("fp16", torch.float16, cpu) == FP16 == "fp16 autocast"
    assert describe_precision("fp16", torch.float16, gpu) == (
        "fp16 autocast with loss scaling on cuda:0"
    )
    assert describe_precision("fp16", torch.float16, cpu) == (
        "fp16 autocast with loss scaling (note: fp16 is for GPUs without bf16; a CPU without "
        "fp16 arithmetic, most of them, computes it many times slower than fp32) on cpu"
    )


def test_the_bf16_note_is_for_a_run_that_asked_for_bf16(monkeypatch):
    """On a CPU without native bf16, ``auto`` is fp32 without a word: nobody asked for bf16."""
    from seq2seq.run.precision import describe_precision

    cpu = torch.device("cpu")
    assert describe_precision("auto", None, cpu) == "fp32 on cpu"
    assert describe_precision("fp32", None, cpu) == "fp32 on cpu"
    assert "note: bf16 is not native here" in describe_precision("bf16", None, cpu)


def test_tf32_is_in_force_inside_the_block_alone_through_the_current_api(tf32_switch, gpus):
    """torch >= 2.9: ``fp32_precision`` is set inside and put back after, whatever it was
    (a user's own "tf32" included, after which torch's legacy getter raises) and however the
    block ends; on the CPU nothing changes."""
    from seq2seq.run.precision import matmul_precision, tf32_in_force

    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    for before in ("none", "ieee", "tf32"):
        tf32_switch.fp32_precision = before
        with matmul_precision("auto", gpu):
            assert tf32_switch.fp32_precision == "tf32" and tf32_in_force(gpu)
            assert not tf32_in_force(cpu)
        assert tf32_switch.fp32_precision == before
        with pytest.raises(KeyboardInterrupt), matmul_precision("fp32", gpu):
            assert tf32_switch.fp32_precision == "ieee" and not tf32_in_force(gpu)
            raise KeyboardInterrupt
        assert tf32_switch.fp32_precision == before
        with matmul_precision("tf32", cpu):
            assert tf32_switch.fp32_precision == before


def test_before_torch_2_9_the_legacy_switch_is_set_and_put_back(monkeypatch):
    from seq2seq.run.precision import matmul_precision, tf32_in_force

    legacy = LegacyMatmul()
    monkeypatch.setattr(torch.backends.cuda, "matmul", legacy)
    gpu = torch.device("cuda:0")
    for before in (False, True):
        legacy.allow_tf32 = before
        with matmul_precision("tf32", gpu):
            assert legacy.allow_tf32 is True and tf32_in_force(gpu)
        assert legacy.allow_tf32 is before
        with matmul_precision("bf16", gpu):
            assert legacy.allow_tf32 is False and not tf32_in_force(gpu)
        assert legacy.allow_tf32 is before


def test_a_run_on_cuda_leaves_the_tf32_switch_as_it_found_it(tmp_path, monkeypatch, tf32_switch):
    """The switch is the process's: a run never sets it outside its training (here one on
    four fake GPUs, which stops where this CPU build cannot place the model on one)."""
    tf32_switch.fp32_precision = "ieee"
    fake = FakeCuda(count=4).install(monkeypatch)  # which puts back the switch it found
    config = tiny_config(train__device="cuda", train__precision="tf32", train__max_steps=1)
    try:
        with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
            train(config, tmp_path / "run", progress=False)
    finally:
        fake.restore()
    assert tf32_switch.fp32_precision == "ieee"
