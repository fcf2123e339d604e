"""Search: beam 1 == greedy, cached == uncached, batched == one at a time, stop reasons,
length limits, n-best order, attention shapes and back-pointer tracing (== force_decode),
a deadline checked at every step, and the search's tree (recorded, the same output)."""

import copy
import math
import time

import pytest
import torch
import torch.nn.functional as F
from helpers import V, eos_probs_as_searched
from helpers import tiny_model as tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seq2seq.config import DecodeConfig
from seq2seq.decoding.beam import gnmt_length_penalty
from seq2seq.decoding.deadline import DeadlinePassed, deadline
from seq2seq.decoding.search import (
    beam_search,
    force_decode,
    greedy_search,
    max_output_length,
    step_probs,
    translate_batch,
)
from seq2seq.decoding.tree import MAX_STEPS, SearchTree
from seq2seq.errors import Seq2SeqError
from seq2seq.inspect.influence import occlude
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID


def sources(lengths, width=None, seed=1):
    """Random sentences of the given lengths, right-padded: (B, S)."""
    g = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    src = torch.randint(4, V, (len(lengths), width), generator=g)
    src[torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]] = PAD_ID
    return src


def copy_batch(n, g):
    """Copy task with lengths 2..7: source ids, decoder input and target with EOS."""
    lengths = torch.randint(2, 8, (n,), generator=g)
    src = torch.randint(4, V, (n, 7), generator=g)
    src[torch.arange(7)[None, :] >= lengths[:, None]] = PAD_ID
    tgt_in = torch.cat([torch.full((n, 1), BOS_ID), src], 1)
    tgt_out = torch.cat([src, torch.full((n, 1), PAD_ID)], 1)
    tgt_out[torch.arange(n), lengths] = EOS_ID
    return src, tgt_in, tgt_out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices gain nothing from threads, which only contend on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained():
    """A one-layer model trained to copy its source (~5 s): it learns to stop at EOS."""
    model = tiny(n_enc_layers=1, n_dec_layers=1).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        src, tgt_in, tgt_out = copy_batch(64, g)
        loss = F.cross_entropy(
            model(src, tgt_in).reshape(-1, V), tgt_out.reshape(-1), ignore_index=PAD_ID
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def assert_same(a, b):
    """Same tokens and stop reasons, scores equal up to float rounding."""
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.stop_reason for h in a] == [h.stop_reason for h in b]
    torch.testing.assert_close(
        torch.tensor([h.score for h in a]), torch.tensor([h.score for h in b]), atol=1e-4, rtol=1e-5
    )
    torch.testing.assert_close(
        torch.tensor([h.normalized_score for h in a]),
        torch.tensor([h.normalized_score for h in b]),
        atol=1e-4,
        rtol=1e-5,
    )


def flat(nbest_lists):
    return [h for hyps in nbest_lists for h in hyps]


def test_max_output_length_follows_a_s_plus_b_within_the_position_limit():
    assert max_output_length(10, 1.5, 10, 512) == 25
    assert max_output_length(7, 1.5, 10, 512) == 20  # floored
    assert max_output_length(100, 1.5, 10, 64) == 63  # BOS + 63 tokens = 64 positions
    assert max_output_length(3, 0.0, 0, 64) == 1
    assert max_output_length(3, 1e308, 10, 64) == 63  # a * S overflows to inf: capped
    with pytest.raises(ValueError):
        max_output_length(3, 1.0, 1, 1)
    assert gnmt_length_penalty(1, 1.0) == 1.0 and gnmt_length_penalty(7, 0.0) == 1.0


def test_greedy_output_and_stop_reasons():
    model = tiny()
    src = sources([7, 4, 2])
    hyps = greedy_search(model, src, DecodeConfig(max_len_a=1.0, max_len_b=3))
    assert len(hyps) == 3
    for hyp, s in zip(hyps, [7, 4, 2], strict=True):
        assert hyp.stop_reason in ("eos", "max_len")
        assert EOS_ID not in hyp.tokens
        n_max = s + 3
        assert len(hyp.tokens) == n_max if hyp.stop_reason == "max_len" else len(hyp.tokens) < n_max
        assert hyp.score < 0 and hyp.normalized_score == hyp.score and hyp.attention is None


