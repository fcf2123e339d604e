"""Influence by occlusion (``seq2seq.inspect.influence``) and interventions on cross-attention
(``seq2seq.inspect.interventions``): shapes, the batched occlusion against one pass per position,
positions nobody reads, the neutral control, and the experiment that uses both."""

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from browser import explorer_run_dir
from helpers import V, child_env, tiny_model, tiny_run_dir

from seq2seq.config import DecodeConfig
from seq2seq.data.batching import collate
from seq2seq.decoding.load import load_run
from seq2seq.decoding.search import force_decode, greedy_search
from seq2seq.errors import Seq2SeqError
from seq2seq.inspect.influence import (
    TIE_NATS,
    TIE_NATS_FP32,
    TIE_NATS_TF32,
    agreement,
    occlude,
    tie_nats,
    tied_columns,
)
from seq2seq.inspect.interventions import (
    changed_tokens,
    hidden_source,
    intervene,
    parse_spec,
    replaced,
)
from seq2seq.model.attention import MultiHeadAttention
from seq2seq.model.masks import padding_mask
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID

REPO = Path(__file__).resolve().parents[1]
SENTENCES = [
    "Ein Hund läuft über die Wiese.",
    "Zwei Männer spielen Fußball.",
    "Eine Frau liest ein Buch im Park.",
    "Ein Kind sitzt auf einer Bank.",
]


def random_sentence(seed: int, s: int = 7, t: int = 6) -> tuple[torch.Tensor, list[int]]:
    """A source (1, S) ending in EOS and T target ids ending in EOS, of tokens 4..V-1."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (1, s), generator=g)
    src[0, -1] = EOS_ID
    tgt = torch.randint(4, V, (t - 1,), generator=g).tolist() + [EOS_ID]
    return src, tgt


def per_position(model, src: torch.Tensor, tgt: list[int]) -> torch.Tensor:
    """The reference: one pass per hidden source position, batch 1. (T, S) log-prob drops."""
    src_mask = padding_mask(src)
    memory = model.encode(src, src_mask)
    tgt_in = torch.tensor([[BOS_ID, *tgt[:-1]]])
    steps = torch.arange(len(tgt))

    def logp(mask: torch.Tensor) -> torch.Tensor:
        logits, _ = model.decode(tgt_in, memory, mask)
        return logits[0].log_softmax(-1)[steps, tgt]  # (T,)

    base = logp(src_mask)
    s = src.shape[1]
    return torch.stack([base - logp(src_mask & (torch.arange(s) != j)) for j in range(s)], 1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained on data/sample (one decoder layer) and its tokenizer."""
    _, tokenizer, model = load_run(tiny_run_dir(tmp_path_factory))
    return model, tokenizer


def source(tokenizer, sentence: str) -> torch.Tensor:
    return torch.tensor([tokenizer.encode(sentence, "src") + [EOS_ID]])  # (1, S)


def test_occlusion_shapes_one_row_per_target_token_and_a_column_per_group():
    model = tiny_model()
    src, tgt = random_sentence(0)
    occlusion = occlude(model, src, tgt, need_weights=True)
    t, s = len(tgt), src.shape[1]
    assert occlusion.influence.shape == (t, s)  # the EOS step is the last row
    assert occlusion.probs.shape == occlusion.log_probs.shape == (t,)
    assert occlusion.masked_probs.shape == occlusion.masked_log_probs.shape == (s, t)
    assert [tuple(w.shape) for w in occlusion.attention] == [(4, t, s)] * 2  # (H, T, S) per layer
    assert occlusion.passes == 2  # the unmasked row with every occlusion, and the weights alone
    assert occlude(model, src, tgt).attention == []  # no weights asked for: one pass
    grouped = occlude(model, src, tgt, [[0, 1], [2], [3, 4, 5], [6]])
    assert grouped.influence.shape == (t, 4)
    alone = occlude(model, src, tgt, [])  # the unmasked pass alone
    assert alone.passes == 1 and alone.influence.shape == (t, 0)
    torch.testing.assert_close(alone.log_probs, occlusion.log_probs, atol=0, rtol=0)


