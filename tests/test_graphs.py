"""The captured training step (train.cuda_graphs) on a CPU, through the fake of torch.cuda's
graphs (tests/fakes.py): the step a graph records trains as the trainer's eager step, skips a
non-finite step on the device, leaves the state as it found it after the capture, and resumes
exactly; the setting refuses in one line what it cannot capture, and auto stays off. What a
real capture does on a GPU is the device check's to show (experiments/device_check.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from fakes import FakeCuda, FakeGraphs
from helpers import assert_trained_alike
from test_train import tiny_config

from seq2seq.data.batching import collate
from seq2seq.errors import Seq2SeqError
from seq2seq.model.transformer import build_model
from seq2seq.run.checkpoint import read_tensors
from seq2seq.run.runtime import Runtime
from seq2seq.training import graphs
from seq2seq.training.entry import train
from seq2seq.training.optim import Optimizers
from seq2seq.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
EAGER = {"model__dropout": 0.0, "train__early_dropout": None, "data__pad_to_buckets": "true"}


@pytest.fixture
def fake_graphs(monkeypatch) -> FakeGraphs:
    """Captures on this CPU: the fake in place of torch.cuda's graphs, and the device's
    refusal lifted (every other refusal stays)."""
    fake, refusals = FakeGraphs(), graphs.refusals
    monkeypatch.setattr(graphs, "CudaGraphs", lambda: fake)
    monkeypatch.setattr(
        graphs, "refusals", lambda c, r: [w for w in refusals(c, r) if "CUDA" not in w]
    )
    return fake


def trainer(tmp_path, name: str, **changes) -> Trainer:
    return Trainer(tiny_config(**changes), tmp_path / name, Runtime(), False, False, False)


def weights(t: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in t.model.state_dict().items()}


def test_the_captured_step_trains_as_the_eager_step(tmp_path, fake_graphs):
    """Five steps replayed from their graphs give the eager step's losses and weights (to
    rounding: the learning rate is a float32 tensor), over batches of several shapes."""
    eager = trainer(tmp_path, "eager", **EAGER)
    captured = trainer(tmp_path, "captured", train__cuda_graphs="true", **EAGER)
    assert fake_graphs.captured == len(captured.buckets.lengths) > 1
    torch.testing.assert_close(weights(captured), weights(eager), rtol=0, atol=0)
    groups = [[b] for b in eager.sampler.batches(0)[:5]]
    assert len({tuple(eager.my_batches(g)[0][0].src.shape) for g in groups}) > 1
    for group in groups:
        loss, n_tokens = eager.train_step(group, eager.my_batches(group))
        eager.state.step += 1
        assert captured.take_step(group, captured.my_batches(group)) == (None, n_tokens)
        captured.state.step += 1
        replayed, skipped = captured.graphs.read()
        assert (replayed, skipped) == (pytest.approx(loss, rel=1e-5), 0)
    assert_trained_alike(eager.model, weights(captured), weights(eager), rtol=1e-4, atol=1e-6)


def test_a_non_finite_step_is_skipped_on_the_device(tmp_path, fake_graphs):
    """A step whose loss is infinite (its token count 0 here) leaves the weights and Adam's
    moments and step count as they were, counts one skipped step for the next read, and the
    next step trains."""
    t = trainer(tmp_path, "run", train__cuda_graphs="true", **EAGER)
    group = t.sampler.batches(0)[:1]
    ((batch, _),) = t.my_batches(group)
    t.graphs.step(batch, t.step_tokens(group))
    before = weights(t), {k: v.clone() for k, v in t.optimizer.state_dict()["state"][0].items()}
    t.graphs.step(batch, 0)
    assert t.graphs.read()[1] == 1
    torch.testing.assert_close(weights(t), before[0], rtol=0, atol=0)
    after = t.optimizer.state_dict()["state"][0]
    for key, value in before[1].items():
        torch.testing.assert_close(after[key], value, rtol=0, atol=0, msg=key)
    t.graphs.step(batch, t.step_tokens(group))
    assert t.graphs.read()[1] == 0
    assert not torch.equal(
        weights(t)["src_embed.tokens.weight"], before[0]["src_embed.tokens.weight"]
    )


def test_the_capture_leaves_weights_adam_and_the_rng_as_they_were(tmp_path, fake_graphs):
    """The warm-up and capture steps trained, and were undone in place: the weights are the
    eager trainer's first ones, Adam's state is what its first step would make it from
    (zeros, step 0), and the RNG draws what it would have drawn."""
    eager = trainer(tmp_path, "eager", **EAGER)
    rng = torch.get_rng_state()
    captured = trainer(tmp_path, "captured", train__cuda_graphs="true", **EAGER)
    torch.testing.assert_close(weights(captured), weights(eager), rtol=0, atol=0)
    state = captured.optimizer.parts[0].state
    assert state and all(not v.any() for s in state.values() for v in s.values())
    assert captured.graphs.read() == (0.0, 0)
    torch.set_rng_state(rng)
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_captured_run_resumes_exactly(tmp_path, fake_graphs):
    """With dropout on (its masks from the RNG that the capture restores), 30 steps in one go
    and 16 + 14 with --resume end on the same weights and the same logged losses."""
    settings = {"train__cuda_graphs": "true", "data__pad_to_buckets": "true"}
    settings |= {"train__log_every": 2, "train__validate_every": 8}
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(tiny_config(train__max_steps=30, **settings), whole, progress=False)
    train(tiny_config(train__max_steps=16, **settings), parts, progress=False)
    train(tiny_config(train__max_steps=30, **settings), parts, resume=True, progress=False)
    a, b = (read_tensors(run / "last.safetensors")[0] for run in (whole, parts))
    for key in (k for k in a if k.startswith(("model.", "optim."))):
        assert torch.equal(a[key], b[key]), key

    def losses(run):
        lines = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        return {r["step"]: r["loss"] for r in lines if r["kind"] == "train"}

    assert losses(whole) == losses(parts) and len(losses(whole)) == 15
    log = (parts / "train.log").read_text()
    assert log.count("captured the training step as CUDA graphs") == 2  # again on resume


@pytest.mark.parametrize(
    ("changes", "needs"),
    [
        ({}, "a CUDA device"),
        ({"train__optimizer": "muon"}, "train.optimizer adam"),
        ({"train__accum_steps": 2}, "train.accum_steps 1"),
        ({"train__ema": 0.999}, "train.ema 0"),
        ({"data__pad_to_buckets": "false"}, "data.pad_to_buckets true or auto"),
    ],
)
def test_cuda_graphs_true_refuses_in_one_line_what_it_cannot_capture(tmp_path, changes, needs):
    config = tiny_config(train__cuda_graphs="true", **changes)
    with pytest.raises(Seq2SeqError, match="train.cuda_graphs true needs") as error:
        Trainer(config, tmp_path / "run", Runtime(), False, False, False)
    assert needs in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_auto_captures_nowhere_until_a_gpu_record_says_so(monkeypatch):
    """auto on a (fake) CUDA device that could capture: off, as GRAPHS_WIN is empty."""
    cuda = FakeCuda().install(monkeypatch)
    try:
        runtime = Runtime(device=torch.device("cuda", 0))
        assert frozenset() == graphs.GRAPHS_WIN
        assert not graphs.wants_graphs(tiny_config(), runtime)
        assert graphs.wants_graphs(tiny_config(train__cuda_graphs="true"), runtime)
    finally:
        cuda.restore()


def test_a_device_learning_rate_is_filled_in_place_and_saved_as_a_number():
    """The schedule fills a captured step's learning rate tensor (the graph holds it), and
    the saved state holds numbers JSON can write, read back by an eager Adam."""
    p = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.Adam([p], lr=0.1)
    rate = adam.param_groups[0]["lr"] = torch.tensor(0.1)
    both = Optimizers([adam], [0.1])
    both.set_lr(0.5)
    assert adam.param_groups[0]["lr"] is rate and rate.item() == pytest.approx(0.05)
    assert both.lr == pytest.approx(0.05)
    saved = both.state_dict()
    json.dumps(saved["param_groups"])
    assert saved["param_groups"][0]["lr"] == pytest.approx(0.05)
    fresh = Optimizers([torch.optim.Adam([torch.nn.Parameter(torch.ones(3))], lr=1.0)], [1.0])
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == pytest.approx(0.05)


def test_the_fake_refuses_what_a_capture_cannot_record(tmp_path, fake_graphs):
    """The fake keeps the contract it stands for: a read of the device inside a capture
    raises, and so does a replay after the step's gradients moved."""
    t = trainer(tmp_path, "run", train__cuda_graphs="true", **EAGER)
    step = next(iter(t.graphs.steps.values()))
    with pytest.raises(AssertionError, match="read on the host"):
        fake_graphs.capture(lambda: step.n_tokens.item(), None)
    graph = next(iter(t.graphs.graphs.values()))
    t.model.zero_grad(set_to_none=True)
    with pytest.raises(AssertionError, match="set to None"):
        graph.replay()