def reference_greedy(model, src, max_len):
    """Greedy decoding written plainly: one sentence at a time, the whole prefix through
    ``model(src, prefix)`` at every step, PAD and BOS never chosen."""
    outputs = []
    for sentence in src:
        sentence = sentence[sentence != PAD_ID][None]  # (1, S)
        prefix = [BOS_ID]
        while len(prefix) <= max_len and prefix[-1] != EOS_ID:
            logits = model(sentence, torch.tensor([prefix]))[0, -1]
            logits[[PAD_ID, BOS_ID]] = float("-inf")
            prefix.append(int(logits.argmax()))
        outputs.append(prefix[1:-1] if prefix[-1] == EOS_ID else prefix[1:])
    return outputs


def test_greedy_equals_a_plain_reference_loop(trained):
    src = sources([7, 2, 5, 6], seed=5)
    decode = DecodeConfig(max_len_a=0.0, max_len_b=9)
    for model in (trained, tiny()):
        with torch.inference_mode():
            expected = reference_greedy(model, src, 9)
        hyps = greedy_search(model, src, decode)
        assert [h.tokens for h in hyps] == expected
        if model is trained:  # it copies, and so stops at EOS
            assert [h.stop_reason for h in hyps] == ["eos"] * 4


@pytest.mark.cuda
def test_on_a_gpu_decoding_equals_the_cpus(trained):
    src = sources([7, 2, 5], seed=3)
    # a copy: the module's model stays on the CPU for the later tests, whatever fails here
    on_gpu_model = copy.deepcopy(trained).cuda()
    for decode in (DecodeConfig(), DecodeConfig(beam=3, nbest=2)):
        on_cpu = flat(translate_batch(trained, src, decode))
        on_gpu = flat(translate_batch(on_gpu_model, src.cuda(), decode))
        assert_same(on_gpu, on_cpu)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
def test_beam_one_equals_greedy(alpha, trained):
    for model in (tiny(), trained):
        src = sources([7, 3, 5, 6], seed=2)
        greedy = greedy_search(model, src)
        beam = flat(beam_search(model, src, DecodeConfig(beam=1, length_penalty=alpha)))
        assert [h.tokens for h in beam] == [h.tokens for h in greedy]
        assert [h.stop_reason for h in beam] == [h.stop_reason for h in greedy]
        torch.testing.assert_close(
            torch.tensor([h.score for h in beam]), torch.tensor([h.score for h in greedy])
        )


@pytest.mark.parametrize(("g", "d_latent"), [(None, None), (2, None), (1, None), (None, 8)])
def test_cached_equals_uncached(g, d_latent, trained):
    src = sources([7, 3, 5], seed=3)
    for model in (tiny(g, d_latent), trained):
        assert_same(
            greedy_search(model, src), greedy_search(model, src, DecodeConfig(use_cache=False))
        )
        assert_same(
            flat(beam_search(model, src, DecodeConfig(beam=3, nbest=3))),
            flat(beam_search(model, src, DecodeConfig(beam=3, nbest=3, use_cache=False))),
        )


def test_batched_equals_one_at_a_time(trained):
    lengths = [7, 2, 5, 3]
    src = sources(lengths, width=9, seed=4)  # extra padding columns too
    for model in (tiny(), trained):
        alone = [src[i : i + 1, : lengths[i]] for i in range(len(lengths))]
        assert_same(greedy_search(model, src), [greedy_search(model, s)[0] for s in alone])
        batched = beam_search(model, src, DecodeConfig(beam=4, nbest=2))
        for hyps, s in zip(batched, alone, strict=True):
            assert_same(hyps, beam_search(model, s, DecodeConfig(beam=4, nbest=2))[0])