def test_batched_occlusion_is_one_pass_per_position():
    model = tiny_model(n_kv_heads=2)
    src, tgt = random_sentence(1)
    expected = per_position(model, src, tgt)
    torch.testing.assert_close(occlude(model, src, tgt).influence, expected, atol=1e-5, rtol=0)
    # A small logit budget splits the occlusions into several passes: the same numbers.
    few = occlude(model, src, tgt, max_logits=2 * len(tgt) * V)  # 2 rows a pass
    assert few.passes == 4  # S = 7 occlusions and the unmasked row
    torch.testing.assert_close(few.influence, expected, atol=1e-5, rtol=0)


def test_the_unmasked_row_is_scored_in_the_occlusions_batch(monkeypatch):
    """Every decoder pass of the scores has one batch size, the unmasked row inside the
    first: a kernel that rounds by batch shape moves the two alike."""
    model = tiny_model()
    src, tgt = random_sentence(7)
    passes = []
    decode = model.decode

    def spy(tgt_in, memory, allowed, **kwargs):
        passes.append(allowed.clone())  # (B, 1, 1, S)
        return decode(tgt_in, memory, allowed, **kwargs)

    monkeypatch.setattr(model, "decode", spy)
    for budget, sizes in ((None, [8]), (3 * len(tgt) * V, [3, 3, 3])):  # S + 1 = 8 rows
        passes.clear()
        occlude(model, src, tgt, max_logits=budget)
        assert [p.shape[0] for p in passes] == sizes
        assert passes[0][0].all()  # row 0: nothing hidden
        assert (~passes[0][1:]).sum() == len(passes[0]) - 1  # then one position hidden a row


def test_hiding_a_position_no_layer_reads_changes_nothing():
    model = tiny_model()
    src, tgt = random_sentence(2)
    padded = torch.cat([src, torch.full((1, 3), PAD_ID)], 1)  # (1, S + 3)
    influence = occlude(model, padded, tgt).influence
    torch.testing.assert_close(influence[:, -3:], torch.zeros(len(tgt), 3), atol=1e-5, rtol=0)
    assert influence[:, :-3].abs().max() > 1e-3  # the real positions do matter
    # A model whose cross-attention writes nothing reads no position at all.
    for layer in model.decoder_layers:
        torch.nn.init.zeros_(layer.cross_attn.out_proj.weight)
        torch.nn.init.zeros_(layer.cross_attn.out_proj.bias)
    torch.testing.assert_close(
        occlude(model, src, tgt).influence, torch.zeros(len(tgt), src.shape[1]), atol=1e-5, rtol=0
    )


def test_a_group_may_not_hide_the_whole_source():
    src, tgt = random_sentence(3, s=3)
    with pytest.raises(ValueError, match="at least one allowed key"):
        occlude(tiny_model(), src, tgt, [[0, 1, 2]])


def test_agreement_compares_the_row_argmaxes_and_calls_a_near_tie_a_tie():
    attention = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1]])
    near = TIE_NATS / 2
    influence = np.array([[2.0, 0.1, -1.0], [0.5, -0.2, 0.1], [1.0, 1.0 + near, 0.2]])
    assert agreement(attention, influence) == {
        "most_attended": [0, 2, 0],
        "most_influential": [0, 0, 1],
        "tied": [[0], [0], [0, 1]],
        "agree": [True, False, None],  # row 2: which drop is larger, rounding decides
    }
    assert agreement(attention, influence, tie=near / 2)["agree"] == [True, False, False]


def greedy_outputs(model, tokenizer):
    """Each of SENTENCES, its source ids and greedy search's output as influence scores it
    (with the EOS it stopped at)."""
    for sentence in SENTENCES:
        src = source(tokenizer, sentence)
        hyp = greedy_search(model, src)[0]
        tgt = hyp.tokens + [EOS_ID] if hyp.stop_reason == "eos" else hyp.tokens
        yield sentence, src, tgt


