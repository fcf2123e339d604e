"""The bounds a config's values keep (``config.validate`` applies them when a config is made):
shapes that build within this toolkit's limits, rates and budgets, how the data fits the
model's positions. Each check is a pair: whether the value passes, and the message naming its
key. The sections come in as ``seq2seq.config``'s dataclasses, which import this module, so
it imports none of them (``Any`` below): the foundation has no cycle.
"""

from __future__ import annotations

import re
from typing import Any

SETTINGS = ("auto", "true", "false")  # of train.compile, train.cuda_graphs, data.pad_to_buckets


def setting_of(value: object) -> str:
    """``train.compile`` (or ``data.pad_to_buckets``) as one of ``SETTINGS`` (YAML reads
    true/false as booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).lower()


# Far above anything this toolkit trains, low enough that a tampered config.yaml cannot make
# load_run build layers until memory runs out.
_MAX_LAYERS, _MAX_WIDTH, _MAX_VOCAB, _MAX_POSITIONS = 64, 16384, 1_000_000, 65536
# A 32-bit seed: numpy's generators take no negative one, and torchrun's rank r draws from
# seed * 1_000_003 + r (runtime.seed_ranks), which stays within torch.manual_seed's 64 bits
# for every such seed on any number of ranks.
MAX_SEED = 2**32 - 1
MAX_THREADS = 1024  # SentencePiece's trainer refuses more (and torch's count is a C int)
# A year of minutes: longer is no budget at all (0 = none says so), and minutes * 60 of
# anything near float's limit is infinite, which no clock compares with.
MAX_MINUTES = 525_600


Check = tuple[bool, str]  # a value passes, or the message naming its key


def model_checks(m: Any) -> list[Check]:
    """Shapes that build, within this toolkit's limits; ``m`` a ``ModelConfig``."""
    return [
        (
            m.d_model >= 1 and m.n_heads >= 1 and m.d_model % m.n_heads == 0,
            "model.d_model must be a positive multiple of model.n_heads",
        ),
        (
            m.n_kv_heads is None
            or (1 <= m.n_kv_heads <= m.n_heads and m.n_heads % m.n_kv_heads == 0),
            "model.n_kv_heads must divide model.n_heads (1 = MQA, n_heads = MHA)",
        ),
        (m.d_latent is None or m.d_latent >= 1, "model.d_latent must be positive"),
        (m.src_vocab_size >= 8 and m.tgt_vocab_size >= 8, "model vocabulary sizes must be >= 8"),
        (
            m.d_ff >= 1 and m.n_enc_layers >= 1 and m.n_dec_layers >= 1,
            "model sizes must be positive",
        ),
        *[
            (value <= limit, f"model.{name} = {value} is beyond this toolkit's limit of {limit}")
            for name, value, limit in (
                ("n_enc_layers", m.n_enc_layers, _MAX_LAYERS),
                ("n_dec_layers", m.n_dec_layers, _MAX_LAYERS),
                ("d_model", m.d_model, _MAX_WIDTH),
                ("d_ff", m.d_ff, 4 * _MAX_WIDTH),
                ("d_latent", m.d_latent or 0, _MAX_WIDTH),
                ("src_vocab_size", m.src_vocab_size, _MAX_VOCAB),
                ("tgt_vocab_size", m.tgt_vocab_size, _MAX_VOCAB),
                ("max_positions", m.max_positions, _MAX_POSITIONS),
            )
        ],
        (
            all(0.0 <= p < 1.0 for p in (m.dropout, m.attn_dropout, m.activation_dropout)),
            "model dropouts must be in [0, 1)",
        ),
        (m.max_positions >= 2, "model.max_positions must be >= 2"),
    ]


def train_checks(t: Any) -> list[Check]:
    """Rates, schedules and precision; ``t`` a ``TrainConfig`` (``run_checks``: the rest)."""
    return [
        (
            t.early_dropout is None or 0.0 <= t.early_dropout < 1.0,
            "train.early_dropout must be in [0, 1) or null (model.dropout throughout)",
        ),
        (
            0 <= t.dropout_epochs[0] <= t.dropout_epochs[1],
            "train.dropout_epochs must be two epochs, 0 <= from <= to",
        ),
        (
            0 < t.lr <= 10 and t.warmup_steps >= 0,
            "train.lr must be in (0, 10] and train.warmup_steps >= 0",
        ),
        (0 <= t.seed <= MAX_SEED, f"train.seed must be between 0 and {MAX_SEED}"),
        (
            all(0.0 <= beta < 1.0 for beta in t.betas),
            "train.betas must be two numbers in [0, 1) (Adam's moment decays)",
        ),
        (t.weight_decay >= 0, "train.weight_decay must be >= 0"),
        (0.0 <= t.label_smoothing < 1.0, "train.label_smoothing must be in [0, 1)"),
        (t.optimizer in ("adam", "muon"), "train.optimizer must be 'adam' or 'muon'"),
        (
            t.muon_lr is None or 0 < t.muon_lr <= 10,
            "train.muon_lr must be in (0, 10] or null (train.lr)",
        ),
        (0.0 <= t.muon_momentum < 1.0, "train.muon_momentum must be in [0, 1)"),
        (
            t.muon_adjust_lr in ("match_rms_adamw", "original"),
            "train.muon_adjust_lr must be 'match_rms_adamw' or 'original'",
        ),
        (
            1 <= t.muon_ns_steps <= 10,
            "train.muon_ns_steps must be in [1, 10] (Newton–Schulz iterations a step)",
        ),
        (0.0 <= t.ema < 1.0, "train.ema must be in [0, 1) (the decay; 0 = no moving average)"),
        (0.0 <= t.cooldown <= 1.0, "train.cooldown must be in [0, 1]"),
        (
            t.accum_steps >= 1 and t.max_epochs >= 1,
            "train.accum_steps and train.max_epochs must be >= 1",
        ),
        (
            t.precision in ("auto", "bf16", "tf32", "fp16", "fp32"),
            "train.precision must be 'auto', 'bf16', 'tf32', 'fp16' or 'fp32'",
        ),
        (
            t.attention_kernels in ("auto", "all"),
            "train.attention_kernels must be 'auto' or 'all'",
        ),
    ]