def test_ban_eos_runs_every_hypothesis_to_its_max_len(trained):
    lengths = [7, 2, 5]
    src = sources(lengths, seed=5)
    expected = [max_output_length(s, 1.5, 10, 64) for s in lengths]
    hyps = greedy_search(trained, src, DecodeConfig(ban_eos=True))
    assert [len(h.tokens) for h in hyps] == expected
    beams = beam_search(trained, src, DecodeConfig(beam=3, nbest=3, ban_eos=True))
    assert [{len(h.tokens) for h in hs} for hs in beams] == [{n} for n in expected]
    assert {h.stop_reason for h in hyps + flat(beams)} == {"max_len"}
    assert all(EOS_ID not in h.tokens for h in hyps + flat(beams))


def test_decoding_up_to_the_position_limit():
    model = tiny(max_positions=12)
    hyps = greedy_search(
        model, sources([5, 3]), DecodeConfig(max_len_b=100, ban_eos=True), need_weights=True
    )
    assert [len(h.tokens) for h in hyps] == [11, 11]
    beams = beam_search(
        model, sources([5, 3]), DecodeConfig(beam=2, max_len_b=100, ban_eos=True, use_cache=False)
    )
    assert [len(hs[0].tokens) for hs in beams] == [11, 11]


def test_trained_model_stops_at_eos_and_copies(trained):
    g = torch.Generator().manual_seed(7)
    src, _, _ = copy_batch(16, g)
    expected = [[t for t in row if t != PAD_ID] for row in src.tolist()]
    greedy = greedy_search(trained, src)
    best = [hs[0] for hs in beam_search(trained, src, DecodeConfig(beam=4, nbest=4))]
    for hyps in (greedy, best):
        assert all(h.stop_reason == "eos" for h in hyps)
        assert sum(h.tokens == e for h, e in zip(hyps, expected, strict=True)) >= 14


def test_nbest_lists_are_sorted_and_distinct(trained):
    src = sources([7, 3, 5, 6], seed=6)
    for model in (tiny(), trained):
        for alpha in (0.0, 1.0):
            for hyps in beam_search(
                model, src, DecodeConfig(beam=5, nbest=5, length_penalty=alpha)
            ):
                assert len(hyps) == 5
                scores = [h.normalized_score for h in hyps]
                assert scores == sorted(scores, reverse=True)
                assert len({tuple(h.tokens) for h in hyps}) == 5
                for h in hyps:
                    n = len(h.tokens) + (h.stop_reason == "eos")
                    assert h.normalized_score == pytest.approx(
                        h.score / gnmt_length_penalty(n, alpha), rel=1e-5
                    )


def test_pad_and_bos_are_never_output_even_when_the_model_prefers_them():
    """An output layer whose PAD and BOS logits beat every other token by ~30 nats."""
    model = tiny(tie_output=False)
    with torch.no_grad():
        model.decoder_norm.bias[0] = 10.0
        model.output.weight[:, 0] = 0.0
        model.output.weight[[PAD_ID, BOS_ID], 0] = 3.0
    src = sources([6, 3], seed=14)
    greedy = greedy_search(model, src)
    beams = flat(beam_search(model, src, DecodeConfig(beam=3, nbest=3)))
    assert all(h.stop_reason == "max_len" for h in greedy)
    for h in greedy + beams:
        assert PAD_ID not in h.tokens and BOS_ID not in h.tokens
        assert h.score > float("-inf")
    for i, h in enumerate(greedy):  # the score stays the model's log-prob of the tokens
        logp = model(src[i : i + 1], torch.tensor([[BOS_ID, *h.tokens[:-1]]])).log_softmax(-1)
        expected = logp[0, range(len(h.tokens)), h.tokens].sum()
        assert h.score == pytest.approx(expected.item(), rel=1e-4)


def test_beam_wider_than_the_vocabulary_returns_only_real_hypotheses():
    """One step, 25 beams, 20 tokens: the start beams that never came alive are dropped."""
    beams = beam_search(
        tiny(), sources([4, 2]), DecodeConfig(beam=25, nbest=25, max_len_a=0.0, max_len_b=1)
    )
    for hyps in beams:
        assert 0 < len(hyps) <= V - 2  # every token but PAD and BOS
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)
        assert all(h.score > float("-inf") for h in hyps)