def test_bf16_influence_picks_the_fp32_columns_in_every_row_that_is_not_a_tie(tmp_path_factory):
    """Under bf16 autocast the map moves, and a row decided in fp32 (its top two drops TIE_NATS
    apart or more) names the same most influential column. How far bf16 moves a drop depends on
    the model and the CPU: the threshold comes from the tour model's records, not this model."""
    _, tokenizer, model = load_run(explorer_run_dir(tmp_path_factory))  # trained 300 steps
    rows = 0
    for sentence, src, tgt in greedy_outputs(model, tokenizer):
        fp32 = occlude(model, src, tgt).influence
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = occlude(model, src, tgt).influence
        assert bf16.dtype == torch.float32 and (bf16 - fp32).abs().max() > 0  # autocast took
        decided = [len(t) == 1 for t in tied_columns(fp32)]
        rows += sum(decided)
        picks = bf16.argmax(-1) == fp32.argmax(-1)
        assert picks[torch.tensor(decided)].all(), sentence
    assert rows >= len(SENTENCES)  # not every row a tie


def test_fp32_influence_picks_the_float64_columns_in_every_row_that_is_not_a_tie(
    tmp_path_factory,
):
    """TIE_NATS_FP32 is the spread fp32's rounding puts on influence: against the same map in
    float64, no drop moves by the threshold, and a row decided in float64 names the same most
    influential column in fp32."""
    _, tokenizer, model = load_run(explorer_run_dir(tmp_path_factory))
    wide = copy.deepcopy(model).double()
    rows = 0
    for sentence, src, tgt in greedy_outputs(model, tokenizer):
        fp32 = occlude(model, src, tgt).influence
        fp64 = occlude(wide, src, tgt).influence
        assert fp64.dtype == torch.float64 and (fp32 - fp64).abs().max() < TIE_NATS_FP32
        decided = [len(t) == 1 for t in tied_columns(fp64, TIE_NATS_FP32)]
        rows += sum(decided)
        assert (fp32.argmax(-1) == fp64.argmax(-1))[torch.tensor(decided)].all(), sentence
    assert rows >= len(SENTENCES)


def test_the_tie_thresholds_are_above_what_every_record_measured():
    """Each threshold is above the largest move of a row's top-two gap that
    experiments/influence_precision.py recorded for its precision on any machine, by less than
    twice it (fp32's by less than four times), and a map takes the one of its precision."""
    paths = sorted((REPO / "experiments/results").glob("influence_precision_tour*.json"))
    records = [json.loads(path.read_text()) for path in paths]
    # a CPU that emulates bf16 and one that computes it
    assert {not r["environment"]["cpu_bf16_flags"] for r in records} == {True, False}
    moved = {
        pair: max(r["pairs"][pair]["largest_top_two_gap_move_nats"] for r in records)
        for pair in ("bf16 against fp32", "fp32 against float64")
    }
    assert moved["bf16 against fp32"] < TIE_NATS < 2 * moved["bf16 against fp32"]
    assert moved["fp32 against float64"] < TIE_NATS_FP32 < 4 * moved["fp32 against float64"]
    assert tie_nats(torch.bfloat16) == TIE_NATS and tie_nats(None) == TIE_NATS_FP32


def test_a_map_takes_the_tie_threshold_of_the_precision_in_force(tf32_switch):
    """On CUDA with TF32 matrix multiplies in force (a run of precision tf32, inside its
    Translator's calls) fp32 tensors are rounded like TF32: TF32's threshold, not fp32's."""
    from seq2seq.run.precision import matmul_precision

    gpu, cpu = torch.device("cuda:0"), torch.device("cpu")
    with matmul_precision("tf32", gpu):
        assert tie_nats(None, gpu) == TIE_NATS_TF32 > TIE_NATS_FP32
        assert tie_nats(None, cpu) == TIE_NATS_FP32  # CUDA's switch: not the CPU's numbers
        assert tie_nats(torch.bfloat16, gpu) == TIE_NATS
        assert tie_nats(torch.float16, cpu) == tie_nats(torch.float16, gpu) == TIE_NATS
    with matmul_precision("fp32", gpu):
        assert tie_nats(None, gpu) == TIE_NATS_FP32


