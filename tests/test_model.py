"""Seq2Seq: causality, padding invariance, cached == uncached decoding, cache sizes, learning."""

import pytest
import torch
import torch.nn.functional as F
from helpers import HOST_READS, V, no_host_reads
from helpers import tiny_model as tiny
from torch.utils._python_dispatch import TorchDispatchMode

from seq2seq.config import DecodeConfig
from seq2seq.decoding.search import translate_batch
from seq2seq.model.latent_attention import LatentAttention
from seq2seq.model.masks import padding_mask
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID


def tokens(b, t, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, V, (b, t), generator=g)


def test_shapes():
    model = tiny()
    src, tgt = tokens(3, 9), tokens(3, 5)
    mask = padding_mask(src)
    memory = model.encode(src, mask)
    logits, weights = model.decode(tgt, memory, mask, need_weights=True)
    assert memory.shape == (3, 9, 32)
    assert logits.shape == (3, 5, V)
    assert len(weights) == 2 and all(w.shape == (3, 4, 5, 9) for w in weights)  # (B, H, T, S)
    assert model(src, tgt).shape == (3, 5, V)


def test_future_target_token_cannot_change_earlier_logits():
    model = tiny()
    src, tgt = tokens(2, 7), tokens(2, 6)
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (V - 4) + 4
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_source_padding_leaves_output_unchanged():
    model = tiny()
    src, tgt = tokens(2, 6), tokens(2, 5)
    padded = torch.cat([src, torch.full((2, 4), PAD_ID)], dim=1)
    torch.testing.assert_close(model(src, tgt), model(padded, tgt), atol=1e-5, rtol=1e-5)


def test_tied_and_untied_output():
    tied, untied = tiny(), tiny(tie_output=False)
    assert tied.output.weight is tied.tgt_embed.tokens.weight
    assert tied.src_embed.tokens is tied.tgt_embed.tokens
    assert untied.output.weight is not untied.tgt_embed.tokens.weight


@pytest.mark.parametrize(("g", "d_latent"), [(4, None), (2, None), (1, None), (4, 8)])
def test_cached_decoding_equals_full_recompute(g, d_latent):
    model = tiny(g, d_latent)
    b, t = 3, 7
    src = tokens(b, 8)
    src[1, 5:] = PAD_ID
    tgt = tokens(b, t, seed=2)
    mask = padding_mask(src)
    memory = model.encode(src, mask)
    full, full_w = model.decode(tgt, memory, mask, need_weights=True)
    cache = model.new_cache()
    steps, step_w = [], []
    for i in range(t):
        logits, w = model.decode(tgt[:, i : i + 1], memory, mask, cache=cache, need_weights=True)
        steps.append(logits)
        step_w.append(w[-1])
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat(step_w, 2), full_w[-1], atol=1e-5, rtol=1e-4)

    size = cache.size()
    dh = 32 // 4
    per_layer = b * t * d_latent if d_latent else 2 * b * t * g * dh
    assert [sum(x.numel() for x in e.tensors()) for e in cache.self_attn] == [per_layer] * 2
    assert size["self_elements"] == 2 * per_layer
    assert size["cross_elements"] == 2 * (2 * b * 8 * g * dh)
    assert size["bytes"] == 4 * size["elements"]


def test_mla_latent_is_in_decoder_self_attention_only():
    """MLA (d_latent) shrinks what the decoder caches; the encoder caches nothing, so it keeps
    full K/V: given the plain model's encoder weights it computes the plain model's memory."""
    mla, plain = tiny(d_latent=8), tiny()
    assert all(type(layer.self_attn) is LatentAttention for layer in mla.decoder_layers)
    assert all(not hasattr(layer.self_attn, "kv_up") for layer in mla.encoder_layers)
    assert all(layer.self_attn.kv_up.in_features == 8 for layer in mla.decoder_layers)
    assert all(not hasattr(layer.cross_attn, "kv_up") for layer in mla.decoder_layers)
    for part in ("src_embed", "encoder_layers", "encoder_norm"):
        getattr(mla, part).load_state_dict(getattr(plain, part).state_dict())
    src = tokens(2, 6)
    mask = padding_mask(src)
    torch.testing.assert_close(mla.encode(src, mask), plain.encode(src, mask))


