"""Typed configuration: dataclasses per concern, YAML in, dotted ``--set`` overrides.

Unknown keys are errors, values are checked against the field's type, and the resolved
config is saved with every run so a checkpoint can rebuild its model alone.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from seq2seq.config_checks import data_checks, model_checks, run_checks, train_checks
from seq2seq.errors import Seq2SeqError, read_field, read_yaml


@dataclass
class ModelConfig:
    # Multi30k has ~10k distinct source and target subwords at 8k joint BPE; a joint
    # vocabulary lets source, target and output embeddings be one matrix.
    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    d_model: int = 256  # small enough for 2 CPU cores, big enough for BLEU > 35 on Multi30k
    n_heads: int = 8  # Dh = 32
    n_kv_heads: int | None = None  # None = n_heads (MHA); 1 = MQA; in between = GQA
    d_ff: int = 1024  # the usual 4 * d_model
    n_enc_layers: int = 3
    n_dec_layers: int = 3
    dropout: float = 0.3  # residual and embedding dropout at full strength; a run left at the
    # defaults starts lower and reaches it as the corpus is seen more often (train.early_dropout)
    attn_dropout: float = 0.0  # dropout on attention weights; 0 keeps the fused kernel
    activation_dropout: float = 0.0  # inside the FFN (fairseq's default 0): the widest tensor,
    # and on CPU dropout's random numbers cost as much as a matmul of the same size
    max_positions: int = 512  # sinusoidal table length: the longest source or target
    share_embeddings: bool = True  # source + target embeddings one matrix (joint vocab)
    tie_output: bool = True  # output projection = target embedding (Press & Wolf 2017)
    d_latent: int | None = None  # set to use MLA-style latent K/V in self-attention


@dataclass
class DataConfig:
    data: str = "multi30k"  # registry name (the shipped Multi30k), Hub id, folder or TSV file
    src: str = "de"
    tgt: str = "en"
    test_split: str | None = None  # None = the one split named test*
    columns: str | None = None  # TSV: "1,2" or "en,fr", source first; None = header or first two
    vocab_size: int = 8000
    spm_model_type: str = "bpe"  # or "unigram"
    joint_vocab: bool = True
    max_len: int = 100  # subwords per side; longer training pairs are dropped and counted
    max_tokens: int = 2048  # per batch, per side, padding included: ~120 Multi30k pairs, so
    # ~240 updates an epoch; small data learns faster from more, smaller updates. Per process
    # under torchrun (fairseq's meaning): a step takes processes x accum_steps such batches.
    # Training batches padded to about a dozen fixed shapes (seq2seq/data/batching.py's
    # Buckets: the longer side rounded up to one of 12 lengths up to max_len + 1, the rows a
    # batch of that length holds), so that a step captured for a shape could be replayed;
    # the padding adds nothing to the loss or its gradient. "auto" is off everywhere: it is
    # for the captured CUDA step, not built, and no GPU record yet shows it; true or false.
    pad_to_buckets: bool | str = "auto"
    carve_valid: int = 1000  # carved off train when a corpus has only a train split
    carve_test: int = 1000
    # Subword regularisation: each epoch's training pairs segmented afresh by BPE-dropout,
    # each merge skipped with probability subword_alpha (0 = off: the store's segmentation
    # every epoch; Provilkov et al. 2020 use 0.1). Like late dropout it follows the epochs
    # seen: off until epoch subword_epochs[0], then rising linearly to subword_alpha at epoch
    # subword_epochs[1] (an epoch takes the value at its middle: [0, 0] = on from the first);
    # validation, test and decoding keep the deterministic segmentation.
    subword_alpha: float = 0.0
    subword_epochs: tuple[float, float] = (5.0, 10.0)  # train.dropout_epochs' default


# Where a model trains and decodes unless told: CUDA, then Apple's MPS, then the CPU. Every
# command, ``seq2seq.load`` and ``Translator.from_run`` take this default.
DEFAULT_DEVICE = "auto"


@dataclass
class TrainConfig:
    seed: int = 1
    lr: float = 2e-3  # peak learning rate after warmup (Adam, inverse sqrt decay)
    warmup_steps: int = 400  # ~2 epochs of Multi30k at 2048 tokens
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    # "adam" for every parameter, or "muon": Muon (orthogonalised momentum; Jordan et al. 2024)
    # for the layers' weight matrices, each packed block (Q | K | V) alone, and Adam for the
    # embeddings, the output layer, the norms and the biases; both on the one schedule.
    optimizer: str = "adam"
    # Muon's peak learning rate (None = train.lr). "match_rms_adamw" scales each matrix's
    # update to Adam's typical size (Liu et al. 2025), so Adam's learning rate and weight
    # decay carry over; "original" is Jordan's scaling, which wants a larger rate.
    muon_lr: float | None = None
    muon_momentum: float = 0.95
    muon_adjust_lr: str = "match_rms_adamw"
    # Newton–Schulz iterations a step, on torch's coefficients (torch's default, 5); each costs
    # three matrix multiplies of every matrix's size, so fewer make a cheaper step.
    muon_ns_steps: int = 5
    label_smoothing: float = 0.1
    # "Late dropout": model.dropout is reached as the corpus is seen more often. Until epoch
    # dropout_epochs[0] the residual and embedding dropout is early_dropout, then it rises
    # linearly to model.dropout at epoch dropout_epochs[1]: a function of the step alone (the
    # same on every machine, exact on --resume). Little dropout learns fastest while the corpus
    # is new; more fights the overfitting that comes with repeated epochs. Chosen on Multi30k's
    # validation split against fixed 0.1 and 0.3 at 1,200 and 4,900 steps, de-en, one seed each
    # (docs/training.md; records ladder-deen-*). None = model.dropout from the first step;
    # setting model.dropout alone means that too.
    early_dropout: float | None = 0.1
    dropout_epochs: tuple[float, float] = (5.0, 10.0)
    clip_norm: float = 1.0
    accum_steps: int = 1  # gradient accumulation: effective batch = accum_steps * max_tokens
    max_epochs: int = 100
    # Minutes of wall time, then the run validates, saves and stops; 0 or None = no limit.
    # A time budget, not an epoch count: the same command ends in the same half hour on a
    # laptop, a 2-core VM or a workstation (each gets as many epochs as it can afford);
    # on a GPU use --max-time 0 and let patience or max_epochs end the run.
    max_time: float | None = 30.0
    # The last share of the budget over which the learning rate falls linearly to zero, so
    # the run ends annealed (0 = no cool-down): of max_time when there is one, else of
    # max_steps; an epoch budget or patience alone has none. A run resumed with a larger
    # budget goes back up to the schedule's rate and cools down again before its new end.
    cooldown: float = 0.3
    # A step or epoch budget given without max_time means no time budget (see budget_rule).
    max_steps: int | None = None
    patience: int = 10  # validations without BLEU improvement before stopping
    validate_every: int = 0  # steps; 0 = once per epoch
    # Steps between validations in the cool-down (0 = as validate_every): dense at the end,
    # so that the last average_last validated states, which the run averages, are late ones.
    cooldown_validate_every: int = 0
    # Seconds at least between writes of last.safetensors and redraws of curves.png (0 = after
    # every epoch and validation); a stop and the end always write. For a device whose epochs
    # take seconds (experiments/configs/gpu.yaml).
    save_every: float = 0.0
    valid_bleu_sentences: int = 1014  # greedy BLEU on the first N validation pairs
    log_every: int = 10
    # "auto": bf16 autocast where native (CPU); on CUDA "tf32", or "fp16" (loss-scaled) below
    # compute capability 8.0; or "bf16", "tf32", "fp16", "fp32". See precision.py.
    precision: str = "auto"
    # torch.compile of the training step: "auto" (only where measured faster: see
    # seq2seq/training/compiling.py; on CPU it was not), true, or false.
    compile: bool | str = "auto"
    # The training step as CUDA graphs, one per bucket shape (seq2seq/training/graphs.py):
    # "auto" (only where a GPU record showed it faster with its training equal: none yet),
    # true, or false.
    cuda_graphs: bool | str = "auto"
    threads: int | None = None  # torch intra-op threads; None = logical CPUs / local ranks
    prefetch: int = 2  # steps' batches padded (pinned on CUDA) ahead, on a thread (0 = none)
    max_bad_steps: int = 10  # non-finite losses tolerated before the run stops
    attention_sentences: int = 3  # validation sentences whose cross-attention is saved (weights
    # at every validation in RUN/attention/step_N/, PNG grids of the last state at the end)
    device: str = DEFAULT_DEVICE  # "auto", "cpu", "cuda", "cuda:N", "mps"
    # SDPA's kernels on CUDA: "auto" (flash, memory-efficient, math: no cuDNN, which plans
    # anew for every batch shape) or "all" (torch's choice among all of them)
    attention_kernels: str = "auto"
    # The weights of the last N validated states stay in checkpoints/ (7.6M parameters:
    # 30 MB each), and the run ends by averaging them, kept as model.safetensors only when
    # the average validates better than the best single state (fairseq/OpenNMT practice).
    keep_last: int = 5
    average_last: int = 5
    # An exponential moving average of the weights, its decay (0 = none), warmed up as
    # min(ema, (1 + step) / (10 + step)) so that the first steps' weights fade; validated at
    # the end of a run and kept as model.safetensors only when it is better, like the average.
    ema: float = 0.0

    def budgets(self) -> str:
        """The budgets in force, and where the learning rate cools down: a run's first line."""
        t = self
        if t.max_time:
            limit = f"{t.max_time:g} minutes of training"
        elif t.max_steps:
            limit = f"{t.max_steps} steps"
        else:
            limit = "no time or step limit"
        if t.cooldown and (t.max_time or t.max_steps):
            cool = f"; the learning rate cools down to zero over its last {t.cooldown:.0%}"
        else:
            cool = "; no cool-down"
        also = [f"at most {t.max_epochs} epochs", f"patience {t.patience} validations"]
        if t.max_time and t.max_steps:
            also.insert(0, f"at most {t.max_steps} steps")
        return f"budget: {limit}{cool}; " + ", ".join(also)


