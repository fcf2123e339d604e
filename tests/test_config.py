"""Typed config: YAML in, dotted --set overrides, unknown keys, type errors, absurd values."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch
import yaml
from test_train import REPO, SUBPROCESS_TIMEOUT_S, subprocess_env

from seq2seq.commands.cli import main
from seq2seq.config import Config, config_from_dict, config_to_dict, given_values, load_config
from seq2seq.errors import Seq2SeqError


def one_line_error(overrides: list[str], match: str) -> str:
    with pytest.raises(Seq2SeqError, match=match) as error:
        load_config(None, overrides)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_defaults_round_trip_through_yaml(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(Config())))
    assert load_config(path) == Config()
    assert config_from_dict(config_to_dict(Config())) == Config()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train.lr=0.0005", {"train": {"lr": 0.0005}}),
        ("train.max_time=null", {"train": {"max_time": None}}),
        ("train.betas=[0.9, 0.99]", {"train": {"betas": [0.9, 0.99]}}),
        ("data.joint_vocab=false", {"data": {"joint_vocab": False}}),
        ("data.data=a=b.tsv", {"data": {"data": "a=b.tsv"}}),  # only the first = splits
        ("data.src=de", {"data": {"src": "de"}}),
        ("data.test_split=", {"data": {"test_split": ""}}),
    ],
)
def test_set_parsing(text, expected):
    assert given_values(None, [text]) == expected


def test_set_needs_an_equals_sign():
    one_line_error(["train.lr"], "--set expects section.key=value")


def test_file_then_set_overrides_in_order(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  d_model: 64\n  n_heads: 4\ntrain:\n  lr: 0.002\n")
    config = load_config(path, ["train.lr=0.001", "model.n_heads=8", "model.n_heads=2"])
    assert (config.model.d_model, config.model.n_heads, config.train.lr) == (64, 2, 0.001)
    assert config.train.betas == (0.9, 0.98) and isinstance(config.train.betas, tuple)
    assert load_config(None, ["train.lr=1"]).train.lr == 1.0 and isinstance(
        load_config(None, ["train.lr=1"]).train.lr, float
    )


def test_set_accepts_exponent_floats():
    assert load_config(None, ["train.lr=5e-4"]).train.lr == 5e-4


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["train.nope=1"], "unknown key 'train.nope' \\(known: accum_steps"),
        (["nope.lr=1"], "unknown key 'nope' \\(known: data, decode, model, train\\)"),
        (["model.d_model.x=1"], "model.d_model: expected a whole number"),
    ],
)
def test_unknown_keys_are_errors(overrides, match):
    one_line_error(overrides, match)


def test_unknown_key_in_a_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 0.001\n  learning_rate: 0.001\n")
    with pytest.raises(Seq2SeqError, match="unknown key 'train.learning_rate'"):
        load_config(path)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["model.d_model=big"],
            "model.d_model: expected a whole number of at most 18 ASCII digits, got 'big'",
        ),
        (["model.d_model=32.5"], "model.d_model: expected a whole number"),
        (["model.d_model=true"], "model.d_model: expected a whole number"),  # bool is no int here
        (["train.lr=fast"], "train.lr: expected a finite number"),
        (["data.joint_vocab=yes please"], "data.joint_vocab: expected true or false"),
        (["train.betas=0.9"], "train.betas: expected a list of 2 values"),
        (["train.betas=[0.9, 0.98, 0.1]"], "train.betas: expected a list of 2 values"),
        (["train=3"], "config train: expected a mapping"),
    ],
)
def test_type_errors(overrides, match):
    one_line_error(overrides, match)


@pytest.mark.parametrize(
    "override",
    [
        "train.lr=\u0660.\u0660\u0660\u0662",  # float() reads other digits: 0.002
        "train.lr=2_0e-4",  # and underscores
        "train.max_time=nan",
        "model.dropout=.nan",
        "train.cooldown=.nan",
        "decode.length_penalty=.nan",
        "decode.max_len_a=.inf",
        "decode.max_len_a=1e999",
        "data.subword_alpha=-.inf",
        "train.betas=[0.9, .nan]",
    ],
)
def test_a_float_is_a_finite_number_in_ascii_digits_from_set_and_from_a_file(override, tmp_path):
    key = override.split("=")[0]
    refused_by_set_and_file(
        override, f"config {key}: expected a finite number in ASCII digits", tmp_path
    )


def refused_by_set_and_file(override: str, match: str, tmp_path) -> None:
    """``override`` is a one-line error matching ``match`` as a --set and as a file's line."""
    key, value = override.split("=")
    one_line_error([override], match)
    section, name = key.split(".")
    path = tmp_path / "run.yaml"
    path.write_text(f"{section}:\n  {name}: {value}\n", encoding="utf-8")
    with pytest.raises(Seq2SeqError, match=match):
        load_config(path)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["model.d_model=30", "model.n_heads=4"],
            "d_model must be a positive multiple of model.n_heads",
        ),
        (["model.n_kv_heads=3"], "n_kv_heads must divide"),
        (["model.dropout=1.5"], "dropouts must be in \\[0, 1\\)"),
        (["decode.length_penalty=11"], "decode.length_penalty must be between -10 and 10"),
        (["train.device=cuda:\u0663"], "device must be"),  # re's \d takes other digits
        (["train.lr=0"], "train.lr must be in \\(0, 10\\]"),
        (["train.lr=-0.001"], "train.lr must be in \\(0, 10\\]"),
        (["train.label_smoothing=1.0"], "label_smoothing"),
        (["train.max_epochs=0"], "max_epochs must be >= 1"),
        (["train.precision=half"], "precision must be 'auto', 'bf16', 'tf32', 'fp16' or 'fp32'"),
        (["train.device=tpu"], "device must be"),
        (["data.pad_to_buckets=maybe"], "data.pad_to_buckets must be auto, true or false"),
        (["train.max_time=-1"], "max_time must be between 0 and"),
        (["train.cooldown=1.5"], "train.cooldown must be in \\[0, 1\\]"),
        (["train.optimizer=sgd"], "train.optimizer must be 'adam' or 'muon'"),
        (["train.muon_lr=0"], "train.muon_lr must be in \\(0, 10\\] or null"),
        (["train.muon_momentum=1"], "train.muon_momentum must be in \\[0, 1\\)"),
        (["train.muon_adjust_lr=none"], "muon_adjust_lr must be 'match_rms_adamw' or 'original'"),
        (["train.muon_ns_steps=0"], "train.muon_ns_steps must be in \\[1, 10\\]"),
        (["train.ema=1"], "train.ema must be in \\[0, 1\\)"),
        (["train.ema=-0.5"], "train.ema must be in \\[0, 1\\)"),
        (["train.keep_last=2", "train.average_last=3"], "average_last must be between 0 and"),
        (["data.max_tokens=10"], "max_tokens must be at least data.max_len"),
        (["data.max_len=600"], "must fit in model.max_positions"),
        (["data.spm_model_type=word"], "spm_model_type"),
        (["data.joint_vocab=false"], "set model.share_embeddings false too"),
        (["decode.beam=2", "decode.nbest=3"], "nbest must be between 1 and decode.beam"),
    ],
)
def test_absurd_values_are_rejected(overrides, match):
    one_line_error(overrides, match)