def test_cache_reorder_follows_beam_index():
    model = tiny()
    src, tgt = tokens(1, 5), tokens(3, 4)
    mask = padding_mask(src)
    memory = model.encode(src, mask)
    cache = model.new_cache()
    for i in range(3):
        model.decode(tgt[:, i : i + 1], memory, mask, cache=cache)  # 3 beams share one source
    index = torch.tensor([2, 2, 0])
    cache.reorder(index)
    last, _ = model.decode(tgt[index, 3:4], memory, mask, cache=cache)
    full, _ = model.decode(tgt[index], memory.expand(3, -1, -1), mask.expand(3, -1, -1, -1))
    torch.testing.assert_close(last[:, 0], full[:, -1], atol=1e-5, rtol=1e-4)


@pytest.fixture
def host_reads(monkeypatch):
    """Counts the reads of a tensor's values on the host (each one a device sync)."""
    reads = []
    for name in ("__bool__", "item", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            reads.append(1)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def test_mask_is_checked_once_per_batch_not_per_layer_or_step(host_reads):
    model = tiny()  # 2 encoder and 2 decoder layers
    src, tgt = tokens(3, 6), tokens(3, 4, seed=2)
    src[1, 4:] = PAD_ID
    mask = padding_mask(src)
    memory = model.encode(src, mask)
    assert len(host_reads) == 1
    cache = model.new_cache()
    for i in range(4):
        model.decode(tgt[:, i : i + 1], memory, mask, cache=cache, need_weights=i % 2 == 0)
    model.decode(tgt, memory, mask)  # causal mask, whole prefix
    assert len(host_reads) == 1


def _set_masked(x: torch.Tensor) -> None:
    y = x.clone()
    y[x > 0] = 0.0


PLANTED = {  # a read of each kind, of a layer's input x (detached)
    "__bool__": lambda x: bool(x.sum() > 0),
    "__int__": lambda x: int(x.sum()),
    "__float__": lambda x: float(x.sum()),
    "__index__": lambda x: [0, 1][x.argmax() % 2],
    "item": lambda x: x.sum().item(),
    "tolist": lambda x: x.tolist(),
    "cpu": lambda x: x.cpu(),
    "numpy": lambda x: x.numpy(),
    "nonzero": lambda x: (x > 0).nonzero(),
    "torch.nonzero": lambda x: torch.nonzero(x > 0),
    "__getitem__ by a boolean mask": lambda x: x[x > 0],
    "__setitem__ by a boolean mask": _set_masked,
}


@pytest.mark.parametrize("kind", PLANTED)
def test_the_host_read_guard_catches_each_kind_of_read(kind, monkeypatch):
    """The guard that test_train puts around the training forward: a read of each kind,
    planted in a layer of the forward, is caught (and runs without the guard)."""
    assert set(HOST_READS) < set(PLANTED)  # a plant for each read the guard names, and more
    model = tiny().train()
    norm, reads = model.encoder_norm, []

    def planted(x, _forward=norm.forward):
        reads.append(PLANTED[kind](x.detach()))
        return _forward(x)

    monkeypatch.setattr(norm, "forward", planted)
    src, tgt = tokens(3, 6), tokens(3, 4, seed=2)
    model(src, tgt, check=False)
    assert len(reads) == 1  # the plant reads without the guard
    with pytest.raises(AssertionError, match=f"read on the host: {kind}"), no_host_reads():
        model(src, tgt, check=False)


@pytest.mark.parametrize("beam", [1, 3])
def test_search_steps_read_nothing_on_the_host(host_reads, monkeypatch, beam):
    """Greedy and beam search: the decoder's steps never read a tensor's values on the host
    (the model checked the source mask once, in encode)."""
    model = tiny()
    src = tokens(2, 6)
    src[1, 4:] = PAD_ID
    reads_per_step = []

    def counted(*args, _decode=model.decode, **kwargs):
        before = len(host_reads)
        out = _decode(*args, **kwargs)
        reads_per_step.append(len(host_reads) - before)
        return out

    monkeypatch.setattr(model, "decode", counted)
    decode = DecodeConfig(beam=beam, max_len_a=0.0, max_len_b=6, ban_eos=True)
    translate_batch(model, src, decode, need_weights=True)
    assert reads_per_step == [0] * 6


def test_a_source_of_only_padding_is_an_error():
    src = tokens(2, 5)
    src[1] = PAD_ID
    with pytest.raises(ValueError, match="at least one allowed key"):
        tiny()(src, tokens(2, 3))


def test_position_limit_is_a_clear_error():
    model = tiny()
    with pytest.raises(ValueError, match="max_positions"):
        model(tokens(1, 65), tokens(1, 3))


def test_tiny_model_learns_to_reverse_sequences():
    """A model that really learns: reverse random sequences, > 95% token accuracy within
    600 steps (a step budget, not a time limit: a busy machine only makes it slower)."""
    torch.manual_seed(0)
    model = tiny(d_ff=128).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def batch(n):
        x = torch.randint(4, V, (n, 8))
        y = x.flip(1)
        bos = torch.full((n, 1), BOS_ID)
        eos = torch.full((n, 1), EOS_ID)
        return x, torch.cat([bos, y], 1), torch.cat([y, eos], 1)

    steps = 0
    while steps < 600:
        steps += 1
        src, tgt_in, tgt_out = batch(64)
        loss = F.cross_entropy(model(src, tgt_in).reshape(-1, V), tgt_out.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.05:  # learned: stop early
            break
    model.eval()
    src, tgt_in, tgt_out = batch(256)
    with torch.no_grad():
        accuracy = (model(src, tgt_in).argmax(-1) == tgt_out).float().mean().item()
    assert accuracy > 0.95, f"reverse-task accuracy {accuracy:.3f} after {steps} steps"


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_keeps_one_minus_p_and_scales_what_it_keeps(p):
    from seq2seq.model.dropout import Dropout

    drop = Dropout(p).train()
    x = torch.rand(1000, 1000) + 1.0  # no zeros of its own
    y = drop(x)
    kept = y != 0
    # 10^6 draws: the kept share's sd is ~0.0005, so 0.003 is six of them
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=3e-3)
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    assert torch.equal(drop.eval()(x), x)  # evaluation: the identity
    # a different mask at each call; the same masks again from the same seed
    torch.manual_seed(0)
    a, b = drop.train()(x), drop(x)
    torch.manual_seed(0)
    assert torch.equal(drop(x), a) and not torch.equal(a, b)


def saved_bytes(f, x: torch.Tensor) -> int:
    """Bytes that ``f(x)`` keeps for its backward."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(x)
    return total


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_a_boolean_mask_for_backward_no_larger_than_f_dropouts(dtype):
    from seq2seq.model.dropout import Dropout

    x = torch.rand(64, 37, 16, dtype=dtype, requires_grad=True)
    ours = saved_bytes(Dropout(0.1).train(), x)
    theirs = saved_bytes(lambda x: torch.nn.functional.dropout(x, 0.1, True), x)
    # F.dropout keeps an x.dtype noise tensor on CPU and a boolean mask on CUDA: one byte an
    # element is the smaller of the two
    assert 0 < ours <= min(theirs, x.numel())


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_scales_by_the_exact_one_over_one_minus_p_in_bf16(p):
    from seq2seq.model.dropout import Dropout

    drop = Dropout(p).train()
    x = (torch.rand(256, 256) + 1.0).bfloat16().requires_grad_()
    y = drop(x)
    kept = y != 0
    exact = (x.detach().float() * (1 / (1 - p))).bfloat16()  # one rounding, of the product
    assert torch.equal(y[kept], exact[kept])
    upstream = torch.rand_like(y) + 1.0
    y.backward(upstream)
    assert torch.equal(x.grad[kept], (upstream.float() * (1 / (1 - p))).bfloat16()[kept])
    assert not x.grad[~kept].any()


class GpuScalars(TorchDispatchMode):
    """A GPU's arithmetic on the CPU: a 0-dim float tensor beside a larger one is an operand
    like any other, cast to that one's dtype first (bf16 beside a bf16 x), where on the CPU it
    is a scalar kept in float32 (TensorIterator's "CPU scalar")."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        shaped = [a.dtype for a in floats if a.dim() > 0]
        if shaped:
            cast = {id(a) for a in floats if a.dim() == 0}
            args = [a.to(shaped[0]) if id(a) in cast else a for a in args]
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_compiled_dropout_scales_in_float32_as_the_eager_path_does(p, monkeypatch):
    from seq2seq.model import dropout
    from seq2seq.model.dropout import Dropout

    drop = Dropout(p).train()
    x = (torch.rand(256, 256) + 1.0).bfloat16().requires_grad_()
    exact = (x.detach().float() * (1 / (1 - p))).bfloat16()  # what the eager path gives
    compiled = torch.compile(drop, backend="aot_eager", dynamic=True)  # the graph, run eagerly
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = compiled(x)
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=0.01)
    assert torch.equal(y[kept], exact[kept])
    upstream = torch.rand_like(y) + 1.0
    y.backward(upstream)
    assert torch.equal(x.grad[kept], (upstream.float() * (1 / (1 - p))).bfloat16()[kept])
    # The same branch under a GPU's rule for the 0-dim probability and scale tensors
    monkeypatch.setattr(dropout, "is_compiling", lambda: True)  # torch's, or dynamo's before 2.3
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), GpuScalars():
        y = drop(x)
    kept = y != 0
    assert torch.equal(y[kept], exact[kept])


