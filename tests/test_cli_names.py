"""One name per meaning across commands, the renamed options' old spellings still work, and
every number an option takes is ASCII digits (a float also finite)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from seq2seq.commands import decode
from seq2seq.commands.cli import build_parser, main
from seq2seq.commands.options import finite_number_arg

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"


def _commands() -> tuple[str, ...]:
    """Every subcommand the parser has, so that a new one is checked without being listed."""
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return tuple(sub.choices)


COMMANDS = _commands()


def shown_options(command: str, capsys: pytest.CaptureFixture) -> set[str]:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return set(re.findall(r"--[a-z][a-z0-9-]*", capsys.readouterr().out))


def test_each_length_and_batch_option_has_one_meaning_across_commands(capsys):
    shown = {command: shown_options(command, capsys) for command in COMMANDS}
    # --max-len caps an output's length (attention; serve's form field has the same name);
    # dropping training pairs by length is --max-train-len; tokens per batch is --max-tokens.
    assert {c for c, options in shown.items() if "--max-len" in options} == {"attention"}
    assert {c for c, options in shown.items() if "--max-train-len" in options} == {"data"}
    batches = {c for c, options in shown.items() if "--max-tokens" in options}
    assert batches == {"data", "translate", "evaluate"}
    assert not any("--batch-tokens" in options for options in shown.values())


@pytest.mark.parametrize("command", ["translate", "evaluate"])
@pytest.mark.parametrize("spelling", ["--max-tokens", "--batch-tokens"])
def test_decoding_batches_are_max_tokens_and_the_old_spelling_still_works(
    command, spelling, capsys
):
    args = build_parser().parse_args([command, "RUN", spelling, "24"])
    assert decode.decode_overrides(args)["max_tokens"] == 24
    deprecated = "note: --batch-tokens is deprecated; use --max-tokens" in capsys.readouterr().err
    assert deprecated == (spelling == "--batch-tokens")


def test_data_drops_training_pairs_by_max_train_len_and_the_old_spelling_still_works(capsys):
    outputs = {}
    for spelling in ("--max-train-len", "--max-len"):
        assert main(["data", "--data", str(SAMPLE), spelling, "36"]) == 0
        captured = capsys.readouterr()
        outputs[spelling] = captured.out
        deprecated = "note: --max-len is deprecated; use --max-train-len" in captured.err
        assert deprecated == (spelling == "--max-len")
    dropped = re.search(
        r"dropped: train: (\d+) longer than 36 subwords \(limit 36 subwords", outputs["--max-len"]
    )
    assert dropped and 0 < int(dropped.group(1)) < 40  # some of the 40 training pairs
    assert outputs["--max-len"] == outputs["--max-train-len"]


TRAIN = ["--out", "{out}", "--data", "no/such/corpus"]  # a number taken would fail fast


def numeric_options() -> list[tuple[str, argparse.Action]]:
    """(command, option) for every option of every command that reads a number, found by what
    its type makes of "4"."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for command, sub in commands.choices.items():
        for action in sub._actions:
            try:
                value = action.type("4") if action.option_strings and action.type else None
            except argparse.ArgumentTypeError:
                continue
            if isinstance(value, (int, float)):
                found.append((command, action))
    return found


def test_every_numeric_option_takes_ascii_digits_and_finite_numbers_only():
    options = numeric_options()
    named = {(command, action.option_strings[0]) for command, action in options}
    assert {("translate", "--beam"), ("train", "--max-time"), ("serve", "--port")} <= named
    assert len(named) >= 20  # every command's, old spellings included
    for _, action in options:
        for text in ("\u0664", "\u00b2", "1_0", " 4"):  # int() and float() take all but "²"
            with pytest.raises(argparse.ArgumentTypeError):  # argparse: one line, exit 2
                action.type(text)
        if isinstance(action.type("4"), float):
            if action.type is finite_number_arg:  # not --deadline, which is above 0
                assert action.type("-2.5e-1") == -0.25
            for text in ("nan", "inf", "-inf", "1e999", "\u0660.\u0665"):
                with pytest.raises(argparse.ArgumentTypeError, match="a finite number"):
                    action.type(text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["translate", "RUN", "--beam", "\u0664", "Ein Hund"], "--beam: expected a whole number"),
        (["train", *TRAIN, "--max-steps", "\u0665\u0660"], "--max-steps: expected a whole"),
        (["serve", "RUN", "--port", "\u0668\u0660\u0668\u0660"], "--port: expected a whole"),
        (["train", *TRAIN, "--max-time", "\u0660.\u0665"], "--max-time: expected a finite"),
        (
            ["translate", "RUN", "--beam", "2", "--length-penalty", "nan", "Ein Hund"],
            "--length-penalty: expected a finite number in ASCII digits, got 'nan'",
        ),
        (
            ["evaluate", "RUN", "--beam", "2", "--length-penalty", "nan", "--split", "test"],
            "--length-penalty: expected a finite number in ASCII digits, got 'nan'",
        ),
        (["translate", "RUN", "--max-len-a", "inf", "Ein Hund"], "--max-len-a: expected a finite"),
        (["translate", "RUN", "--max-len-a", "nan", "Ein Hund"], "--max-len-a: expected a finite"),
        (["serve", "RUN", "--deadline", "inf"], "--deadline: expected a finite number"),
    ],
)
def test_a_bad_number_is_refused_naming_the_option_and_the_value(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "run") if a == "{out}" else a for a in argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err
    assert message in err.strip().splitlines()[-1]


def test_threads_is_one_option_of_every_command_that_takes_a_device(capsys):
    shown = {command: shown_options(command, capsys) for command in COMMANDS}
    with_device = {c for c, options in shown.items() if "--device" in options}
    assert {"train", "translate", "evaluate", "attention", "serve", "align"} <= with_device
    assert with_device == {c for c, options in shown.items() if "--threads" in options}


def test_train_threads_is_the_config_value_train_threads():
    from seq2seq.commands.cli import config_flags

    args = build_parser().parse_args(["train", "--out", "RUN", "--threads", "3"])
    assert config_flags(args)["train.threads"] == 3
    args = build_parser().parse_args(["train", "--out", "RUN"])
    assert config_flags(args)["train.threads"] is None  # the config's, or the default


@pytest.mark.parametrize("text", ["0", "1025", "-1", "two"])
def test_threads_out_of_range_is_refused_in_one_line(text, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["translate", "RUN", "--threads", text, "Ein Hund"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err
    assert "--threads" in err.strip().splitlines()[-1]


def test_translate_threads_sets_torchs_threads_before_it_decodes(tmp_path_factory):
    import torch
    from helpers import tiny_run_dir

    run = str(tiny_run_dir(tmp_path_factory))
    before = torch.get_num_threads()
    try:
        assert main(["translate", run, "ein Hund", "--device", "cpu", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
