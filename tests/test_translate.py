"""Translation: input order under token batching, streaming in chunks, bad input (empty,
over-long, invalid UTF-8, broken run directory), --ban-eos lengths, and the ``translate``
command end to end on a tiny model trained here."""

import copy
import io
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fakes import FakeCuda
from helpers import child_env, tiny_run_dir

from seq2seq.commands.cli import main
from seq2seq.config import DecodeConfig
from seq2seq.data.batching import batches_of, collate
from seq2seq.decoding.search import Hypothesis, beam_search, greedy_search, max_output_length
from seq2seq.decoding.translate import (
    Translator,
    format_translations,
    translate_ids,
    translate_ids_nbest,
)
from seq2seq.errors import Seq2SeqError
from seq2seq.run.precision import tf32_in_force

REPO_ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [
    "Ein Hund läuft über die Wiese.",
    "",
    "Zwei Kinder spielen im Sand.",
    "Eine Frau liest ein Buch im Park, während ein Mann neben ihr schläft.",
    "   ",
    "\u200b\ufeff\x01\x7f",  # not blank, but every character is one the tokenizer drops
    "Hund",
    "Ein kleiner Junge mit einem roten Hut spielt Fußball.",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_run(run_dir)


def texts(results):
    return [hyps[0].text for hyps in results]


def test_order_kept_under_token_batching_with_empty_lines(translator):
    ids = [x for x in translator.tokenizer.encode_batch(SENTENCES, "src") if x]
    assert len(batches_of(ids, None, 24)) >= 3  # several batches, sorted by length
    batched = translator.translate(SENTENCES, DecodeConfig(max_tokens=24))
    alone = [translator.translate([line], DecodeConfig())[0] for line in SENTENCES]
    assert [h[0].tokens for h in batched] == [h[0].tokens for h in alone]
    assert texts(batched) == [h[0].text for h in alone]
    for line, hyps in zip(SENTENCES, batched, strict=True):
        if not translator.tokenizer.encode(line, "src"):
            assert hyps[0].text == "" and hyps[0].stop_reason == "empty"
        else:
            assert hyps[0].stop_reason in ("eos", "max_len")


def test_translate_ids_gives_each_sources_best_hypothesis_in_input_order(translator):
    model, limit = translator.model, translator.max_src_len
    ids = [x[:limit] for x in translator.tokenizer.encode_batch(SENTENCES, "src") if x]
    cpu = torch.device("cpu")
    assert len(batches_of(ids, None, 24)) >= 3
    greedy = translate_ids(model, ids, DecodeConfig(max_tokens=24), device=cpu)
    alone = [greedy_search(model, collate([x], None).src)[0] for x in ids]
    assert [h.tokens for h in greedy] == [h.tokens for h in alone]
    assert [h.score for h in greedy] == pytest.approx([h.score for h in alone], abs=1e-4)

    decode = DecodeConfig(beam=3, nbest=3, max_tokens=24)
    nbest = translate_ids_nbest(model, ids, decode, device=cpu, need_weights=True)
    best = translate_ids(model, ids, decode, device=cpu)
    for x, hyps, hyp in zip(ids, nbest, best, strict=True):
        assert len(hyps) == 3 and hyps[0].tokens == hyp.tokens
        assert hyps[0].attention.shape[-1] == len(x) + 1  # source subwords and EOS
        assert hyps[0].tokens == beam_search(model, collate([x], None).src, decode)[0][0].tokens


def test_decode_overrides_keep_what_is_not_given():
    run = DecodeConfig(beam=4, length_penalty=0.6, max_tokens=100)
    decode = run.with_overrides(beam=None, nbest=2, length_penalty=None, ban_eos=True)
    assert decode == DecodeConfig(beam=4, nbest=2, length_penalty=0.6, max_tokens=100, ban_eos=True)
    assert run.nbest == 1
    with pytest.raises(Seq2SeqError, match="decode.nbest must be between 1 and decode.beam"):
        run.with_overrides(nbest=5)
    with pytest.raises(Seq2SeqError, match="decode.length_penalty must be between -10 and 10"):
        run.with_overrides(length_penalty=float("nan"))  # a library caller's, not parsed


def test_a_length_rule_beyond_a_float_stops_at_the_model_positions(run_dir, capsys):
    assert main(["translate", str(run_dir), "--beam", "2", "--max-len-a", "1e308", "Hallo"]) == 0
    assert capsys.readouterr().out.count("\n") == 1


def test_a_beam_past_its_cap_is_one_line_and_exit_2_not_an_allocation(run_dir, capsys):
    assert main(["translate", str(run_dir), "--beam", "999999999999999999", "Hallo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "decode.beam must be between 1 (greedy) and 1000" in err
    assert main(["translate", str(run_dir), "--beam", "1000", "Hallo"]) == 0  # the cap decodes


def test_stream_writes_each_chunk_before_reading_on(translator):
    lines = SENTENCES * 2
    consumed = []

    def source():
        for n, line in enumerate(lines, start=1):
            consumed.append(n)
            yield line

    class Out(io.StringIO):
        def __init__(self):
            super().__init__()
            self.read_at_flush = []

        def flush(self):
            self.read_at_flush.append(len(consumed))

    out = Out()
    n = translator.translate_stream(source(), out, DecodeConfig(max_tokens=24), chunk_lines=3)
    assert n == len(lines)
    assert out.read_at_flush == [*range(3, len(lines), 3), len(lines)]  # a chunk at a time
    expected = format_translations(translator.translate(lines, DecodeConfig()), 0, False)
    assert out.getvalue() == expected
    assert out.getvalue().count("\n") == len(lines)


@pytest.mark.parametrize("beam", [1, 3])
def test_ban_eos_runs_every_output_to_max_len(translator, beam):
    decode = DecodeConfig(beam=beam, ban_eos=True, max_len_a=0.5, max_len_b=3, max_tokens=24)
    results = translator.translate(SENTENCES, decode)
    for line, hyps in zip(SENTENCES, results, strict=True):
        if not line.strip() or hyps[0].src_len == 0:  # blank, or no subwords: nothing to decode
            assert hyps[0].stop_reason == "empty"
            continue
        max_len = max_output_length(hyps[0].src_len, 0.5, 3, translator.model.config.max_positions)
        assert len(hyps[0].tokens) == max_len
        assert hyps[0].stop_reason == "max_len"


def test_over_long_line_is_cut_with_one_warning(translator, capsys):
    long_line = " ".join(["Hund Katze Wiese"] * 40)
    results = translator.translate(["Hund", long_line, ""], first_line=5)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "line 6:" in err
    assert results[1][0].truncated and results[1][0].src_len == translator.max_src_len + 1
    assert not results[0][0].truncated


def test_cli_translate_arguments(run_dir, translator, capsys):
    assert main(["translate", str(run_dir), SENTENCES[0], "", SENTENCES[2]]) == 0
    out = capsys.readouterr().out
    expected = texts(translator.translate([SENTENCES[0], "", SENTENCES[2]]))
    assert out.split("\n")[:-1] == expected and expected[1] == ""


def test_cli_verbose_reports_what_the_decoder_saw(run_dir, capsys):
    assert main(["translate", str(run_dir), "--verbose", SENTENCES[0], SENTENCES[3]]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 2
    reports = [line for line in captured.err.splitlines() if line.startswith("line ")]
    assert len(reports) == 2
    for report in reports:
        tk = int(re.search(r"Tk=(\d+)", report).group(1))
        n_out = int(re.search(r"output (\d+) subwords", report).group(1))
        eos = "+ EOS" in report
        assert ("stop eos" in report) == eos
        shapes = re.findall(r"\[(\d+), (\d+)\]", report)
        assert len(shapes) == 1  # one decoder layer
        assert [(int(q), int(k)) for q, k in shapes] == [(n_out + eos, tk)]
    assert main(["translate", str(run_dir), "--verbose", "\u200b"]) == 0
    assert "line 1: no subwords (empty, or characters the tokenizer drops), not translated" in (
        capsys.readouterr().err
    )


def test_cli_input_output_files_with_invalid_utf8(run_dir, translator, tmp_path, capsys):
    src = tmp_path / "in.de"
    src.write_bytes(b"Ein Hund\n\xff\xfe kaputt \xc3\n\nZwei Kinder\r\n\xffnochmal\n")
    out = tmp_path / "out.en"
    assert main(["translate", str(run_dir), "-i", str(src), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("invalid UTF-8") == 1 and "line 2:" in err
    lines = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 5 and lines[2] == ""
    assert lines[0] == texts(translator.translate(["Ein Hund"]))[0]
    assert lines[3] == texts(translator.translate(["Zwei Kinder"]))[0]


def test_cli_stdin(run_dir, translator, monkeypatch, capsys):
    data = "\n".join(SENTENCES) + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data.encode())))
    assert main(["translate", str(run_dir), "--max-tokens", "24"]) == 0
    assert capsys.readouterr().out.split("\n")[:-1] == texts(translator.translate(SENTENCES))


def test_cli_nbest_format(run_dir, capsys):
    assert main(["translate", str(run_dir), "--beam", "3", "--nbest", "2", SENTENCES[0], ""]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = [line.split(" ||| ") for line in lines]
    assert all(len(f) == 3 for f in fields)
    assert [f[0] for f in fields] == ["0", "0", "1"]  # the empty line: one empty hypothesis
    assert float(fields[0][1]) >= float(fields[1][1])
    assert fields[2][2] == ""


@pytest.mark.parametrize(
    "args",
    [
        ["translate", "no/such/run", "Hallo"],
        ["translate", "{run}", "--nbest", "2", "Hallo"],
        ["translate", "{run}", "-i", "no/such/file.txt"],
        ["translate", "{broken}", "Hallo"],
        ["translate", "{run}", "--beam", "2", "--length-penalty", "1e6", "Hallo"],  # overflows
    ],
)
def test_cli_errors_are_one_line(run_dir, tmp_path, capsys, args):
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    args = [a.format(run=run_dir, broken=broken) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_console_interactive_prompt(run_dir, translator):
    """The real console path: ``python -m seq2seq`` with a terminal on standard input."""
    leader, follower = pty.openpty()
    env = child_env(PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq", "translate", str(run_dir), "--device", "cpu"],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(follower)
    os.write(leader, f"{SENTENCES[0]}\n\n{SENTENCES[2]}\n".encode() + b"\x04")
    out, err = proc.communicate(timeout=120)
    os.close(leader)
    assert proc.returncode == 0, err.decode()
    expected = texts(translator.translate([SENTENCES[0], "", SENTENCES[2]]))
    assert out.decode().split("\n")[:-1] == expected
    assert err.decode().count("> ") == 4  # one per line, and the one Ctrl-D answered


class Terminal(io.StringIO):
    """A standard error that says it is a terminal, so a progress bar draws into it."""

    def isatty(self):
        return True


@pytest.mark.parametrize("no_progress", [False, True])
def test_progress_bar_on_terminal_stderr_never_on_stdout(
    run_dir, translator, tmp_path, monkeypatch, capsys, no_progress
):
    lines = [s for s in SENTENCES if len(s) < 60] * 30  # none cut, so no warnings
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in lines))
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    args = ["translate", str(run_dir), "-i", str(source), "--max-tokens", "64", "--device", "cpu"]
    assert main(args + ["--no-progress"] * no_progress) == 0
    out = capsys.readouterr().out
    assert out.split("\n")[:-1] == texts(
        translator.translate(lines)
    )  # same outputs, batch by batch
    drawn = terminal.getvalue()
    if no_progress:
        assert drawn == ""
    else:
        assert f"/{len(lines)}" in drawn and "sent/s" in drawn and "\r" in drawn


def test_no_progress_bar_when_stderr_is_not_a_terminal(run_dir, tmp_path, capsys):
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in SENTENCES[:3] * 10))
    assert main(["translate", str(run_dir), "-i", str(source), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "\r" not in captured.out


def test_progress_reports_sentences_and_tokens_per_second(monkeypatch):
    from seq2seq.decoding.translate import DecodeProgress

    monkeypatch.setattr(sys, "stderr", Terminal())
    progress = DecodeProgress(total=100)
    progress.update(40, 600)
    progress.bar.refresh()
    assert progress.bar.n == 40 and "tok/s" in sys.stderr.getvalue()
    progress.close()
    assert not DecodeProgress(total=100, enabled=False).bar.n


def test_a_translator_decodes_on_cuda_in_the_precision_its_run_validated_with(
    translator, monkeypatch, tf32_switch
):
    """Validation of a run on CUDA decodes with TF32 as its precision says: so does a
    Translator of the run, inside its calls alone, whatever engine replaces ``_search`` (as
    seq2seq.decoding.export's does)."""
    FakeCuda(count=1).install(monkeypatch)
    gpu, seen = torch.device("cuda:0"), []

    class Engine(Translator):
        def _search(self, src_ids, decode, need_weights):
            seen.append(tf32_in_force(self.device))
            return [[Hypothesis(ids[:1], 0.0, "eos", normalized_score=0.0)] for ids in src_ids]

    for precision, tf32 in (("tf32", True), ("auto", True), ("fp32", False)):
        config = copy.deepcopy(translator.config)
        config.train.precision = precision
        seen.clear()
        tf32_switch.fp32_precision = "none"
        Engine(config, translator.tokenizer, translator.model, gpu).translate(["Ein Hund."])
        assert seen == [tf32] and tf32_switch.fp32_precision == "none", precision