def test_dropout_gradient_is_the_same_mask_and_scale():
    from seq2seq.model.dropout import Dropout

    drop = Dropout(0.3).train()
    x = (torch.rand(64, 37, 16) + 1.0).requires_grad_()
    y = drop(x)
    upstream = torch.randn_like(y)
    y.backward(upstream)
    ratio = (y / x).detach()  # each element dropped or scaled by 1 / (1 - p), nothing else
    assert torch.all((ratio == 0) | torch.isclose(ratio, torch.tensor(1 / 0.7)))
    torch.testing.assert_close(x.grad, upstream * ratio)


@pytest.mark.cuda
def test_on_a_gpu_the_training_forward_never_syncs():
    model = tiny().cuda().train()
    src, tgt = tokens(3, 6).cuda(), tokens(3, 4, seed=2).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(src, tgt, check=False).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_packed_attention_projections_start_as_q_k_v_initialised_apart():
    # Each block of in_proj draws as the matrix it stands for, in the order Q, K, V: the
    # weights a seed gave before the projections were packed.
    model = tiny(n_kv_heads=2)
    c, attn = model.config, model.encoder_layers[0].self_attn
    torch.manual_seed(0)
    model._init_weights()
    torch.manual_seed(0)
    # The source embedding is drawn first (then replaced by its normal initialisation).
    torch.nn.init.xavier_uniform_(torch.empty(c.src_vocab_size, c.d_model))
    for rows, block in zip(
        (c.d_model, attn.d_kv, attn.d_kv),
        attn.in_proj.weight.split(attn.packed_rows()[attn.in_proj.weight]),
        strict=True,
    ):
        expected = torch.nn.init.xavier_uniform_(torch.empty(rows, c.d_model))
        assert torch.equal(block, expected)


