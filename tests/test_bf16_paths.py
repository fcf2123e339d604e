"""Under bf16 every way of decoding a sentence finds the same output: plain ``translate``,
``translate --verbose`` (whose search also returns the attention weights), ``seq2seq
attention`` (the explorer's data) and the served page, greedy and beam; a sentence alone and
inside a batch of other lengths, as ``translate -i`` and ``evaluate`` decode it; and the
explorer's step-through, a teacher-forced pass of its own, shows the distributions the search
chose from. bf16 is forced (the precision module's support check says yes; a CPU without native
bf16 still runs it, emulated), and the run is trained in bf16 too, briefly."""

import contextlib
import io
import json
import math
import re
from urllib.parse import urlencode

import pytest
import torch
from helpers import train_sample_run
from test_serve import post, running

from seq2seq.commands.cli import main
from seq2seq.decoding.translate import Translator
from seq2seq.run import precision

SENTENCES = [
    "Eine Katze spielt mit einem Ball.",
    "Ein Mann sitzt im Café.",
    "Zwei Frauen gehen spazieren.",
    "Ein Mädchen liest ein Buch.",
    "Der Hund läuft am Strand.",
    "Ein Kind trinkt Wasser.",
]
BEAMS = [1, 4]
# Shorter and longer than SENTENCES (24 to 34 subwords of the sample model: 10, 53, 54): a
# batch of them all pads every sentence.
OTHER_LENGTHS = [
    "Ein Hund.",
    "Eine Frau mit einem Hut verkauft Obst auf dem Markt.",
    "Eine Gruppe von Menschen wartet im Regen auf den Bus.",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 1+2-layer run trained 150 steps in bf16; bf16 stays forced for the module's tests."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precision, "native_bf16", lambda device: True)
        run = tmp_path_factory.mktemp("bf16") / "run"
        with contextlib.redirect_stdout(io.StringIO()):
            train_sample_run(
                run, steps=150, validate_every=150, lr=3e-3, n_dec_layers=2, max_epochs=150,
                precision="bf16",
            )  # fmt: skip
        assert Translator.from_run(run, "cpu").dtype == torch.bfloat16  # the forcing took
        yield run


def translate_cli(run_dir, capsys, sentence: str, beam: int, *options: str) -> str:
    nbest = ["--nbest", str(beam)] if beam > 1 else []  # with the scores the search ranked by
    args = ["translate", str(run_dir), sentence, "--beam", str(beam), *nbest, *options]
    assert main([*args, "--device", "cpu"]) == 0
    return capsys.readouterr().out


def plain_hypotheses(run_dir, beam: int) -> list[list[tuple[str, float]]]:
    """What plain ``translate`` finds for each sentence, alone: (text, normalized score)."""
    translator = Translator.from_run(run_dir, "cpu")
    decode = translator.config.decode.with_overrides(beam=beam, nbest=beam)
    return [
        [(h.text, h.normalized_score) for h in translator.translate([s], decode)[0]]
        for s in SENTENCES
    ]


def record_hypotheses(records: list[dict]) -> list[list[tuple[str, float]]]:
    return [[(h["translation"], h["normalized_score"]) for h in r["hypotheses"]] for r in records]


@pytest.fixture(scope="module")
def explorer_records(run_dir, tmp_path_factory):
    """Per beam, the records ``seq2seq attention`` writes for SENTENCES (JSON)."""
    folder = tmp_path_factory.mktemp("explorer")
    (folder / "in.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    records = {}
    for beam in BEAMS:
        out = folder / f"beam{beam}.json"
        args = ["attention", str(run_dir), "-i", str(folder / "in.txt"), "-o", str(out)]
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([*args, "--beam", str(beam), "--device", "cpu"]) == 0
        records[beam] = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    return records


@pytest.fixture(scope="module")
def served_records(run_dir):
    """Per beam, the records in the page ``seq2seq serve`` answers SENTENCES with."""
    records = {}
    with running(Translator.from_run(run_dir, "cpu")) as port:
        for beam in BEAMS:
            body = urlencode({"text": "\n".join(SENTENCES), "beam": str(beam)}).encode()
            status, page = post(port, body)
            assert status == 200
            data = re.search(r'id="explorer-data">(.*?)</script>', page, re.S).group(1)
            records[beam] = json.loads(data)["records"]
    return records


@pytest.mark.parametrize("beam", BEAMS)
def test_verbose_translate_prints_what_plain_translate_prints(run_dir, capsys, beam):
    for sentence in SENTENCES:
        plain = translate_cli(run_dir, capsys, sentence, beam)
        assert plain.strip()
        assert translate_cli(run_dir, capsys, sentence, beam, "--verbose") == plain


@pytest.mark.parametrize("beam", BEAMS)
def test_explorer_and_served_page_show_what_plain_translate_finds(
    run_dir, explorer_records, served_records, beam
):
    expected = plain_hypotheses(run_dir, beam)
    assert len({hyps[0][0] for hyps in expected}) > 1  # outputs that tell sentences apart
    for records in (explorer_records[beam], served_records[beam]):
        assert [r["translation"] for r in records] == [hyps[0][0] for hyps in expected]
        for found, hyps in zip(record_hypotheses(records), expected, strict=True):
            assert [text for text, _ in found] == [text for text, _ in hyps]
            scores = [score for _, score in hyps]  # the records keep 6 digits
            assert [score for _, score in found] == pytest.approx(scores, abs=1e-6)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fast attention", "with weights"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("beam", BEAMS)
def test_a_sentence_decodes_alone_as_in_a_batch_of_other_lengths(
    run_dir, beam, use_cache, need_weights
):
    """The same tokens, alone or batched with longer and shorter sentences (padded), on
    every search path. The scores are not bit-identical, and cannot be: the CPU's matrix
    kernels choose their blocking by the batch's shape, so a sentence's sums are rounded in
    another order in another batch (in fp32 too, by 1e-5), and under bf16 a logit moves by
    one bf16 step: the 52 lines of data/sample, decoded in one batch and alone, moved by 0.018
    at most (an Intel Xeon with native bf16). A token could change only where two candidates
    are that close, and none did, on any path."""
    translator = Translator.from_run(run_dir, "cpu")
    decode = translator.config.decode.with_overrides(beam=beam, nbest=beam, use_cache=use_cache)
    batch = translator.translate([*SENTENCES, *OTHER_LENGTHS], decode, need_weights=need_weights)
    for sentence, batched in zip(SENTENCES, batch, strict=False):
        [alone] = translator.translate([sentence], decode, need_weights=need_weights)
        assert [h.tokens for h in batched] == [h.tokens for h in alone], sentence
        scores = [h.normalized_score for h in alone]
        assert [h.normalized_score for h in batched] == pytest.approx(scores, abs=0.05)


def agrees_with_the_search(record: dict, tolerance: float) -> bool:
    """Whether the step-through's teacher-forced log-prob of the chosen output is the
    search's score within ``tolerance``, and (greedy) each step's token the most likely."""
    steps = record["steps"]
    chosen = next(h for h in record["hypotheses"] if h["chosen"])
    forced = sum(math.log(max(s["prob"], 1e-12)) for s in steps)
    greedy_ok = record["beam"] > 1 or all(s["prob"] == s["top"][0]["prob"] for s in steps)
    return abs(forced - chosen["score"]) <= tolerance and greedy_ok


@pytest.mark.parametrize("beam", BEAMS)
def test_step_through_shows_the_distributions_the_search_chose_from(explorer_records, beam):
    """The step-through's distributions come from one teacher-forced pass, the search's from
    step-by-step decoding: the same attention, but bf16 rounds a last bit differently now
    and then (2 of 52 sample sentences, by 0.03 at most). So most sentences must agree to
    1e-3, and every one to 0.1; with the search attending in bf16 and the pass in fp32,
    none of 52 agreed to 1e-3 greedy, 2 of 52 beam."""
    records = explorer_records[beam]
    assert all(agrees_with_the_search(r, 0.1) for r in records)
    assert sum(agrees_with_the_search(r, 1e-3) for r in records) >= len(records) - 2