def test_hidden_source_decodes_as_occlusion_scores():
    """The "mask" intervention hides a position exactly as occlusion does: teacher-forced
    under ``hidden_source``, the target's log-prob is occlusion's for that position."""
    model = tiny_model()
    src, tgt = random_sentence(4)
    occlusion = occlude(model, src, tgt)
    for j in (0, 3):
        with hidden_source(model, [j], src.shape[1]):
            score = force_decode(model, src, [tgt[:-1]])[0].score
        assert score == pytest.approx(float(occlusion.masked_log_probs[j].sum()), abs=1e-4)


def test_kept_weights_return_the_original_output_exactly(trained):
    model, tokenizer = trained
    for sentence in SENTENCES:
        done = intervene(model, source(tokenizer, sentence), DecodeConfig(), kind="kept")
        assert done.new.tokens == done.original.tokens
        assert done.new.stop_reason == done.original.stop_reason


def test_uniform_weights_change_a_trained_models_output(trained):
    model, tokenizer = trained
    changed = []
    for sentence in SENTENCES:
        done = intervene(model, source(tokenizer, sentence), DecodeConfig(), kind="uniform")
        assert done.original.tokens == greedy_search(model, source(tokenizer, sentence))[0].tokens
        changed.append(done.new.tokens != done.original.tokens)
    assert any(changed)
    assert all(type(layer.cross_attn) is MultiHeadAttention for layer in model.decoder_layers)


def test_mask_hiding_a_padding_position_changes_nothing():
    model = tiny_model()
    src, _ = random_sentence(5)
    padded = torch.cat([src, torch.full((1, 2), PAD_ID)], 1)
    done = intervene(model, padded, DecodeConfig(), kind="mask", positions=[src.shape[1]])
    assert done.new.tokens == done.original.tokens


def test_bad_interventions_are_refused():
    model = tiny_model()
    src, _ = random_sentence(6)
    with pytest.raises(ValueError, match="decoder has layers 0..1"):
        intervene(model, src, DecodeConfig(), kind="uniform", layers=[2])
    with pytest.raises(ValueError, match="unknown intervention 'flat'"):
        intervene(model, src, DecodeConfig(), kind="flat")
    with pytest.raises(ValueError, match="unknown replacement"), replaced(model, [1, 0], "flat"):
        pass
    assert all(type(layer.cross_attn) is MultiHeadAttention for layer in model.decoder_layers)
    assert parse_spec("permuted:2", 2).layer == 2 and parse_spec("kept", 2).layer is None
    assert parse_spec("mask:3", 2).position == 3
    for spec, message in [
        ("flat", "unknown kind 'flat'"),
        ("uniform:3", "the decoder has layers 1..2"),
        ("uniform:0", "the decoder has layers 1..2"),
        ("uniform:x", "the decoder has layers 1..2"),
        ("mask", "name the source position"),
        ("mask:0", "name the source position"),
        ("mask:\u00b2", "name the source position"),  # "²".isdigit(), but int("²") fails
        ("uniform:\u00b2", "the decoder has layers 1..2"),
    ]:
        with pytest.raises(Seq2SeqError, match=message):
            parse_spec(spec, 2)


def test_changed_tokens_marks_an_insertion_once():
    assert changed_tokens([1, 2, 3], [1, 9, 2, 3]) == ([False] * 3, [False, True, False, False])
    assert changed_tokens([], [5]) == ([], [True])


# --- the experiment that uses both -----------------------------------------------------