@pytest.mark.parametrize(("g", "d_latent"), [(4, None), (2, None), (4, 8)])
def test_self_attention_weights_leave_the_outputs_identical_and_the_future_unread(g, d_latent):
    model = tiny(g, d_latent, n_enc_layers=2)
    src, tgt = tokens(2, 7), tokens(2, 5, seed=2)
    src[1, 4:] = PAD_ID
    mask = padding_mask(src)
    encoder, decoder = model.self_attention(src, tgt)
    memory, recorded = model._encode(src, mask, need_weights=True)
    assert torch.equal(memory, model.encode(src, mask))  # recording changes nothing
    assert [w.shape for w in encoder] == [(2, 4, 7, 7)] * 2  # (B, H, S, S) per encoder layer
    assert all(torch.equal(a, b) for a, b in zip(encoder, recorded, strict=True))
    logits, cross, own = model._decode(tgt, memory, mask, need_weights=True, need_self_weights=True)
    assert torch.equal(logits, model(src, tgt))
    assert torch.equal(
        torch.stack(cross), torch.stack(model.decode(tgt, memory, mask, need_weights=True)[1])
    )
    assert [w.shape for w in decoder] == [(2, 4, 5, 5)] * 2  # (B, H, T, T) per decoder layer
    for w in (*encoder, *decoder):
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert all((w[..., future] == 0).all() and (w[..., ~future] > 0).all() for w in decoder)
    assert all((w[1, ..., 4:] == 0).all() for w in encoder)  # padding is never read