# The widest beam the literature studies (Koehn and Knowles 2017 search with up to 1,000);
# a search keeps K hypotheses' caches per sentence, so memory grows with K long before the
# BLEU does (it falls past a dozen or so).
MAX_BEAM = 1000


@dataclass
class DecodeConfig:
    """How to decode: a run's ``decode`` section, and the one settings object every search,
    ``translate_ids``, ``Translator`` and ``evaluate`` take; ``check`` is its one check."""

    beam: int = 1  # 1 = greedy search
    nbest: int = 1  # hypotheses returned per sentence, at most beam
    length_penalty: float = 1.0  # GNMT alpha in ((5 + len) / 6) ** alpha; 0 = raw log-prob sum
    # max_len = a * S + b output subwords, S = source subwords (EOS included): room for a
    # translation half again as long as its source, and for short sources to say enough.
    max_len_a: float = 1.5
    max_len_b: int = 10
    max_tokens: int = 4096  # source tokens per translation batch, padding included
    use_cache: bool = True  # False recomputes the whole prefix every step: same output, slower
    ban_eos: bool = False  # EOS never chosen: every output runs to max_len (length studies)

    def check(self) -> None:
        """One-line errors for settings no search can run."""
        if not 1 <= self.beam <= MAX_BEAM:
            raise Seq2SeqError(
                f"decode.beam must be between 1 (greedy) and {MAX_BEAM}, got {self.beam}"
            )
        if not 1 <= self.nbest <= self.beam:
            raise Seq2SeqError(
                f"decode.nbest must be between 1 and decode.beam, got nbest {self.nbest} "
                f"with beam {self.beam}"
            )
        if not -10 <= self.length_penalty <= 10:  # beyond, ((5 + len) / 6) ** alpha overflows
            raise Seq2SeqError(
                f"decode.length_penalty must be between -10 and 10, got {self.length_penalty}"
            )
        # max_len = a * S + b, S counting the source's EOS: b = 0 is a fine rule when a > 0.
        if self.max_len_a < 0 or self.max_len_b < 0 or (self.max_len_a == 0 and self.max_len_b < 1):
            raise Seq2SeqError(
                f"decode.max_len_a must be >= 0 and decode.max_len_b >= 0, with max_len_b >= 1 "
                f"when max_len_a is 0, got {self.max_len_a} and {self.max_len_b}"
            )
        if self.max_tokens < 1:
            raise Seq2SeqError(f"decode.max_tokens must be >= 1, got {self.max_tokens}")

    def with_overrides(self, **overrides: Any) -> DecodeConfig:
        """A checked copy with the non-None ``overrides`` on top (an option left unset on
        the command line is None and keeps the run's value)."""
        given = {key: value for key, value in overrides.items() if value is not None}
        decode = dataclasses.replace(self, **given)
        decode.check()
        return decode


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


