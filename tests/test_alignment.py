"""Word alignments: the rule on maps made by hand, subwords joined into words, AER on a gold
file scored by hand and its properties, and ``seq2seq align`` end to end on a tiny run."""

import json

import numpy as np
import pytest
from helpers import tiny_run_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from seq2seq.commands.cli import main
from seq2seq.drawing.words import merge_words, words_of
from seq2seq.errors import Seq2SeqError
from seq2seq.inspect.alignment import (
    Gold,
    attention_map,
    best_links,
    check_gold,
    check_map_choice,
    format_pharaoh,
    links_of,
    parse_gold,
    record_maps,
    score,
)

SPECIALS = frozenset({"<pad>", "<unk>", "<s>", "</s>"})  # as Tokenizer.special_pieces


def test_each_target_word_links_its_highest_source_word_and_a_tie_the_first():
    scores = np.array(
        [
            [0.1, 0.7, 0.2],
            [0.5, 0.1, 0.4],
            [0.3, 0.3, 0.3],  # a tie: the first column
            [0.0, 0.2, 0.8],
        ]
    )  # (Wq=4, Wk=3)
    assert best_links(scores) == {(1, 0), (0, 1), (0, 2), (2, 3)}
    assert format_pharaoh(best_links(scores)) == "0-1 0-2 1-0 2-3"  # by source, then target
    assert best_links(np.zeros((2, 0))) == frozenset()


def test_the_map_is_the_mean_of_every_layer_and_head_or_the_one_chosen():
    # Layer l, head h attends wholly to source word l * 2 + h: each choice has its own argmax.
    attention = np.zeros((2, 2, 1, 4))  # (L, H, Wq, Wk)
    for layer in range(2):
        for head in range(2):
            attention[layer, head, 0, layer * 2 + head] = 1.0
    attention[1, 1, 0, 3] = 0.7
    attention[1, 1, 0, 0] = 0.3  # the mean of everything now leans to word 0
    np.testing.assert_allclose(
        attention_map(attention, None, None), [[1.3, 1, 1, 0.7]] / np.float64(4)
    )
    assert best_links(attention_map(attention, None, None)) == {(0, 0)}
    assert best_links(attention_map(attention, 2, None)) == {(2, 0)}  # layer 2: heads 2, 3 + 0
    assert best_links(attention_map(attention, 2, 2)) == {(3, 0)}
    assert best_links(attention_map(attention, 1, 2)) == {(1, 0)}


@pytest.mark.parametrize(
    ("layer", "head", "message"),
    [
        (3, None, "--layer 3: the model has decoder layers 1 to 2"),
        (0, None, "--layer 0: the model has decoder layers 1 to 2"),
        (1, 5, "--head 5: each layer has heads 1 to 4"),
        (None, 1, "--head 1 picks a head of one layer: give --layer too"),
    ],
)
def test_a_layer_or_head_the_model_lacks_is_refused(layer, head, message):
    with pytest.raises(Seq2SeqError, match=message):
        check_map_choice(layer, head, n_layers=2, n_heads=4)
    check_map_choice(2, 4, n_layers=2, n_heads=4)


def word_record(src_pieces, tgt_pieces, weights, influence=None, stop_reason="eos") -> dict:
    """A word-level record as ``sentence_records(..., words=True)`` makes one, from subword maps."""
    src_words, tgt_words = words_of(src_pieces, SPECIALS), words_of(tgt_pieces, SPECIALS)
    return {
        "source": " ".join(w for w in src_words if w != "</s>"),
        "reference": " ".join(w for w in tgt_words if w != "</s>"),
        "translation": "",
        "teacher_forced": True,
        "stop_reason": stop_reason,
        "notes": [],
        "src_tokens": src_words,
        "tgt_tokens": tgt_words,
        "weights": merge_words(weights, src_pieces, tgt_pieces, SPECIALS),
        "influence": influence,
    }


