"""Every value a user can type, drawn: each config field at, around and past its bounds and of
the wrong type, from Python, YAML and ``--set``; each command's options as any string. Each is
refused in one line (by validation, or by argparse with exit 2) or it works: a config field's
accepted value trains a tiny model one step on the sample corpus, an option's parsed value
builds the config or decoding settings its command runs with."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import tempfile
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_train import tiny_config

from seq2seq.commands import decode
from seq2seq.commands.cli import build_parser, config_flags
from seq2seq.config import Config, DecodeConfig, config_from_dict, load_config
from seq2seq.config_checks import MAX_MINUTES, MAX_SEED, MAX_THREADS
from seq2seq.errors import Seq2SeqError
from seq2seq.training.entry import train


def fields() -> list[tuple[str, str, object]]:
    """(section, name, annotation) of every config field."""
    found = []
    for section in dataclasses.fields(Config):
        cls = section.default_factory
        hints = typing.get_type_hints(cls)
        found += [(section.name, f.name, hints[f.name]) for f in dataclasses.fields(cls)]
    return found


FIELDS = fields()
KEYS = [f"{section}.{name}" for section, name, _ in FIELDS]

# Around every bound in config_checks and DecodeConfig.check, and past what a C int, a
# 64-bit seed, a float or 18 digits hold.
INTS = [-1, 0, 1, 2, 7, 8, 9, 63, 64, 65, 999, 1000, 1001, MAX_THREADS, MAX_THREADS + 1]
INTS += [16384, 16385, 65535, 65536, 65537, 10**6, 10**6 + 1, 2**31, MAX_SEED, MAX_SEED + 1]
INTS += [2**63, 2**64, 10**18 - 1, 10**18, 10**30]
FLOATS = [-math.inf, -1e300, -10.0001, -10.0, -1.0, -1e-300, -0.0, 0.0, 1e-300, 1e-8, 0.1]
FLOATS += [0.5, 0.9999999, 1.0, 1.0000001, 1.5, 10.0, 10.000001, float(MAX_MINUTES)]
FLOATS += [MAX_MINUTES + 0.5, 1e307, 1.7e308, math.inf, math.nan]
WORDS = ["auto", "all", "cpu", "cuda", "cuda:0", "cuda:99999999999999999999", "mps", "tpu"]
WORDS += ["bf16", "tf32", "fp32", "fp16", "bpe", "unigram", "word", "true", "false", "yes", "adam"]
WORDS += [
    "no",
    "null",
    "~",
    "",
    "1,2",
    "en,fr",
    "1,1",
    "2016",
    "010",
    "0x1F",
    "1_000",
    "1:30",
    "muon",
]
WORDS += [".nan", ".inf", "1e3", "-1", "[0.9, 0.98]", "[2, 0.5]", "[]", "{}", "a: b", "#", "٤"]

numbers = st.one_of(
    st.sampled_from(INTS), st.integers(), st.sampled_from(FLOATS), st.floats(width=64)
)
scalars = st.one_of(numbers, st.booleans(), st.none(), st.sampled_from(WORDS), st.text(max_size=12))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.just({}))


def refused_in_one_line(build: typing.Callable[[], object]) -> object | None:
    """What ``build`` returns, or None where it raised a one-line Seq2SeqError."""
    try:
        return build()
    except Seq2SeqError as e:
        assert "\n" not in str(e), str(e)
        return None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(FIELDS), values), min_size=1, max_size=3))
def test_every_field_takes_a_value_or_refuses_it_in_one_line(drawn):
    """From Python and from a YAML file alike; an accepted value is of its field's type."""
    given_values: dict = {}
    for (section, name, _), value in drawn:
        given_values.setdefault(section, {})[name] = value
    config = refused_in_one_line(lambda: config_from_dict(given_values))
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "run.yaml"
        path.write_text(yaml.safe_dump(given_values), encoding="utf-8")
        from_file = refused_in_one_line(lambda: load_config(path))
    if config is None:
        return
    assert from_file is not None  # what Python takes, a file holding it takes
    for (section, name, annotation), _ in drawn:
        value = getattr(getattr(config, section), name)
        origin = typing.get_origin(annotation)
        expected = tuple if origin is tuple else typing.get_args(annotation) or annotation
        assert value is None or isinstance(value, expected)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(KEYS), st.one_of(st.sampled_from(WORDS), st.text(max_size=20), numbers))