def run_checks(t: Any) -> list[Check]:
    """How and where the trainer runs, and when it validates and writes; ``t`` a
    ``TrainConfig``."""
    return [
        (setting_of(t.compile) in SETTINGS, "train.compile must be auto, true or false"),
        (
            setting_of(t.cuda_graphs) in SETTINGS,
            "train.cuda_graphs must be auto, true or false",
        ),
        (
            re.fullmatch(r"auto|cpu|mps|cuda(:[0-9]+)?", t.device) is not None,
            "train.device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'",
        ),
        (
            t.max_time is None or 0 <= t.max_time <= MAX_MINUTES,
            f"train.max_time must be between 0 and {MAX_MINUTES} minutes, a year (0 = no limit)",
        ),
        (
            t.keep_last >= 0 and 0 <= t.average_last <= t.keep_last,
            "train.average_last must be between 0 and train.keep_last",
        ),
        (t.log_every >= 1, "train.log_every must be >= 1"),
        (t.patience >= 1, "train.patience must be >= 1"),
        (t.max_steps is None or t.max_steps >= 1, "train.max_steps must be >= 1"),
        (
            t.threads is None or 1 <= t.threads <= MAX_THREADS,
            f"train.threads must be between 1 and {MAX_THREADS}",
        ),
        (t.valid_bleu_sentences >= 1, "train.valid_bleu_sentences must be >= 1"),
        (t.attention_sentences >= 0, "train.attention_sentences must be >= 0 (0 = none)"),
        (t.prefetch >= 0, "train.prefetch must be >= 0 (0 = no prefetching)"),
        (t.validate_every >= 0, "train.validate_every must be >= 0 (0 = once per epoch)"),
        (
            t.cooldown_validate_every >= 0,
            "train.cooldown_validate_every must be >= 0 (0 = as validate_every)",
        ),
        (
            0 <= t.save_every <= MAX_MINUTES * 60,
            f"train.save_every must be 0..{MAX_MINUTES * 60} seconds",
        ),
        (
            t.clip_norm >= 0 and t.max_bad_steps >= 0,
            "train.clip_norm and train.max_bad_steps must be >= 0",
        ),
    ]


def data_checks(d: Any, m: Any) -> list[Check]:
    """The data section ``d`` (a ``DataConfig``), and how it must fit the positions of the
    model section ``m``."""
    return [
        (d.max_tokens >= d.max_len + 2, "data.max_tokens must be at least data.max_len + 2"),
        (d.max_len + 2 <= m.max_positions, "data.max_len + 2 must fit in model.max_positions"),
        (d.spm_model_type in ("bpe", "unigram"), "data.spm_model_type must be 'bpe' or 'unigram'"),
        (
            8 <= d.vocab_size <= _MAX_VOCAB,
            f"data.vocab_size must be between 8 and {_MAX_VOCAB}",
        ),
        (d.max_len >= 1, "data.max_len must be >= 1"),
        (
            d.joint_vocab or not m.share_embeddings,
            "data.joint_vocab false gives two vocabularies: set model.share_embeddings false too",
        ),
        (
            setting_of(d.pad_to_buckets) in SETTINGS,
            "data.pad_to_buckets must be auto, true or false",
        ),
        (
            d.carve_valid >= 0 and d.carve_test >= 0,
            "data.carve_valid and data.carve_test must be >= 0",
        ),
        (0.0 <= d.subword_alpha < 1.0, "data.subword_alpha must be in [0, 1) (0 = off)"),
        (
            0 <= d.subword_epochs[0] <= d.subword_epochs[1],
            "data.subword_epochs must be two epochs, 0 <= from <= to",
        ),
        (
            not d.subword_alpha or d.spm_model_type == "bpe",
            "data.subword_alpha (BPE-dropout) needs data.spm_model_type 'bpe'",
        ),
        (
            d.columns is None or re.fullmatch(r"([^,]+),(?!\1$)[^,]+", d.columns) is not None,
            "data.columns must name two different columns, source first, e.g. '1,2' or 'en,fr'",
        ),
    ]