def test_attention_shapes_and_rows_sum_to_one(trained):
    lengths = [7, 2, 5]
    src = sources(lengths, seed=8)
    greedy = greedy_search(trained, src, need_weights=True)
    beams = beam_search(tiny(), src, DecodeConfig(beam=3, nbest=2), need_weights=True)
    for hyps in ([[h] for h in greedy], beams):
        for nbest, s in zip(hyps, lengths, strict=True):
            for h in nbest:
                tq = len(h.tokens) + (h.stop_reason == "eos")
                assert h.attention.shape == (1 if hyps is not beams else 2, 4, tq, s)
                torch.testing.assert_close(h.attention.sum(-1), torch.ones(h.attention.shape[:3]))


def test_greedy_attention_and_score_equal_force_decode(trained):
    src = sources([7, 2, 5], seed=9)
    for model in (trained, tiny()):
        hyps = greedy_search(model, src, need_weights=True)
        forced = force_decode(model, src, [h.tokens for h in hyps])
        for h, f in zip(hyps, forced, strict=True):
            tq = h.attention.shape[2]
            torch.testing.assert_close(h.attention, f.attention[:, :, :tq], atol=1e-5, rtol=1e-4)
            if h.stop_reason == "eos":
                assert f.score == pytest.approx(h.score, abs=1e-4)
        assert all(f.stop_reason == "eos" for f in forced)


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_attention_is_traced_through_the_back_pointers(use_cache, trained):
    """Each n-best hypothesis' attention is what teacher-forcing its own tokens gives."""
    src = sources([7, 2, 5, 4], seed=10)
    for model in (tiny(), trained):
        beams = beam_search(
            model, src, DecodeConfig(beam=4, nbest=4, use_cache=use_cache), need_weights=True
        )
        for i, hyps in enumerate(beams):
            forced = force_decode(
                model, src[i : i + 1].expand(len(hyps), -1), [h.tokens for h in hyps]
            )
            for h, f in zip(hyps, forced, strict=True):
                tq = h.attention.shape[2]
                torch.testing.assert_close(
                    h.attention, f.attention[:, :, :tq], atol=1e-5, rtol=1e-4
                )
                if h.stop_reason == "eos":
                    assert f.score == pytest.approx(h.score, abs=1e-4)


def test_weights_leave_the_search_unchanged():
    model, src = tiny(), sources([7, 3], seed=11)
    assert_same(greedy_search(model, src), greedy_search(model, src, need_weights=True))
    assert_same(
        flat(beam_search(model, src, DecodeConfig(beam=3, nbest=3))),
        flat(beam_search(model, src, DecodeConfig(beam=3, nbest=3), need_weights=True)),
    )


def test_step_probs_are_the_distributions_greedy_search_chose_from(trained):
    src = sources([7, 3], seed=12)
    for ban_eos in (False, True):
        hyps = greedy_search(trained, src, DecodeConfig(ban_eos=ban_eos))
        for row, hyp in zip(src, hyps, strict=True):
            one = row[row != PAD_ID][None]  # (1, S)
            steps = hyp.tokens + [EOS_ID] if hyp.stop_reason == "eos" else hyp.tokens
            probs = step_probs(trained, one, steps)
            assert probs.shape == (len(steps), V)
            assert (probs[:, [PAD_ID, BOS_ID]] == 0).all()
            # the teacher-forced pass gives, row by row, the P(EOS) the search read step by step
            assert probs[:, EOS_ID].tolist() == pytest.approx(
                eos_probs_as_searched(trained, one, steps), abs=1e-5
            )
            # and each row's most likely token (EOS set aside where banned) is the one chosen
            if ban_eos:
                probs = probs.clone()  # an inference tensor is read-only outside inference mode
                probs[:, EOS_ID] = 0.0
            assert probs.argmax(-1).tolist() == steps
        assert ban_eos or any(h.stop_reason == "eos" for h in hyps)


