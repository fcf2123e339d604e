"""One name per meaning across commands, and the renamed options' old spellings still work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seq2seq.commands import decode
from seq2seq.commands.cli import build_parser, main

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample"
COMMANDS = ("data", "train", "average", "plot", "translate", "evaluate", "attention", "serve")


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
    assert decode._decode_overrides(args)["max_tokens"] == 24
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
