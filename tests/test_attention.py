"""MultiHeadAttention: shapes, masks, fast == explicit path, MHA/GQA/MQA, input checks, cache;
LatentAttention (MLA): its cache and its one input."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seq2seq.model.attention import AttentionCache, MultiHeadAttention
from seq2seq.model.latent_attention import LatentAttention
from seq2seq.model.masks import check_rows

D, H = 32, 4
KV_HEADS = [4, 2, 1]  # MHA, GQA, MQA


def make(n_kv_heads=None, seed=0, d_latent=None):
    torch.manual_seed(seed)
    if d_latent is None:
        return MultiHeadAttention(D, H, n_kv_heads).eval()
    return LatentAttention(D, H, n_kv_heads, d_latent=d_latent).eval()


@pytest.mark.parametrize("g", KV_HEADS)
@pytest.mark.parametrize(("tq", "tk"), [(6, 10), (10, 6), (1, 7)])
def test_output_follows_the_queries(g, tq, tk):
    attn = make(g)
    q, kv = torch.randn(2, tq, D), torch.randn(2, tk, D)
    out, weights = attn(q, kv, kv, need_weights=True)
    assert out.shape == (2, tq, D)  # one row per query, whatever Tk is
    assert weights.shape == (2, H, tq, tk)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, tq))


@pytest.mark.parametrize("g", KV_HEADS)
@pytest.mark.parametrize("mask_kind", [None, "2d", "4d", "padding"])
def test_weights_leave_the_output_as_the_fast_path_computes_it(g, mask_kind):
    attn = make(g)
    b, tq, tk = 3, 5, 7
    q, kv = torch.randn(b, tq, D), torch.randn(b, tk, D)
    allowed = {
        None: None,
        "2d": torch.rand(tq, tk) > 0.4,
        "4d": torch.rand(b, 1, tq, tk) > 0.4,
        "padding": torch.arange(tk)[None, None, None, :]
        < torch.tensor([7, 3, 1])[:, None, None, None],
    }[mask_kind]
    if allowed is not None:
        allowed[..., 0] = True  # every query keeps at least one key
    fast, none = attn(q, kv, kv, allowed)
    slow, weights = attn(q, kv, kv, allowed, need_weights=True)
    assert none is None
    assert torch.equal(fast, slow)  # not one bit: under bf16 a last bit can change a token
    if allowed is not None:
        assert (weights.masked_select(~allowed.expand_as(weights)) == 0).all()
    # The weights are those the output was computed with.
    v_rows = slice(D + attn.d_kv, None)  # in_proj packs Q | K | V
    vh = F.linear(kv, attn.in_proj.weight[v_rows], attn.in_proj.bias[v_rows])
    vh = vh.view(b, tk, g, D // H).transpose(1, 2)  # (B, G, Tk, Dh)
    mixed = weights @ vh.repeat_interleave(H // g, dim=1)  # (B, H, Tq, Dh)
    expected = attn.out_proj(mixed.transpose(1, 2).reshape(b, tq, D))
    torch.testing.assert_close(slow, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("g", KV_HEADS)
def test_under_bf16_autocast_asking_for_weights_never_changes_the_output(g):
    attn = make(g)
    q, kv = torch.randn(3, 5, D), torch.randn(3, 7, D)
    padding = (torch.arange(7) < torch.tensor([7, 3, 1])[:, None])[:, None, None, :]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast, _ = attn(q, kv, kv, padding)
        slow, weights = attn(q, kv, kv, padding, need_weights=True)
    assert fast.dtype == torch.bfloat16 and weights.dtype == torch.float32
    assert torch.equal(fast, slow)


def test_gqa_with_g_equal_h_is_mha_with_the_same_weights():
    mha, gqa = make(None, seed=1), make(H, seed=2)
    gqa.load_state_dict(mha.state_dict())
    q, kv = torch.randn(2, 4, D), torch.randn(2, 9, D)
    torch.testing.assert_close(mha(q, kv, kv)[0], gqa(q, kv, kv)[0])


@pytest.mark.parametrize("g", KV_HEADS)
def test_kv_projections_hold_only_g_heads(g):
    attn = make(g)
    assert attn.d_kv == g * (D // H)
    assert attn.in_proj.out_features == D + 2 * attn.d_kv  # Q | K | V


def test_query_heads_share_kv_heads_in_groups():
    """With G=2 and H=4, query heads 0,1 read K/V head 0 and heads 2,3 read K/V head 1."""
    attn = make(2)
    q, kv = torch.randn(1, 3, D), torch.randn(1, 5, D)
    _, weights = attn(q, kv, kv, need_weights=True)
    dh = D // H
    w, bias = attn.in_proj.weight, attn.in_proj.bias
    qh = F.linear(q, w[:D], bias[:D]).view(1, 3, H, dh).transpose(1, 2)
    kh = F.linear(kv, w[D : D + 2 * dh], bias[D : D + 2 * dh]).view(1, 5, 2, dh).transpose(1, 2)
    for head in range(H):
        expected = (qh[:, head] @ kh[:, head // 2].transpose(-2, -1) / dh**0.5).softmax(-1)
        torch.testing.assert_close(weights[:, head], expected)


def test_matches_torch_multihead_attention():
    ours = make(None)
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.in_proj.weight)  # packed Q | K | V, as ours
        ref.in_proj_bias.copy_(ours.in_proj.bias)
        ref.out_proj.load_state_dict(ours.out_proj.state_dict())
    q, kv = torch.randn(2, 4, D), torch.randn(2, 6, D)
    allowed = torch.rand(4, 6) > 0.5
    allowed[:, 0] = True
    expected, expected_w = ref(q, kv, kv, attn_mask=~allowed, average_attn_weights=False)
    out, weights = ours(q, kv, kv, allowed, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_w, atol=1e-5, rtol=1e-5)


def test_heads_are_transposed_back_before_merging():
    """Output position t must depend only on query t: a view without the transpose mixes them."""
    attn = make(None)
    q, kv = torch.randn(1, 5, D), torch.randn(1, 7, D)
    out = attn(q, kv, kv)[0]
    q2 = q.clone()
    q2[:, 3] += 1.0
    out2 = attn(q2, kv, kv)[0]
    changed = (out2 - out).abs().sum(-1)[0] > 1e-6
    assert changed.tolist() == [False, False, False, True, False]


BAD_INPUTS = [
    (
        "wrong ndim",
        lambda: (torch.randn(4, D), torch.randn(1, 4, D), torch.randn(1, 4, D), None),
        "Expected \\[batch, sequence, d_model\\]",
    ),
    (
        "batch differs",
        lambda: (torch.randn(2, 4, D), torch.randn(3, 4, D), torch.randn(3, 4, D), None),
        "batch sizes must match",
    ),
    (
        "width",
        lambda: (torch.randn(1, 4, D + 1), torch.randn(1, 4, D), torch.randn(1, 4, D), None),
        "widths must equal d_model",
    ),
    (
        "zero keys",
        lambda: (torch.randn(1, 4, D), torch.randn(1, 0, D), torch.randn(1, 0, D), None),
        "At least one key",
    ),
    (
        "k/v lengths",
        lambda: (torch.randn(1, 4, D), torch.randn(1, 5, D), torch.randn(1, 6, D), None),
        "lengths must match",
    ),
    (
        "float mask",
        lambda: (
            torch.randn(1, 4, D),
            torch.randn(1, 5, D),
            torch.randn(1, 5, D),
            torch.zeros(4, 5),
        ),
        "boolean mask",
    ),
    (
        "mask shape",
        lambda: (
            torch.randn(1, 4, D),
            torch.randn(1, 5, D),
            torch.randn(1, 5, D),
            torch.ones(5, 4, dtype=torch.bool),
        ),
        "Mask shape",
    ),
]


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize(("name", "inputs", "message"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_value_error(name, inputs, message, need_weights):
    q, k, v, allowed = inputs()
    with pytest.raises(ValueError, match=message):
        make()(q, k, v, allowed, need_weights=need_weights)


def test_mla_refuses_keys_that_are_not_the_values():
    attn = make(d_latent=8)
    q, k = torch.randn(1, 4, D), torch.randn(1, 5, D)
    with pytest.raises(ValueError, match="same tensor as k and v"):
        attn(q, k, k.clone())
    assert attn(q, k, k)[0].shape == (1, 4, D)


@pytest.mark.parametrize(
    "allowed",
    [
        torch.eye(4, 5, dtype=torch.bool) & (torch.arange(4) < 3)[:, None],  # query 3: no key
        torch.tensor([[True, True], [False, False]])[:, None, None, :],  # an all-padding row
    ],
)
def test_a_query_row_without_an_allowed_key_is_an_error(allowed):
    with pytest.raises(ValueError, match="at least one allowed key"):
        check_rows(allowed)
    allowed[..., 0] = True
    check_rows(allowed)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("shared_cache", [False, True])
def test_the_module_on_its_own_refuses_a_query_row_without_an_allowed_key(
    need_weights, shared_cache
):
    attn = MultiHeadAttention(16, 4)
    q, k = torch.randn(4, 3, 16), torch.randn(2, 5, 16)  # 2 sentences, 2 beams each
    allowed = torch.tensor([[True] * 5, [False] * 5])[:, None, None, :]  # sentence 2: padding
    if not shared_cache:
        k, allowed = k.repeat_interleave(2, 0), allowed.repeat_interleave(2, 0)
    cache = AttentionCache(static=True) if shared_cache else None
    with pytest.raises(ValueError, match="at least one allowed key"):
        attn(q, k, k, allowed, need_weights=need_weights, cache=cache)
    allowed[..., 0] = True
    if shared_cache:
        cache = AttentionCache(static=True)
    out, _ = attn(q, k, k, allowed, need_weights=need_weights, cache=cache)
    assert out.shape == (4, 3, 16)


def test_a_caller_that_checked_its_masks_can_skip_the_check():
    trusting = MultiHeadAttention(16, 4, check_rows=False)
    q, k = torch.randn(1, 3, 16), torch.randn(1, 5, 16)
    allowed = torch.ones(3, 5, dtype=torch.bool)
    allowed[2] = False
    out, _ = trusting(q, k, k, allowed)
    assert out.shape == (1, 3, 16) and torch.isfinite(out[:, :2]).all()


@pytest.mark.parametrize(
    ("d_model", "n_heads", "n_kv_heads"),
    [(30, 4, None), (32, 0, None), (32, 4, 3), (32, 4, 8), (32, 4, 0)],
)
def test_bad_sizes_raise_value_error(d_model, n_heads, n_kv_heads):
    with pytest.raises(ValueError):
        MultiHeadAttention(d_model, n_heads, n_kv_heads)


def test_no_nan_even_with_large_scores():
    attn = make()
    q, kv = torch.randn(2, 3, D) * 1e4, torch.randn(2, 4, D) * 1e4
    allowed = torch.tensor([[True, False, False, False]] * 3)
    for need_weights in (False, True):
        out, _ = attn(q, kv, kv, allowed, need_weights=need_weights)
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("g", KV_HEADS)
@pytest.mark.parametrize("d_latent", [None, 8])
def test_growing_cache_equals_full_recompute(g, d_latent):
    attn = make(g, d_latent=d_latent)
    b, t = 2, 6
    x = torch.randn(b, t, D)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    full = attn(x, x, x, causal)[0]
    cache = AttentionCache()
    steps = [attn(xi, xi, xi, cache=cache)[0] for xi in x.split(1, dim=1)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    if d_latent is None:
        assert sum(e.numel() for e in cache.tensors()) == 2 * b * t * g * (D // H)
    else:
        assert sum(e.numel() for e in cache.tensors()) == b * t * d_latent


def test_static_cache_shared_by_beams_equals_repeated_keys():
    attn = make(2)
    b, beams, s = 2, 3, 5
    memory = torch.randn(b, s, D)
    pad = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]
    q = torch.randn(b * beams, 1, D)
    cache = AttentionCache(static=True)
    shared, w_shared = attn(q, memory, memory, pad, need_weights=True, cache=cache)
    repeated = memory.repeat_interleave(beams, 0)
    expected, w_expected = attn(
        q, repeated, repeated, pad.repeat_interleave(beams, 0), need_weights=True
    )
    torch.testing.assert_close(shared, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w_shared, w_expected, atol=1e-5, rtol=1e-5)
    again, _ = attn(q, memory, memory, pad, cache=cache)  # reused, not recomputed
    torch.testing.assert_close(again, expected, atol=1e-5, rtol=1e-5)
    assert cache.k.shape[0] == b


@pytest.mark.parametrize("g", KV_HEADS)
def test_self_attention_in_one_projection_equals_q_k_v_projected_apart(g):
    # The same input object three times takes one matrix multiply; equal copies, three.
    attn = make(g)
    x = torch.randn(2, 6, D)
    packed, w_packed = attn(x, x, x, need_weights=True)
    apart, w_apart = attn(x, x.clone(), x.clone(), need_weights=True)
    torch.testing.assert_close(packed, apart, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(w_packed, w_apart, atol=1e-6, rtol=1e-6)
    k, v = torch.randn(2, 4, D), torch.randn(2, 4, D)  # keys and values from other inputs
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval() if g in (None, H) else None
    if ref is not None:
        with torch.no_grad():
            ref.in_proj_weight.copy_(attn.in_proj.weight)
            ref.in_proj_bias.copy_(attn.in_proj.bias)
            ref.out_proj.load_state_dict(attn.out_proj.state_dict())
        torch.testing.assert_close(attn(x, k, v)[0], ref(x, k, v)[0], atol=1e-5, rtol=1e-5)


def test_weights_saved_before_packing_load_into_the_packed_projection():
    from seq2seq.run.old_weights import packed_state

    new = make(2, seed=3)
    w, b, dkv = new.in_proj.weight, new.in_proj.bias, new.d_kv
    old = {"out_proj.weight": new.out_proj.weight, "out_proj.bias": new.out_proj.bias}
    for name, rows in (("q_proj", slice(0, D)), ("k_proj", slice(D, D + dkv))):
        old[f"{name}.weight"], old[f"{name}.bias"] = w[rows], b[rows]
    old["v_proj.weight"], old["v_proj.bias"] = w[D + dkv :], b[D + dkv :]
    loaded = make(2, seed=4)
    loaded.load_state_dict(packed_state({f"{k}": v.detach() for k, v in old.items()}))
    x = torch.randn(1, 5, D)
    assert torch.equal(loaded(x, x, x)[0], new(x, x, x)[0])


def test_mla_weights_saved_before_packing_load_into_latent_attention():
    from seq2seq.run.old_weights import packed_state

    new = make(2, seed=3, d_latent=8)
    w, b = new.in_proj.weight, new.in_proj.bias
    up_w, up_b, dkv = new.kv_up.weight, new.kv_up.bias, new.d_kv
    old = {"out_proj.weight": new.out_proj.weight, "out_proj.bias": new.out_proj.bias}
    old["q_proj.weight"], old["q_proj.bias"] = w[:D], b[:D]
    old["kv_down.weight"], old["kv_down.bias"] = w[D:], b[D:]  # to the latent
    old["k_proj.weight"], old["k_proj.bias"] = up_w[:dkv], up_b[:dkv]  # up from it
    old["v_proj.weight"], old["v_proj.bias"] = up_w[dkv:], up_b[dkv:]
    loaded = make(2, seed=4, d_latent=8)
    loaded.load_state_dict(packed_state({f"{k}": v.detach() for k, v in old.items()}))
    x = torch.randn(1, 5, D)
    assert torch.equal(loaded(x, x, x)[0], new(x, x, x)[0])


def test_edit_weights_replaces_the_weights_the_values_are_read_with():
    attn = make(2)
    q, kv = torch.randn(2, 3, D), torch.randn(2, 5, D)
    real, w = attn(q, kv, kv, need_weights=True)
    attn.edit_weights = lambda weights, allowed: weights  # the identity: the same output
    kept, w_kept = attn(q, kv, kv, need_weights=True)
    torch.testing.assert_close(kept, real, atol=1e-5, rtol=1e-5)
    assert torch.equal(w_kept, w)
    first = torch.zeros_like(w)
    first[..., 0] = 1.0
    attn.edit_weights = lambda weights, allowed: first  # every query reads key 0 alone
    only_first, _ = attn(q, kv, kv)
    expected, _ = attn(q, kv[:, :1].expand(2, 5, D), kv[:, :1].expand(2, 5, D))
    torch.testing.assert_close(only_first, expected, atol=1e-5, rtol=1e-5)