def test_translate_batch_dispatches_on_beam(trained):
    src = sources([5, 3], seed=13)
    greedy = translate_batch(trained, src, DecodeConfig())
    assert [len(hs) for hs in greedy] == [1, 1]
    assert_same(flat(greedy), greedy_search(trained, src))
    beams = translate_batch(trained, src, DecodeConfig(beam=3, nbest=2, length_penalty=0.6))
    assert_same(
        flat(beams),
        flat(beam_search(trained, src, DecodeConfig(beam=3, nbest=2, length_penalty=0.6))),
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"beam": 0}, r"decode.beam must be between 1 \(greedy\) and 1000"),
        ({"beam": 2, "nbest": 3}, "decode.nbest must be between 1 and decode.beam"),
        ({"max_len_a": -0.5}, "decode.max_len_a must be >= 0"),
        ({"max_len_b": -1}, "decode.max_len_b >= 0"),
        ({"max_len_a": 0.0, "max_len_b": 0}, "max_len_b >= 1 when max_len_a is 0"),
        ({"max_tokens": 0}, "decode.max_tokens must be >= 1"),
    ],
)
def test_bad_settings_are_one_line_errors(settings, message):
    model, src = tiny(), sources([3, 2])
    for search in (greedy_search, beam_search, translate_batch):
        with pytest.raises(Seq2SeqError, match=message) as caught:
            search(model, src, DecodeConfig(**settings))
        assert "\n" not in str(caught.value)


def test_bad_arguments_are_clear_errors():
    model, src = tiny(), sources([3, 2])
    with pytest.raises(ValueError, match="all padding"):
        greedy_search(model, torch.tensor([[5, 6], [PAD_ID, PAD_ID]]))
    with pytest.raises(ValueError, match="eval"):
        greedy_search(model.train(), src)


def test_a_passed_deadline_stops_every_search_at_its_next_step():
    """Greedy, beam and occlusion check the deadline; one not yet passed changes nothing,
    and leaving its context removes it."""
    model, src = tiny(), sources([5, 3])
    decode = DecodeConfig(beam=3, nbest=3, max_len_a=0.0, max_len_b=6)
    expected = beam_search(model, src, decode)
    with deadline(time.monotonic() + 3600):
        assert beam_search(model, src, decode) == expected
    with deadline(time.monotonic() - 1):
        for search in (
            lambda: greedy_search(model, src, decode),
            lambda: beam_search(model, src, decode),
            lambda: occlude(model, src[:1], [5, 6, EOS_ID]),
        ):
            with pytest.raises(DeadlinePassed):
                search()
    assert beam_search(model, src, decode) == expected


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    k=st.integers(2, 5),
    alpha=st.sampled_from([-1.0, 0.0, 0.6, 1.0, 2.0]),
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    ban_eos=st.booleans(),
    seed=st.integers(0, 20),
)
def test_recording_the_tree_changes_nothing_decoded(k, alpha, lengths, ban_eos, seed):
    src, model = sources(lengths, seed=seed), tiny(n_enc_layers=1, n_dec_layers=1, seed=seed)
    decode = DecodeConfig(beam=k, nbest=k, length_penalty=alpha, ban_eos=ban_eos)
    plain = flat(beam_search(model, src, decode))
    assert_same(plain, flat(beam_search(model, src, decode, tree=SearchTree())))
    recorded = beam_search(model, src, decode, tree=SearchTree(), need_weights=True)
    assert_same(plain, flat(recorded))


def tree_of(model, src, decode, max_steps=MAX_STEPS):
    tree = SearchTree(max_steps)
    hyps = beam_search(model, src, decode, tree=tree, need_weights=True)
    return tree.trees, hyps


def path_of(tree, node):
    tokens = []
    while node.parent is not None:
        tokens.append(node.token)
        node = tree.nodes[node.parent]
    return tokens[::-1]