def test_pieces_are_joined_into_words_and_eos_takes_no_link():
    src = ["▁Ein", "▁Hund", "e", ".", "</s>"]  # words: Ein | Hunde. | </s>
    tgt = ["▁Do", "g", "s", "▁run", "</s>"]  # words: Dogs | run | </s>
    w = np.array(
        [
            [0.4, 0.2, 0.2, 0.1, 0.1],  # ▁Do: its largest piece is Ein, its largest word Hunde.
            [0.3, 0.3, 0.1, 0.0, 0.3],  # g
            [0.3, 0.1, 0.1, 0.0, 0.5],  # s
            [0.2, 0.0, 0.0, 0.0, 0.8],  # ▁run: EOS most, then Ein
            [0.0, 0.0, 0.0, 0.0, 1.0],  # </s>: no word, no link
        ]
    )[None, None]  # (L=1, H=1, Tq=5, Tk=5)
    # Dogs: the mean of its rows, Ein 1.0 / 3, Hunde. 1.1 / 3, EOS 0.9 / 3.
    influence = np.array([[0.0, 2.0, 5.0], [1.0, 0.5, 9.0], [0.0, 0.0, 0.0]])  # (Wq, Wk)
    maps = record_maps(word_record(src, tgt, w, influence))
    assert (maps.src_words, maps.tgt_words) == (["Ein", "Hunde."], ["Dogs", "run"])
    assert maps.attention.shape == (1, 1, 2, 2) and maps.influence.shape == (2, 2)
    assert links_of(maps) == {(1, 0), (0, 1)}
    assert links_of(maps, "influence") == {(1, 0), (0, 1)}  # EOS's 5.0 and 9.0 left out
    assert maps.notes == []

    stopped = record_maps(word_record(src, tgt[:-1], w[:, :, :-1], stop_reason="max_len"))
    assert stopped.tgt_words == ["Dogs", "run"]  # no EOS row to drop: every word kept


def test_gold_links_sure_and_possible_and_their_errors():
    gold = parse_gold(["0-0 1p2 2-1 2-1", ""], 2)
    assert gold[0] == Gold(
        sure=frozenset({(0, 0), (2, 1)}), possible=frozenset({(0, 0), (1, 2), (2, 1)})
    )
    assert gold[1] == Gold(frozenset(), frozenset())
    check_gold(gold, [(3, 3), (1, 1)])
    with pytest.raises(
        Seq2SeqError,
        match=r"^gold line 1: the link 1-2 names target word 2, but the target has words 0 to 1$",
    ):
        check_gold(gold, [(3, 2), (1, 1)])
    for bad in ("0-x", "0_1", "1-2-3", "-1-0", "0P1"):
        with pytest.raises(Seq2SeqError, match=f"^gold line 2: '{bad}' is not a link i-j"):
            parse_gold(["0-0", f"1-1 {bad}"], 2)
    with pytest.raises(Seq2SeqError, match="^the gold file has 1 line for 2 sentences$"):
        parse_gold(["0-0"], 2)


def test_aer_precision_and_recall_of_a_hand_made_gold_file(tmp_path):
    gold = parse_gold(["0-0 1-1 2p1 2-2", "0-1 1-0"], 2)
    predicted = [{(0, 0), (2, 1), (1, 2)}, {(0, 1), (0, 0)}]
    # |A| = 5, |S| = 3 + 2, |P| = 4 + 2; A∩S = {0-0} + {0-1} = 2; A∩P = {0-0, 2-1} + {0-1} = 3.
    scores = score(predicted, gold)
    assert (scores.links, scores.sure, scores.possible) == (5, 5, 6)
    assert scores.precision == pytest.approx(3 / 5)
    assert scores.recall == pytest.approx(2 / 5)
    assert scores.aer == pytest.approx(1 - (2 + 3) / (5 + 5))
    none = score([set()], parse_gold(["0p0"], 1))
    assert (none.aer, none.precision, none.recall) == (None, None, None)


links = st.frozensets(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(links, links, links), min_size=1, max_size=4))
def test_aer_is_within_0_and_1_and_0_when_a_equals_s_equals_p(sentences):
    predicted = [a for a, _, _ in sentences]
    gold = [Gold(s, s | p) for _, s, p in sentences]
    scores = score(predicted, gold)
    for value in (scores.aer, scores.precision, scores.recall):
        assert value is None or 0.0 <= value <= 1.0
    if scores.links and scores.sure:
        assert scores.aer is not None
    exact = score(predicted, [Gold(a, a) for a in predicted])
    assert exact.aer in (0.0, None) and exact.precision in (1.0, None)
    # Where P = S, AER is 1 - F1 of precision and recall.
    plain = score(predicted, [Gold(s, s) for _, s, _ in sentences])
    if plain.precision and plain.recall:
        f1 = 2 * plain.precision * plain.recall / (plain.precision + plain.recall)
        assert plain.aer == pytest.approx(1 - f1)