@pytest.mark.parametrize("reference", [False, True])
def test_bench_trains_a_captured_model_as_its_eager_step(fake_graphs, reference):
    """bench_train's captured contestants (ours, and nn.Transformer called as model(src,
    tgt_in)) take the eager contestant's losses over three steps from the same weights."""
    import copy
    import sys

    sys.path.insert(0, str(REPO / "experiments"))
    from experiments.bench_train import CapturedTrainee, Reference, Trainee

    config = tiny_config(model__dropout=0.0)
    c = config.model
    c.src_vocab_size = c.tgt_vocab_size = 50
    torch.manual_seed(0)
    model = Reference(c, False, True) if reference else build_model(c)
    eager = Trainee("eager", copy.deepcopy(model), config, None)
    captured = CapturedTrainee("captured", copy.deepcopy(model), config, None, reference)
    batches = [collate(*random_pairs(seed)) for seed in range(3)]
    for batch in batches:
        eager.step(batch)
        captured.step(batch)
    assert captured.losses == pytest.approx(eager.losses, rel=1e-5)


def random_pairs(seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """A few pairs of random ordinary ids, sides of 3 to 9."""
    g = torch.Generator().manual_seed(seed)

    def side() -> list[int]:
        return torch.randint(
            4, 50, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g
        ).tolist()

    pairs = [(side(), side()) for _ in range(4)]
    return [s for s, _ in pairs], [t for _, t in pairs]


def test_a_step_skipped_after_the_last_log_line_is_counted_at_the_epochs_end(
    tmp_path, fake_graphs, monkeypatch
):
    """No log line reads the device in this epoch (log_every 1000): the epoch's end does, and
    the step skipped on the device is counted and said."""
    t = trainer(
        tmp_path,
        "run",
        train__cuda_graphs="true",
        train__log_every=1000,
        train__max_epochs=1,
        **EAGER,
    )
    clean, calls = graphs.sequence_loss, []

    def poisoned(*args):
        calls.append(1)
        return clean(*args) * (math.inf if len(calls) == 2 else 1.0)

    monkeypatch.setattr(graphs, "sequence_loss", poisoned)
    t.run()
    assert len(calls) > 2 and t.state.bad_steps == 1
    assert "non-finite loss at a step before" in (tmp_path / "run" / "train.log").read_text()


def test_fp16_is_refused_where_auto_resolves_to_it(monkeypatch):
    """Below compute capability 8.0 auto trains in fp16, whose loss scaler reads the device:
    train.cuda_graphs true refuses it as it refuses precision fp16."""
    cuda = FakeCuda(capability=(7, 0)).install(monkeypatch)
    try:
        runtime = Runtime(device=torch.device("cuda", 0))
        with pytest.raises(Seq2SeqError, match="a precision other than fp16"):
            graphs.wants_graphs(
                tiny_config(train__cuda_graphs="true", train__precision="auto"), runtime
            )
    finally:
        cuda.restore()