def test_every_field_reads_set_text_or_refuses_it_in_one_line(key, typed):
    text = typed if isinstance(typed, str) else repr(typed)
    refused_in_one_line(lambda: load_config(None, [f"{key}={text}"]))


# The fields a tiny run can try at every value validation takes: not the model's sizes, the
# corpus's names, the device, the threads or torch.compile (each a run of its own kind),
# nor data.max_len (below the sample's longest pair nothing is left to train on).
UNTRIED = {"max_len", "max_steps", "threads", "device", "compile", "data", "src", "tgt"}
UNTRIED |= {"test_split", "columns", "max_positions", "src_vocab_size", "tgt_vocab_size"}
UNTRIED |= {"d_model", "n_heads", "n_kv_heads", "d_ff", "n_enc_layers", "n_dec_layers"}
TRIED = [(s, n, a) for s, n, a in FIELDS if n not in UNTRIED or s == "decode"]


def near_bounds(field: tuple[str, str, object]) -> st.SearchStrategy:
    """``field`` and a value of its type from around the bounds."""
    annotation = field[2]
    kinds = set(typing.get_args(annotation)) | {annotation}
    drawn = [st.just(None)] if type(None) in kinds else []
    if typing.get_origin(annotation) is tuple:
        drawn.append(st.lists(st.sampled_from(FLOATS), min_size=2, max_size=2))
    drawn += [st.sampled_from(INTS)] if int in kinds else []
    drawn += [st.sampled_from(FLOATS)] if float in kinds else []
    drawn += [st.booleans()] if bool in kinds else []
    drawn += [st.sampled_from(WORDS)] if str in kinds else []
    return st.tuples(st.just(field), st.one_of(drawn))


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(st.sampled_from(TRIED).flatmap(near_bounds))
def test_a_value_validation_takes_trains_a_step(drawn):
    (section, name, _), value = drawn
    key = f"{section}__{name}"
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True)
    text = text.removesuffix("\n...\n").strip()
    config = refused_in_one_line(lambda: tiny_config(train__max_steps=1, **{key: text}))
    assume(config is not None)
    with tempfile.TemporaryDirectory() as run:
        state = train(config, run, progress=False)
    assert state["step"] == 1


def filler(command: str) -> list[str]:
    """What ``command`` needs besides the option drawn."""
    return {
        "train": ["--out", "RUN"],
        "export": ["RUN", "-o", "OUT"],
        "data": [],
        "plot": ["RUN"],
    }.get(command, ["RUN"])


def options() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (command, action)
        for command, sub in commands.choices.items()
        for action in sub._actions
        if action.option_strings and action.nargs is None and action.dest != "help"
    ]


def usable(args: argparse.Namespace) -> None:
    """What the command makes of its options before it reads a run or a corpus."""
    if args.command in ("train", "data"):
        with contextlib.suppress(OSError):  # --config naming a folder: main's one line
            load_config(args.config, args.overrides, config_flags(args))
    elif args.command in ("translate", "evaluate"):
        DecodeConfig().with_overrides(**decode.decode_overrides(args))


# What a POSIX argv can hold, as Python reads it: no NUL, and of the lone surrogates only
# surrogateescape's U+DC80..U+DCFF, which stand for bytes that are not UTF-8.
ARGV_CHARACTERS = st.one_of(
    st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
    st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(options()),
    st.one_of(
        st.sampled_from(WORDS),
        st.text(ARGV_CHARACTERS, max_size=20),
        numbers.map(repr),
        st.sampled_from(KEYS).flatmap(
            lambda k: st.text(ARGV_CHARACTERS, max_size=8).map(lambda t: f"{k}={t}")
        ),
    ),
)
def test_every_option_parses_to_a_usable_value_or_exits_2_in_one_line(option, text):
    command, action = option
    argv = [command, *filler(command), f"{action.option_strings[0]}={text}"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit as exited:
        assert exited.code == 2 and "Traceback" not in err.getvalue()  # usage, then one line:
        assert err.getvalue().strip().split("\n")[-1].startswith(f"seq2seq {command}: error:")
        return
    refused_in_one_line(lambda: usable(args))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "RUN", "--port", "65536"], "expected a port from 0 to 65535"),
        (["serve", "RUN", "--deadline", "0"], "expected a number of seconds above 0"),
        (["serve", "RUN", "--deadline", "1e300"], "expected a number of seconds above 0"),
    ],
)
def test_a_serve_option_a_socket_or_a_timer_would_refuse_exits_2_before_the_run_loads(
    argv, message, capsys
):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2 and message in capsys.readouterr().err
