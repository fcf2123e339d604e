"""The optimizers and the weights' moving average: Muon orthogonalises each packed block as the
matrix it stands for, takes the layers' matrices and nothing else, shares Adam's schedule and
state dict; the moving average is the hand-computed one."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from seq2seq.config import load_config
from seq2seq.errors import Seq2SeqError
from seq2seq.model.transformer import build_model
from seq2seq.training import optim
from seq2seq.training.ema import WeightEMA


def config(*overrides: str):
    c = load_config(None, ["model.d_model=32", "model.n_heads=4", "model.d_ff=64", *overrides])
    c.model.src_vocab_size = c.model.tgt_vocab_size = 50
    return c


def grads_like(params: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=generator) for p in params]


@pytest.mark.parametrize("adjust", ["match_rms_adamw", "original"])
@pytest.mark.parametrize("rows", [[8, 8, 8], [8, 4, 4]], ids=["MHA", "GQA"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("ns_steps", [5, 2])
def test_a_packed_step_equals_torchs_muon_on_the_separate_blocks(rows, adjust, dtype, ns_steps):
    torch.manual_seed(0)
    packed = nn.Parameter(torch.randn(sum(rows), 8))
    start = packed.detach().clone()
    blocks = [nn.Parameter(b.detach().clone()) for b in packed.split(rows)]
    settings = {"lr": 0.02, "weight_decay": 0.1, "adjust_lr_fn": adjust, "ns_steps": ns_steps}
    ours = optim.block_muon()([{"params": [packed], "blocks": rows}], **settings)
    ours.ns_dtype = dtype
    theirs = torch.optim.Muon(blocks, **settings)  # Newton–Schulz in bf16
    whole = torch.optim.Muon([nn.Parameter(start.clone())], **settings)
    for step in range(3):  # the momentum carries over steps
        grads = grads_like(blocks, seed=step)
        packed.grad = torch.cat(grads)
        for b, g in zip(blocks, grads, strict=True):
            b.grad = g
        whole.param_groups[0]["params"][0].grad = torch.cat(grads)
        for o in (ours, theirs, whole):
            o.step()
    expected = torch.cat([b.detach() for b in blocks])
    if dtype == torch.bfloat16:  # torch's own arithmetic, block by block
        torch.testing.assert_close(packed.detach(), expected, rtol=0, atol=0)
    else:  # the same steps, to bf16's precision
        torch.testing.assert_close(packed - start, expected - start, rtol=0.02, atol=2e-3)
    # the packed matrix orthogonalised whole steps elsewhere
    moved = whole.param_groups[0]["params"][0].detach()
    assert not torch.allclose(moved - start, expected - start, rtol=0.02, atol=2e-3)


def test_the_newton_schulz_iteration_orthogonalises():
    g = torch.randn(16, 48, generator=torch.Generator().manual_seed(0))
    for matrix in (g, g.T):
        o = optim.newton_schulz(matrix, (3.4445, -4.775, 2.0315), 5, 1e-7, torch.float32)
        singular = torch.linalg.svdvals(o)
        assert o.shape == matrix.shape and singular.min() > 0.5 and singular.max() < 1.5
        u, _, vh = torch.linalg.svd(matrix, full_matrices=False)  # the direction of U Vᵀ
        assert torch.nn.functional.cosine_similarity(o.flatten(), (u @ vh).flatten(), 0) > 0.9


def test_muon_takes_the_layers_matrices_and_adam_everything_else():
    model = build_model(config().model)
    optimizers = optim.build_optimizer(model, config("train.optimizer=muon"))
    adam, muon = optimizers.parts
    in_adam = {id(p) for g in adam.param_groups for p in g["params"]}
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert in_adam.isdisjoint(in_muon) and in_adam | in_muon == set(names)
    assert {names[i] for i in in_muon} == {
        n for n, p in model.named_parameters() if p.dim() == 2 and "_layers." in n
    }
    assert all(
        ".tokens." in names[i]
        or names[i] == "output.weight"
        or model.get_parameter(names[i]).dim() == 1
        for i in in_adam
    )
    assert {g["ns_steps"] for g in muon.param_groups} == {5}  # torch's default
    _, fewer = optim.build_optimizer(
        model, config("train.optimizer=muon", "train.muon_ns_steps=3")
    ).parts
    assert {g["ns_steps"] for g in fewer.param_groups} == {3}
    packings = {tuple(g["blocks"]): {names[id(p)] for p in g["params"]} for g in muon.param_groups}
    assert all(n.endswith("in_proj.weight") for n in packings[(32, 32, 32)])
    assert all(not n.endswith("in_proj.weight") for n in packings[()])


def test_the_schedule_drives_both_optimizers_from_their_own_peaks():
    model = build_model(config().model)
    optimizers = optim.build_optimizer(
        model, config("train.optimizer=muon", "train.lr=0.002", "train.muon_lr=0.006")
    )
    optimizers.set_lr(0.5)
    adam, muon = optimizers.parts
    assert {g["lr"] for g in adam.param_groups} == {0.001}
    assert {g["lr"] for g in muon.param_groups} == {0.003}


def test_the_state_dict_of_both_restores_both():
    model = build_model(config().model).eval()  # no dropout: the same step twice
    c = config("train.optimizer=muon")
    first = optim.build_optimizer(model, c)
    src, tgt = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 6))

    def step(optimizer) -> None:
        optimizer.zero_grad()
        model(src, tgt).square().mean().backward()
        optimizer.step()

    step(first)
    saved = copy.deepcopy(first.state_dict())
    assert len(saved["state"]) == sum(1 for _ in model.parameters())  # Adam's, then Muon's
    weights = copy.deepcopy(model.state_dict())
    step(first)
    after = copy.deepcopy(model.state_dict())
    model.load_state_dict(weights)
    second = optim.build_optimizer(model, c)
    second.load_state_dict(saved)
    step(second)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, after[name], rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="parameter groups saved"):
        optim.build_optimizer(model, config()).load_state_dict(saved)


def test_adams_state_dict_is_adams_own():
    model = build_model(config().model)
    optimizers = optim.build_optimizer(model, config())
    [adam] = optimizers.parts
    assert isinstance(adam, torch.optim.Adam)
    assert optimizers.state_dict() == adam.state_dict()


def test_a_torch_without_muon_is_told_the_version_it_needs(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon")
    model = build_model(config().model)
    with pytest.raises(Seq2SeqError, match=r"needs torch >= 2\.9 \(torch\.optim\.Muon\)") as e:
        optim.build_optimizer(model, config("train.optimizer=muon"))
    assert "\n" not in str(e.value)


def test_the_moving_average_is_the_hand_computed_one():
    layer = nn.Linear(2, 1)
    start = copy.deepcopy(layer.state_dict())
    ema = WeightEMA(layer, decay=0.5)
    expected = {k: v.clone() for k, v in start.items()}
    for step, value in enumerate([1.0, -2.0, 4.0, 0.5], start=1):
        with torch.no_grad():
            for p in layer.parameters():
                p.fill_(value)
        ema.update(step)
        decay = min(0.5, (1 + step) / (10 + step))  # warmed up: 2/11, 3/12, then 0.5
        expected = {k: decay * v + (1 - decay) * value for k, v in expected.items()}
    for name, tensor in expected.items():
        torch.testing.assert_close(ema.weights[name], tensor, msg=name)
        assert not torch.equal(ema.weights[name], layer.state_dict()[name])
    assert set(ema.saved()) == {"ema.weight", "ema.bias"}


def test_no_moving_average_keeps_nothing():
    ema = WeightEMA(nn.Linear(2, 1), decay=0.0)
    ema.update(1)
    assert ema.saved() == {}