def _experiment():
    path = REPO / "experiments" / "attention_not_explanation" / "run.py"
    spec = importlib.util.spec_from_file_location("experiment_ane", path)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    return run


def sensitivity_before_the_library(model, src_ids, out_ids) -> list[dict]:
    """``attention_vs_sensitivity`` as the experiment had it before it imported ``occlude``
    (kept here so the test can say its numbers did not move)."""
    n_layers = len(model.decoder_layers)
    agree = torch.zeros(2, n_layers + 1, dtype=torch.float64)
    chance = torch.zeros(2, dtype=torch.float64)
    tokens = 0
    with torch.inference_mode():
        for src_list, out in zip(src_ids, out_ids, strict=True):
            src = collate([src_list], None).src
            s = src.shape[1]
            mask = padding_mask(src)
            memory = model.encode(src, mask)
            tgt_in = torch.tensor([[BOS_ID, *out]])
            target = torch.tensor([*out, EOS_ID])
            t = target.shape[0]
            logits, weights = model.decode(tgt_in, memory, mask, need_weights=True)
            base = logits[0].softmax(-1)[torch.arange(t), target]
            att = torch.stack([w[0].mean(0) for w in weights])
            att = torch.cat([att, att.mean(0, keepdim=True)])
            masks = ~torch.eye(s, dtype=torch.bool)[:, None, None, :]
            masked, _ = model.decode(tgt_in.expand(s, -1), memory.expand(s, -1, -1), masks)
            probs = masked.softmax(-1)[:, torch.arange(t), target]
            effect = (probs - base).abs()
            agree[0] += (att.argmax(-1) == effect.argmax(0)).sum(-1)
            agree[1] += (att[..., :-1].argmax(-1) == effect[:-1].argmax(0)).sum(-1)
            chance += torch.tensor([t / s, t / (s - 1)], dtype=torch.float64)
            tokens += t
    names = [str(i + 1) for i in range(n_layers)] + ["mean"]
    agree, chance = (agree / tokens).tolist(), (chance / tokens).tolist()
    keys = ("agree", "agree_no_eos")
    return [
        {"layer": n, **{k: agree[a][i] for a, k in enumerate(keys)}, "chance": chance[0],
         "chance_no_eos": chance[1]}
        for i, n in enumerate(names)
    ]  # fmt: skip


def test_experiment_sensitivity_numbers_are_those_of_its_former_code():
    """attention_not_explanation's --quick numbers are unchanged by construction: its
    attention-against-sensitivity table, now computed with ``occlude``, equals the code it
    replaced, to the last bit, on a tiny model and greedy outputs of random sources."""
    run = _experiment()
    model = tiny_model()
    g = torch.Generator().manual_seed(0)
    src_ids = [torch.randint(4, V, (n,), generator=g).tolist() for n in (3, 6, 9, 12)]
    out_ids = [h.tokens for h in greedy_search(model, collate(src_ids, None).src)]
    assert run.attention_vs_sensitivity(model, src_ids, out_ids) == sensitivity_before_the_library(
        model, src_ids, out_ids
    )


def test_timing_script_runs_and_writes_its_numbers(tmp_path_factory, tmp_path):
    run = tiny_run_dir(tmp_path_factory)
    out = tmp_path / "timing.json"
    script = REPO / "experiments" / "influence_timing.py"
    args = ["--run", str(run), "--quick", "--threads", "1", "--page-sentences", "2"]
    done = subprocess.run(
        [sys.executable, str(script), *args, "--json", str(out)],
        env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["words"] == 20 and results["passes"] >= 1
    assert results["unmasked_pass_s"] > 0 and results["extra_share"] < 1
    assert "occlusions" in done.stdout
    page = results["page"]  # the page grows by influence, then by the interventions
    assert page["sentences"] == 2 and page["file"] == "data/sample/train.de"
    assert page["bytes"]["maps"] < page["bytes"]["maps_influence"] < page["bytes"]["written"]