def _read(obj: Any, values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``values`` (nested by section) read as the fields of ``obj`` take them, as YAML holds
    them (a list for a tuple); an unknown key or a value of another type is a one-line error
    naming it."""
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    read: dict[str, Any] = {}
    for key, value in values.items():
        where = f"{prefix}{key}"
        if key not in names:
            raise Seq2SeqError(f"config: unknown key '{where}' (known: {', '.join(sorted(names))})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise Seq2SeqError(f"config {where}: expected a mapping, got {value!r}")
            read[key] = _read(current, value, where + ".")
        else:
            read[key] = _plain(read_field(value, hints[key], where))
    return read


def _update(obj: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict):
            _update(getattr(obj, key), value)
        else:
            setattr(obj, key, tuple(value) if isinstance(value, list) else value)


def budget_rule(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (what a file or the command line set) with ``train.max_time: None`` added
    when they give a step or epoch budget but no time budget: asking for 5,000 steps means
    5,000 steps, not "5,000 steps or the default 30 minutes, whichever comes first"."""
    train = values.get("train")
    other_budget = isinstance(train, dict) and any(
        train.get(key) is not None for key in ("max_steps", "max_epochs")
    )
    if other_budget and "max_time" not in train:
        return {**values, "train": {**train, "max_time": None}}
    return values


def dropout_rule(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``train.early_dropout: None`` added when they set ``model.dropout`` but
    say nothing of its schedule: a dropout you give is the dropout you get, from the first step."""
    model, train = values.get("model"), values.get("train", {})
    given = isinstance(model, dict) and "dropout" in model
    if given and isinstance(train, dict) and "early_dropout" not in train:
        return {**values, "train": {**train, "early_dropout": None}}
    return values


def ramp(epochs: float, span: tuple[float, float], low: float, high: float) -> float:
    """``low`` until epoch ``span[0]``, then linearly up to ``high`` at epoch ``span[1]``."""
    start, end = span
    if epochs <= start:
        return low
    if epochs >= end:
        return high
    return low + (high - low) * (epochs - start) / (end - start)


def dropout_at(config: Config, epochs: float) -> float:
    """The residual and embedding dropout after ``epochs`` passes over the corpus (fractional)."""
    full, early = config.model.dropout, config.train.early_dropout
    if early is None:
        return full
    return ramp(epochs, config.train.dropout_epochs, early, full)


def subword_alpha_at(config: Config, epoch: int) -> float:
    """The BPE-dropout of epoch ``epoch`` (0 = the store's segmentation): the schedule's value
    halfway through it, as dropout's ramp is on average over the epoch's steps."""
    d = config.data
    return ramp(epoch + 0.5, d.subword_epochs, 0.0, d.subword_alpha) if d.subword_alpha else 0.0


def config_from_dict(values: dict[str, Any]) -> Config:
    config = Config()
    if not isinstance(values, dict):
        raise Seq2SeqError("config: the top level must be a mapping of sections")
    _update(config, _read(config, dropout_rule(budget_rule(values)), ""))
    validate(config)
    return config


def parse_override(text: str) -> dict[str, Any]:
    """``train.lr=5e-4`` -> ``{"train": {"lr": "5e-4"}}``: the value as typed, for its field
    to read (``null`` or ``~`` alone is None, a list is YAML: ``train.betas=[0.9, 0.98]``)."""
    if "=" not in text:
        raise Seq2SeqError(f"--set expects section.key=value, got {text!r}")
    dotted, raw = text.split("=", 1)
    return nest({dotted.strip(): None if raw.strip() in ("null", "~") else raw})


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"train.seed": 5}`` -> ``{"train": {"seed": 5}}``."""
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, name = dotted.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = value
    return nested


def merge_values(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` written over ``base`` (in place), section by section."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_values(base[key], value)
        else:
            base[key] = value
    return base


def load_config(
    path: str | Path | None = None, overrides: list[str] = (), flags: dict[str, Any] | None = None
) -> Config:
    """Defaults, then the YAML file, then the ``flags``' values, then each ``--set``
    override, in that order."""
    return config_from_dict(given_values(path, overrides, flags))


def given_values(
    path: str | Path | None = None, overrides: list[str] = (), flags: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What the YAML file, the flags (values by dotted key: ``{"train.seed": 5}``, None = not
    given) and the ``--set`` overrides set, read by their fields and nested by section; no
    defaults.

    ``dropout_rule`` and ``budget_rule`` read the file and the command line apart: a
    ``model.dropout`` set on the command line holds from the first step even over a file that
    schedules it (a run's saved ``config.yaml`` always does), unless the command line sets
    ``train.early_dropout`` too; a step or epoch budget on the command line is the budget
    even over a file's ``train.max_time`` (a saved ``config.yaml`` holds one), unless the
    command line sets ``train.max_time`` too."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = read_yaml(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise Seq2SeqError(f"config file not found: {path}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise Seq2SeqError(
                f"config file {path} is not valid YAML: {str(e).splitlines()[0]}"
            ) from None
        values = loaded or {}
        if not isinstance(values, dict):
            raise Seq2SeqError(f"config file {path}: the top level must be a mapping of sections")
        values = dropout_rule(budget_rule(_read(Config(), values, "")))
    given = nest({key: value for key, value in (flags or {}).items() if value is not None})
    for text in overrides:
        given = merge_values(given, parse_override(text))
    return merge_values(values, dropout_rule(budget_rule(_read(Config(), given, ""))))


def _plain(value: Any) -> Any:
    """A value as YAML holds it: a tuple as a list."""
    return list(value) if isinstance(value, tuple) else value


def config_to_dict(config: Config) -> dict[str, Any]:
    return {
        section.name: {
            k: _plain(v) for k, v in dataclasses.asdict(getattr(config, section.name)).items()
        }
        for section in dataclasses.fields(config)
    }


def validate(config: Config) -> None:
    """Reject absurd values with a message naming the key: the first check that fails, of the
    model, training, data and decoding sections in that order."""
    m, t, d = config.model, config.train, config.data
    for ok, message in [*model_checks(m), *train_checks(t), *run_checks(t), *data_checks(d, m)]:
        if not ok:
            raise Seq2SeqError(f"config: {message}")
    config.decode.check()