# --- seq2seq align, on a tiny run (1 decoder layer, 4 heads) -------------------------------

SOURCES = ["Ein Hund läuft über die Wiese.", "Eine Frau liest ein Buch."]
REFERENCES = ["A dog runs across the meadow.", "A woman reads a book."]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run_dir(tmp_path_factory)


@pytest.fixture
def files(tmp_path):
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    return src, ref


def pharaoh(text: str) -> list[set[tuple[int, int]]]:
    return [
        {tuple(map(int, link.split("-"))) for link in line.split()} for line in text.splitlines()
    ]


def align(run_dir, *args) -> int:
    """``seq2seq align RUN_DIR ARGS``, its exit status."""
    return main(["align", str(run_dir), *map(str, args)])


@pytest.mark.parametrize("source", ["attention", "influence"])
def test_align_links_each_reference_word_as_the_attention_records_say(
    run_dir, files, tmp_path, capsys, source
):
    src, ref = files
    assert align(run_dir, src, ref, "--from", source) == 0
    out = pharaoh(capsys.readouterr().out)
    assert len(out) == len(SOURCES)
    record_file = tmp_path / "records.json"
    words = ["-i", src, "--reference-file", ref, "--words", "-o", record_file]
    assert main(["attention", str(run_dir), *map(str, words)]) == 0
    capsys.readouterr()
    for links, line in zip(out, record_file.read_text(encoding="utf-8").splitlines(), strict=True):
        record = json.loads(line)
        rows, cols = len(record["tgt_tokens"]) - 1, len(record["src_tokens"]) - 1  # EOS out
        mean = np.array(record["weights"]).mean(axis=(0, 1))
        scores = mean if source == "attention" else np.array(record["influence"])
        assert links == {(int(i), j) for j, i in enumerate(scores[:rows, :cols].argmax(-1))}
        assert sorted(j for _, j in links) == list(range(rows))  # one link per target word


def test_gold_made_of_the_alignment_itself_scores_aer_0_and_a_changed_one_less(
    run_dir, files, tmp_path, capsys
):
    src, ref = files
    out, gold = tmp_path / "links.txt", tmp_path / "gold.txt"
    one_head = [src, ref, "--layer", 1, "--head", 2]
    assert align(run_dir, *one_head, "-o", out) == 0
    assert capsys.readouterr().out == ""
    predicted = pharaoh(out.read_text(encoding="utf-8"))
    gold.write_text(out.read_text(encoding="utf-8"), encoding="utf-8")
    assert align(run_dir, *one_head, "--gold", gold) == 0
    n = sum(map(len, predicted))
    assert capsys.readouterr().err == (
        f"AER 0.000, precision 1.000, recall 1.000 ({n} links; gold {n} sure, {n} possible)\n"
    )
    # The first sentence's links made possible, the second's each moved to the next source
    # word (of its 5): A∩S = {}, A∩P = the first sentence's links.
    first = " ".join(f"{i}p{j}" for i, j in sorted(predicted[0]))
    moved = {((i + 1) % 5, j) for i, j in predicted[1]}
    gold.write_text(first + "\n" + format_pharaoh(moved) + "\n", encoding="utf-8")
    assert align(run_dir, *one_head, "--gold", gold) == 0
    n1, m = len(predicted[0]), len(moved)
    assert capsys.readouterr().err == (
        f"AER {1 - n1 / (n + m):.3f}, precision {n1 / n:.3f}, recall 0.000 ({n} links; gold "
        f"{m} sure, {n1 + m} possible)\n"
    )