@pytest.mark.parametrize(
    "override",
    [
        "train.log_every=0",
        "train.patience=0",
        "train.max_steps=0",
        "train.threads=-1",
        "train.validate_every=-5",
        "train.lr=1.0e+38",
    ],
)
def test_more_absurd_values_are_rejected(override):
    one_line_error([override], override.split("=")[0])  # the message names the key


@pytest.mark.parametrize(
    "override",
    [
        "train.seed=-1",  # numpy's generators refuse it, after the store is written
        "train.seed=4294967296",
        "train.seed=18446744073709551616",
        "train.weight_decay=-1",  # torch's Adam refuses these two
        "train.betas=[2, 0.5]",
        "train.betas=[0.9, 1]",
        "train.max_time=1e307",  # minutes * 60 is infinite: NaN in the progress bar
        "train.threads=1025",  # SentencePiece's trainer refuses it
        "train.threads=2147483648",  # torch's too
        "train.valid_bleu_sentences=0",
        "train.attention_sentences=-1",
        "data.vocab_size=100000000000000000",  # SentencePiece's int
        "data.max_len=0",
        "data.carve_valid=-1",
        "decode.beam=1001",
    ],
)
def test_values_torch_numpy_or_the_os_would_refuse_are_refused_naming_the_key(override, tmp_path):
    refused_by_set_and_file(override, override.split("=")[0], tmp_path)


def test_every_seed_the_config_takes_seeds_every_rank():
    """``seed_ranks`` gives rank r the seed ``seed * 1_000_003 + r``: within manual_seed's
    64 bits for the largest seed the config takes, on a thousand ranks."""
    from seq2seq.config_checks import MAX_SEED
    from seq2seq.run.runtime import Runtime, seed_ranks

    seed = load_config(None, [f"train.seed={MAX_SEED}"]).train.seed
    state = torch.get_rng_state()
    try:
        for rank in (1, 999):
            seed_ranks(seed, Runtime(rank=rank, world=1000))
    finally:
        torch.set_rng_state(state)
    assert load_config(None, ["train.seed=0"]).train.seed == 0
    one_line_error([f"train.seed={MAX_SEED + 1}"], f"train.seed must be between 0 and {MAX_SEED}")
    with pytest.raises(Seq2SeqError, match="train.seed: expected a whole number"):
        config_from_dict({"train": {"seed": -1}})  # a Python caller's, read as the flag's