@pytest.mark.parametrize(("k", "alpha"), [(3, 1.0), (4, 0.0)])
def test_each_steps_kept_nodes_are_the_beam_and_the_pruned_score_below_them(k, alpha, trained):
    src = sources([6, 4], seed=13)
    trees, hyps = tree_of(trained, src, DecodeConfig(beam=k, nbest=k, length_penalty=alpha))
    for b, tree in enumerate(trees):
        steps = {}
        for node in tree.nodes[1:]:
            steps.setdefault(node.step, []).append(node)
            parent = tree.nodes[node.parent]
            assert node.score == pytest.approx(parent.score + node.logp, abs=1e-4)
            assert node.normalized == pytest.approx(
                node.score / gnmt_length_penalty(node.step, alpha), abs=1e-4
            )
        assert sorted(steps) == list(range(1, tree.end["step"] + 1))
        for nodes in steps.values():
            kept = [x for x in nodes if x.fate in ("kept", "max_len")]
            assert len(kept) == k  # the beam: K open hypotheses, EOS never among them
            assert all(x.token != EOS_ID for x in kept)
            for x in nodes:
                better = sum(y.score > x.score for y in nodes)
                if x.fate == "width" and x.token != EOS_ID:
                    assert x.score <= min(y.score for y in kept) + 1e-6
                elif x.fate == "width":  # an EOS outside the K best candidates
                    assert better >= k
                elif x.fate == "eos":
                    assert x.token == EOS_ID and better < k
            # Every node's children are its W best continuations: what teacher-forcing says.
            for parent_id in {x.parent for x in nodes}:
                parent = tree.nodes[parent_id]
                path = path_of(tree, parent)
                logp = step_probs(trained, src[b : b + 1], [*path, EOS_ID]).log()[-1]
                children = {x.token: x.logp for x in nodes if x.parent == parent_id}
                assert len(children) == tree.width
                best = logp.topk(tree.width).indices.tolist()
                assert set(children) == set(best)
                for token, lp in children.items():
                    assert lp == pytest.approx(float(logp[token]), abs=1e-4)
        # What the search returned is the best of what ended, by normalized score.
        ranked = sorted(tree.endings, key=lambda e: -e.normalized)[:k]
        assert [e.tokens for e in ranked] == [h.tokens for h in hyps[b]]
        assert [e.score for e in ranked] == pytest.approx([h.score for h in hyps[b]], abs=1e-4)
        if tree.end["reason"] == "early":
            assert tree.end["best_open"] <= tree.end["worst_finished"]


def test_a_banned_eos_is_recorded_with_the_models_probability_and_every_end_is_max_len(trained):
    src = sources([5], seed=14)
    decode = DecodeConfig(beam=3, nbest=3, ban_eos=True, max_len_a=0.0, max_len_b=6)
    (tree,), _ = tree_of(trained, src, decode)
    banned = [x for x in tree.nodes if x.fate == "eos_ban"]
    assert len(banned) == len({x.parent for x in tree.nodes[1:]})  # one per beam expanded
    assert {x.fate for x in tree.nodes} >= {"kept", "max_len", "eos_ban", "width"}
    assert "eos" not in {x.fate for x in tree.nodes}
    assert {e.stop_reason for e in tree.endings} == {"max_len"} and tree.end["step"] == 6
    first = next(x for x in banned if x.step == 1)
    p_eos = float(step_probs(trained, src, [EOS_ID])[0, EOS_ID])
    assert first.logp == pytest.approx(math.log(p_eos), abs=1e-4)


def test_past_its_step_cap_the_tree_keeps_only_what_ended(trained):
    src = sources([6], seed=13)
    decode = DecodeConfig(beam=3, nbest=3)
    (whole,), _ = tree_of(trained, src, decode)
    (capped,), _ = tree_of(trained, src, decode, max_steps=2)
    assert capped.truncated and not whole.truncated
    assert max(x.step for x in capped.nodes) == 2
    assert [(e.tokens, e.score) for e in capped.endings] == [
        (e.tokens, e.score) for e in whole.endings
    ]
    assert all(e.node is None for e in capped.endings if e.step > 2)
    parents = {x.parent for x in whole.nodes[1:]}
    assert all(whole.nodes[p].attention.shape == (1, 4, 6) for p in parents)  # (L, H, S)