def test_decode_aligns_the_models_own_translation(run_dir, files, tmp_path, capsys):
    src, _ = files
    translations = tmp_path / "hyp.en"
    assert align(run_dir, src, "--decode", "--beam", 1, "--translations", translations) == 0
    captured = capsys.readouterr()
    out = pharaoh(captured.out)
    assert main(["translate", str(run_dir), "--beam", "1", "-i", str(src)]) == 0
    expected = capsys.readouterr().out
    assert translations.read_text(encoding="utf-8") == expected
    for links, text in zip(out, expected.splitlines(), strict=True):
        if "warning" not in captured.err:  # the tokenizer's words are the text's
            assert sorted(j for _, j in links) == list(range(len(text.split())))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{src}", "{short}"], "2 source lines but 1 reference line"),
        (["{empty}", "{ref}"], "SOURCE_FILE {empty}: line 2 is empty"),
        (["{src}", "{ref}", "--layer", "2"], "--layer 2: the model has decoder layers 1 to 1"),
        (
            ["{src}", "{ref}", "--layer", "1", "--head", "9"],
            "--head 9: each layer has heads 1 to 4",
        ),
        (["{src}", "{ref}", "--head", "1"], "--head 1 picks a head of one layer: give --layer too"),
        (
            ["{src}", "{ref}", "--from", "influence", "--layer", "1"],
            "--layer and --head choose attention maps",
        ),
        (
            ["{src}", "{ref}", "--gold", "{bad_gold}"],
            "gold line 2: '1-b' is not a link i-j (sure) or ipj (possible)",
        ),
        (
            ["{src}", "{ref}", "--gold", "{far_gold}"],
            "gold line 1: the link 0-40 names target word 40, but the target has words 0 to",
        ),
        (["{src}", "{ref}", "--gold", "{short}"], "the gold file has 1 line for 2 sentences"),
        (
            ["{src}", "{ref}", "--decode"],
            "--decode aligns the model's own translations: give no REFERENCE_FILE",
        ),
        (["{src}", "--decode", "--gold", "{bad_gold}"], "--gold scores links to the references"),
        (["{src}"], "give REFERENCE_FILE, or --decode"),
        (["{src}", "{ref}", "--beam", "2"], "--beam goes with --decode"),
    ],
)
def test_bad_input_is_one_line(run_dir, files, tmp_path, capsys, args, message):
    src, ref = files
    paths = {"src": src, "ref": ref}
    for name, text in [
        ("short", "0-0\n"),
        ("empty", "Ein Hund.\n\n"),
        ("bad_gold", "0-0\n1-b\n"),
        ("far_gold", "0-40\n0-0\n"),
    ]:
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_text(text, encoding="utf-8")
    assert align(run_dir, *(paths[a[1:-1]] if a.startswith("{") else a for a in args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert message.format(**paths) in err


def test_the_experiment_writes_a_record_the_results_page_renders(run_dir, files, tmp_path, capsys):
    import importlib.util
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "alignment_run", repo / "experiments/alignment/run.py"
    )
    experiment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(experiment)
    src, ref = files
    gold, out = tmp_path / "gold.align", tmp_path / "record.json"
    gold.write_text("0-0 1-1 2p2\n0-0 1-1\n", encoding="utf-8")
    argv = ["--run", str(run_dir), "--src", str(src), "--ref", str(ref), "--gold", str(gold)]
    assert experiment.main([*argv, "--json", str(out)]) == 0
    record = json.loads(out.read_text(encoding="utf-8"))
    maps = [row["map"] for row in record["attention"]]
    assert maps == ["mean of every layer and head", "layer 1, mean of heads"] + [
        f"layer 1, head {h}" for h in range(1, 5)
    ]
    # One link per target word: |A| is the target words, and the gold's counts are the file's.
    for scores in [*record["attention"], record["influence"], record["diagonal"]]:
        assert (scores["links"], scores["sure"], scores["possible"]) == (
            record["target_words"],
            4,
            5,
        )
    # The mean of a layer's heads is the mean of everything in a one-layer model.
    assert record["attention"][0] | {"map": 0} == record["attention"][1] | {"map": 0, "layer": None}
    sys.path.insert(0, str(repo))
    from experiments.records.notes import word_alignments

    text = "\n".join(word_alignments(record))
    assert f"| influence (occlusion) |  | {record['influence']['aer']:.3f} |" in text
    assert f"({record['target_words']} target words)" in text