def test_a_negative_seed_is_refused_alike_by_the_flag_set_and_yaml(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  seed: -1\n")
    out = str(tmp_path / "run")
    for argv in (["--seed", "-1"], ["--set", "train.seed=-1"], ["--config", str(path)]):
        with contextlib.suppress(SystemExit):
            assert main(["train", "--out", out, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "expected a whole number of at most 18 ASCII digits, got '-1'" in err, argv
    assert not (tmp_path / "run").exists()


def test_cli_bad_config_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "seq2seq",
            "train",
            "--out",
            str(tmp_path / "run"),
            "--set",
            "model.nope=1",
        ],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [result.stderr.strip()]  # one line, no traceback
    assert result.stderr.startswith("error: config: unknown key 'model.nope'")
    assert not (tmp_path / "run").exists()  # nothing created before the config is checked


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("model: [1, 2\n", "is not valid YAML"),
        ("- 1\n- 2\n", "top level must be a mapping"),
        ("model:\n  d_model: 31\n", "d_model must be a positive multiple"),
        (None, "config file not found"),
    ],
)
def test_cli_bad_config_file(tmp_path, capsys, content, match):
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)
    assert main(["train", "--out", str(tmp_path / "run"), "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and match in err and err.count("\n") == 1


def test_the_default_dropout_rises_with_the_epochs_and_a_given_one_is_kept():
    from seq2seq.config import dropout_at

    default = load_config()
    start, end = default.train.dropout_epochs
    early, full = default.train.early_dropout, default.model.dropout
    assert early < full and start < end
    assert dropout_at(default, 0) == dropout_at(default, start) == early
    assert dropout_at(default, (start + end) / 2) == pytest.approx((early + full) / 2)
    assert dropout_at(default, end) == dropout_at(default, 10 * end) == full
    for given in (["model.dropout=0.3"], ["model.dropout=0.2", "train.threads=1"]):
        config = load_config(None, given)
        assert config.train.early_dropout is None
        assert dropout_at(config, 0) == dropout_at(config, 100) == config.model.dropout
    both = load_config(None, ["model.dropout=0.2", "train.early_dropout=0.0"])
    assert (dropout_at(both, 0), dropout_at(both, 100)) == (0.0, 0.2)
    with pytest.raises(Seq2SeqError, match="train.dropout_epochs"):
        load_config(None, ["train.dropout_epochs=[4,2]"])
    with pytest.raises(Seq2SeqError, match="train.early_dropout"):
        load_config(None, ["train.early_dropout=1.5"])


def test_a_given_dropout_holds_from_the_first_step_with_or_without_a_config_file(tmp_path):
    from seq2seq.config import dropout_at
    from seq2seq.run.checkpoint import save_config

    save_config(tmp_path, load_config())  # a run's config.yaml: it schedules the dropout
    saved = tmp_path / "config.yaml"
    assert dropout_at(load_config(saved), 0) == load_config().train.early_dropout  # as saved
    for path in (None, saved):
        config = load_config(path, ["model.dropout=0.2"])
        assert (dropout_at(config, 0), dropout_at(config, 100)) == (0.2, 0.2), path
        both = load_config(path, ["model.dropout=0.2", "train.early_dropout=0.05"])
        assert (dropout_at(both, 0), dropout_at(both, 100)) == (0.05, 0.2), path
    alone = tmp_path / "alone.yaml"
    alone.write_text("model:\n  dropout: 0.2\n")  # a file's dropout alone holds too
    assert dropout_at(load_config(alone), 0) == 0.2
    assert dropout_at(load_config(alone, ["train.early_dropout=0.05"]), 0) == 0.05


def test_a_given_step_budget_is_the_budget_with_or_without_a_config_file(tmp_path):
    from seq2seq.run.checkpoint import save_config

    save_config(tmp_path, load_config())  # a run's config.yaml: it holds the 30-minute budget
    saved = tmp_path / "config.yaml"
    assert load_config(saved).train.max_time == load_config().train.max_time == 30
    for path in (None, saved):
        config = load_config(path, ["train.max_steps=5000"])
        assert (config.train.max_steps, config.train.max_time) == (5000, None), path
        epochs = load_config(path, ["train.max_epochs=3"])
        assert epochs.train.max_time is None, path
        both = load_config(path, ["train.max_steps=5000", "train.max_time=60"])
        assert (both.train.max_steps, both.train.max_time) == (5000, 60), path
    alone = tmp_path / "alone.yaml"
    alone.write_text("train:\n  max_steps: 800\n")  # a file's step budget alone holds too
    assert load_config(alone).train.max_time is None
    assert load_config(alone, ["train.max_time=10"]).train.max_time == 10
    timed = tmp_path / "timed.yaml"
    timed.write_text("train:\n  max_time: 45\n")  # a file's time budget, nothing on the line
    assert load_config(timed).train.max_time == 45


def test_subword_regularisation_is_off_by_default_and_follows_its_epochs():
    from seq2seq.config import subword_alpha_at

    assert all(subword_alpha_at(load_config(), epoch) == 0.0 for epoch in range(50))
    ramp = load_config(None, ["data.subword_alpha=0.1", "data.subword_epochs=[2,4]"])
    # each epoch at its middle: off through epoch 1, a quarter and three quarters, then full
    strengths = [subword_alpha_at(ramp, epoch) for epoch in range(6)]
    assert strengths == pytest.approx([0.0, 0.0, 0.025, 0.075, 0.1, 0.1])
    always = load_config(None, ["data.subword_alpha=0.1", "data.subword_epochs=[0,0]"])
    assert subword_alpha_at(always, 0) == 0.1


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["data.subword_alpha=1.0"], "data.subword_alpha must be in"),
        (["data.subword_alpha=-0.1"], "data.subword_alpha must be in"),
        (["data.subword_epochs=[3,1]"], "data.subword_epochs must be two epochs"),
        (["data.subword_epochs=3"], "config data.subword_epochs: expected a list"),
        (["data.subword_alpha=0.1", "data.spm_model_type=unigram"], "needs data.spm_model_type"),
    ],
)
def test_bad_subword_settings_are_one_line_errors(overrides, match):
    one_line_error(overrides, match)


@pytest.mark.parametrize("typed", ["010", "1_000", "0x1F", "0b11", "1:30", "+5", "1e3", "١٠"])
def test_set_and_yaml_read_a_number_as_its_flag_does(typed, tmp_path, capsys):
    """``--max-steps`` reads ASCII digits alone; so do ``--set train.max_steps`` and a file's
    ``max_steps`` (YAML 1.1 read 010 as 8, 1:30 as 90, 0x1F as 31)."""
    from seq2seq.commands.cli import build_parser, config_flags

    try:
        args = build_parser().parse_args(["train", "--out", "run", "--max-steps", typed])
    except SystemExit:
        by_flag = None
    else:
        by_flag = load_config(None, [], config_flags(args)).train.max_steps
    capsys.readouterr()
    path = tmp_path / "run.yaml"
    path.write_text(f"train:\n  max_steps: {typed}\n", encoding="utf-8")
    for read in (
        lambda: load_config(None, [f"train.max_steps={typed}"]),
        lambda: load_config(path),
    ):
        if by_flag is None:
            with pytest.raises(Seq2SeqError, match="train.max_steps: expected a whole number"):
                read()
        else:
            assert read().train.max_steps == by_flag == int(typed)


@pytest.mark.parametrize("text", ["no", "2016", "corpus #2", "off", "null", "~", "1e3", "0x1F"])
def test_a_string_field_keeps_the_text_typed_from_a_flag_set_and_yaml(text, tmp_path):
    from seq2seq.commands.cli import build_parser, config_flags

    args = build_parser().parse_args(["data", "--data", text, "--src", text, "--tgt", "en"])
    flagged = load_config(None, [], config_flags(args)).data
    assert (flagged.data, flagged.src) == (text, text)  # a flag is a value, never YAML
    if text in ("null", "~"):  # --set's and YAML's null alone
        return
    assert load_config(None, [f"data.data={text}", f"data.src={text}"]).data.src == text
    assert load_config(None, [f"data.data={text}"]).data.data == text
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"data": {"data": text, "src": text}}), encoding="utf-8")
    assert load_config(path).data.data == text
    path.write_text(f"data:\n  src: {text}\n  data: '{text}'\n", encoding="utf-8")  # unquoted
    assert load_config(path).data.src == text.split(" #")[0]  # YAML's comment, in a file


def test_a_norwegian_corpus_in_a_folder_named_by_a_year_prepares(tmp_path, capsys):
    """``--src no`` was YAML 1.1's false, ``2016`` an integer and `` #2`` a comment."""
    folder = tmp_path / "2016 #2"
    folder.mkdir()
    sample = REPO / "data" / "sample"
    for split in ("train", "valid", "test"):
        (folder / f"{split}.no").write_bytes((sample / f"{split}.de").read_bytes())
        (folder / f"{split}.en").write_bytes((sample / f"{split}.en").read_bytes())
    argv = ["data", "--data", str(folder), "--src", "no", "--tgt", "en", "--vocab-size", "200"]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "no-en" in out and "train" in out
