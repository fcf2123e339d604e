"""Run records (``experiments/records``): ``collect`` copies a real run's evidence, ``render``
turns records into tables. Rendering is tested on small records written here, with figures
chosen so that each can be found (or must be absent) in the output."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import child_env, tiny_run_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # experiments/ is run from the repository root

from experiments.records import RecordError  # noqa: E402
from experiments.records import collect as collect_module  # noqa: E402
from experiments.records.__main__ import main  # noqa: E402
from experiments.records.load import (  # noqa: E402
    load_training,
    metrics_rows,
    plain,
    read_json,
    read_text,
    read_yaml,
    record_dirs,
    record_of,
)
from experiments.records.render import (  # noqa: E402
    END,
    START,
    differences,
    load_records,
    rendered,
    results_page,
)
from experiments.records.tables import tuning_table  # noqa: E402
from seq2seq.data.corpora import open_corpus  # noqa: E402
from seq2seq.decoding.evaluate import bleu_tokenize, evaluate_split, literature_bleu, score  # noqa: E402
from seq2seq.run.checkpoint import read_tensors, write_tensors  # noqa: E402

# --- collect, on a real run --------------------------------------------------------------


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory) -> Path:
    """The tiny session run, copied, with greedy and beam 5 test scores in it."""
    run = tmp_path_factory.mktemp("records") / "run"
    shutil.copytree(tiny_run_dir(tmp_path_factory), run)
    evaluate_split(run, split="test")
    evaluate_split(run, split="test", decode=_beam(run, 5), hyp_file=run / "hyps.test.beam5.en.txt")
    return run


def _beam(run: Path, k: int):
    from seq2seq.run.checkpoint import load_config_file

    return load_config_file(run).decode.with_overrides(beam=k)


def test_collect_copies_the_evidence_and_no_weights(scored_run, tmp_path, monkeypatch):
    size = (scored_run / "hyps.test.en.txt").stat().st_size
    monkeypatch.setattr(collect_module, "GZIP_OVER", size - 1)  # so the hypotheses get gzipped
    assert main(["--results", str(tmp_path), "collect", str(scored_run), "tiny-s1"]) == 0
    out = tmp_path / "tiny-s1"
    record = json.loads((out / "record.json").read_text())
    assert record["recipe"] == "tiny" and record["seed"] == 1 and record["direction"] == "de-en"
    assert record["steps"] == 60 and record["budget"] == "30.0 min or 60 steps"
    best = (scored_run / "model.safetensors").read_bytes()
    assert record["sha256"] == hashlib.sha256(best).hexdigest()
    assert json.loads(read_text(out / "hyps.test.en.json"))["sha256"] == record["sha256"]
    assert record["scores"] == {
        "test": {"greedy": "hyps.test.en.json", "beam 5": "hyps.test.beam5.en.json"},
        "validation": {},
    }
    assert not list(out.rglob("*.safetensors"))
    for name in ("config.yaml", "metrics.jsonl", "environment.json", "data_summary.json"):
        assert read_text(out / name) == (scored_run / name).read_text()
    assert (out / "hyps.test.en.txt.gz").is_file() and not (out / "hyps.test.en.txt").exists()
    assert read_text(out / "hyps.test.en.txt") == (scored_run / "hyps.test.en.txt").read_text()
    lines = (scored_run / "metrics.jsonl").read_text().splitlines()
    last = [row for row in map(json.loads, lines) if row["kind"] == "valid"][-1]
    training = load_training(out)
    assert (training.valid_loss, training.by_epoch["end"]) == (last["loss"], last["bleu"])


def test_collect_refuses_in_one_line(scored_run, tmp_path, capsys):
    results = str(tmp_path)
    assert main(["--results", results, "collect", str(scored_run), "a", "--seed", "2"]) == 2
    assert main(["--results", results, "collect", str(tmp_path / "nothing"), "b"]) == 2
    assert main(["--results", results, "collect", str(scored_run), "c"]) == 0
    assert main(["--results", results, "collect", str(scored_run), "c"]) == 2
    killed = tmp_path / "killed"
    shutil.copytree(scored_run, killed)
    tensors, state = read_tensors(killed / "last.safetensors")
    write_tensors(killed / "last.safetensors", tensors, {**state, "finished": False})
    assert main(["--results", results, "collect", str(killed), "d"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 4 and all(e.startswith("records: error: ") for e in errors)
    assert "train.seed 1" in errors[0] and "exists" in errors[2] and "not finished" in errors[3]
    assert {p.name for p in tmp_path.iterdir()} == {"c", "killed"}  # nothing half-written


def test_collect_refuses_scores_of_weights_the_run_no_longer_holds(scored_run, tmp_path, capsys):
    results = str(tmp_path / "results")
    trained_further = tmp_path / "further"  # as evaluate, then a resume that replaced the weights
    shutil.copytree(scored_run, trained_further)
    tensors, metadata = read_tensors(trained_further / "model.safetensors")
    write_tensors(trained_further / "model.safetensors", tensors, {**metadata, "step": 90})
    older = tmp_path / "older"  # scores written before they named their weights
    shutil.copytree(scored_run, older)
    report = json.loads((older / "hyps.test.en.json").read_text())
    del report["sha256"]
    (older / "hyps.test.en.json").write_text(json.dumps(report))
    assert main(["--results", results, "collect", str(trained_further), "a"]) == 2
    assert main(["--results", results, "collect", str(older), "b"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all(e.startswith("records: error: ") for e in errors)
    assert "hyps.test.beam5.en.json: scores of model.safetensors at step" in errors[0]
    assert "no longer holds; evaluate again" in errors[0]
    assert "hyps.test.en.json: names no weights it scored" in errors[1]
    assert not (tmp_path / "results").exists()


# --- render, on records written here -----------------------------------------------------


def write_record(
    results: Path,
    name: str,
    seed: int,
    valid_bleu: float,
    test: dict[str, float] | None = None,
    recipe: str = "base",
    lr: float = 0.002,
    cpus: tuple[str, ...] = ("Test CPU",),
    sha256: str | None = None,
    trainer: str = "test trainer",
) -> Path:
    """A record like ``collect`` writes: ``test`` = greedy BLEU, beam 5 BLEU, literature
    scale and chrF, or no test scores; trained in one segment per CPU of ``cpus``, by
    ``trainer`` (numerics.yaml's name)."""
    out = results / name
    out.mkdir(parents=True)
    segments = [{"cpu": cpu, "device": "cpu", "threads": 2, "precision": "fp32"} for cpu in cpus]
    (out / "environment.json").write_text(json.dumps({"segments": segments}))
    config = {"data": {"src": "de", "tgt": "en"}, "train": {"seed": seed, "lr": lr}}
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [
        {"kind": "train", "step": 5, "loss": 4.0},
        {"kind": "valid", "step": 10, "epoch": 1, "loss": 3.5, "bleu": valid_bleu - 5},
        {"kind": "valid", "step": 20, "epoch": 2, "loss": 2.5, "bleu": valid_bleu - 1},
        {"kind": "valid", "step": 25, "epoch": 2, "loss": 2.25, "bleu": valid_bleu},
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scores = {}
    for label, beam in (("greedy", 1), ("beam 5", 5)) if test else ():
        scores[label] = f"hyps.test.{beam}.json"
        bleu = test["greedy"] if beam == 1 else test["beam"]
        (out / scores[label]).write_text(
            json.dumps(
                {
                    "data": "parallel text files in /x/multi30k, de-en",
                    "split": "test",
                    "sentences": 1000,
                    "bleu": bleu,
                    "bleu_signature": "nrefs:1|case:mixed",
                    "bleu_lc_norm_tok": test["literature"],
                    "chrf": test["chrf"],
                }
            )
        )
    record = {
        "name": name,
        "recipe": recipe,
        "seed": seed,
        "direction": "de-en",
        "budget": "30 min",
        "steps": 25,
        "epochs": 2.5,
        "minutes": 30.1,
        "weights": "step 25",
        "valid_bleu": valid_bleu,
        "sha256": sha256 or hashlib.sha256(name.encode()).hexdigest(),
        "trainer": trainer,
        "scores": {"test": scores, "validation": {}},
    }
    (out / "record.json").write_text(json.dumps(record))
    return out


def three_seeds(results: Path) -> None:
    for seed, greedy in ((1, 38.0), (2, 39.0), (3, 40.0)):
        test = {"greedy": greedy, "beam": greedy + 1, "literature": 41.5, "chrf": 60.0}
        write_record(results, f"base-s{seed}", seed, 40.0 + seed, test)


def test_a_recipe_is_the_mean_and_sd_of_its_seeds_beside_each_seed(tmp_path):
    three_seeds(tmp_path)
    page = results_page(load_records(tmp_path))
    assert "| test BLEU greedy | 39.00 ± 1.00 | 38.00 | 39.00 | 40.00 |" in page
    assert "| test BLEU beam 5 | 40.00 ± 1.00 | 39.00 | 40.00 | 41.00 |" in page
    assert "mean ± sd, 3 seeds | seed 1 | seed 2 | seed 3 |" in page
    # validation after each epoch (the first validation after it) and at the end
    assert "| validation BLEU, epoch 2 | 41.00 ± 1.00 | 40.00 | 41.00 | 42.00 |" in page
    assert "| validation BLEU, end | 42.00 ± 1.00 | 41.00 | 42.00 | 43.00 |" in page


def test_one_seed_is_labelled_and_shown_once(tmp_path):
    """A recipe of one seed is its seed's column alone, no mean beside it; the budgets of one
    recipe that have a seed each share one table, the recipe named once above them."""
    test = {"greedy": 39.22, "beam": 40.29, "literature": 41.0, "chrf": 60.0}
    write_record(tmp_path, "base-s1", 1, 40.1, test)
    records = load_records(tmp_path)
    page = results_page(records)
    assert "##### one seed\n\n|  | seed 1 |\n" in page
    assert "| test BLEU greedy | 39.22 |\n" in page
    assert "39.22 (1 seed)" in tuning_or_compact(tmp_path)
    later = {**test, "greedy": 40.5}
    write_record(tmp_path, "b-s2", 2, 41.0, later, recipe="base; 2500 steps", lr=0.001)
    write_record(tmp_path, "c-s3", 3, 42.0, test, recipe="base; 4900 steps", lr=0.003)
    page = results_page(load_records(tmp_path))
    assert page.count("#### base\n") == 1
    assert "|  | seed 1 | 2500 steps, seed 2 | 4900 steps, seed 3 |\n" in page
    assert "| test BLEU greedy | 39.22 | 40.50 | 39.22 |\n" in page


def tuning_or_compact(results: Path) -> str:
    """The README block rendered into a page with the markers."""
    page = results / "README.md"
    page.write_text(f"intro\n{START}\nold\n{END}\nrest\n")
    return rendered(results, results / "results.md", [page])[page]


def test_each_seed_says_what_trained_it(tmp_path):
    """Seeds of one recipe may run on different machines: a time budget then trains a
    different number of steps, so each seed's column, and the tuning row, name the machines."""
    test = {"greedy": 39.0, "beam": 40.0, "literature": 41.0, "chrf": 60.0}
    write_record(tmp_path, "base-s1", 1, 40.0, test, cpus=("CPU A",))
    write_record(tmp_path, "base-s2", 2, 41.0, test, cpus=("CPU B", "CPU B", "CPU A"))
    records = load_records(tmp_path)
    machine_a, machine_b = (f"CPU {x} (bf16 flags not recorded), fp32, 2 threads" for x in "AB")
    page = results_page(records)
    assert f"| trained on |  | {machine_a} | {machine_b} + {machine_a} |" in page
    assert "| trainer |  | test trainer | test trainer |" in page
    assert f"| {machine_a}; {machine_b} + {machine_a} |" in tuning_table(records.trainings)


def test_each_seed_says_whether_its_test_scores_name_their_weights(tmp_path):
    test = {"greedy": 39.0, "beam": 40.0, "literature": 41.0, "chrf": 60.0}
    write_record(tmp_path, "base-s1", 1, 40.0, test)  # scores as an older evaluate wrote them
    hashed = write_record(tmp_path, "base-s2", 2, 41.0, test)
    for path in hashed.glob("hyps.*.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "sha256": "ab" * 32}))
    page = results_page(load_records(tmp_path))
    unhashed = "no: scored before scores named their weights"
    assert f"| test scores tied to them |  | {unhashed} | by sha256 |" in page


def test_the_tuning_table_never_shows_a_test_score(tmp_path):
    three_seeds(tmp_path)
    write_record(tmp_path, "sweep", 1, 37.77, recipe="sweep", lr=0.005)
    records = load_records(tmp_path)
    table = tuning_table(records.trainings)
    assert "42.00 ± 1.00 (41.00, 42.00, 43.00)" in table and "37.77 (1 seed)" in table
    page = results_page(records)
    tuning = page.split("## Tuning")[1].split("\n## ")[0]
    assert table in tuning
    for figure in ("38.00", "39.00", "40.00", "41.50", "60.00"):  # test BLEU, scale, chrF
        assert figure not in tuning
    assert table.index("| base |") < table.index("| sweep |")  # best validation first


def test_goals_are_decided_on_the_mean_of_enough_seeds(tmp_path):
    three_seeds(tmp_path)
    goals = {
        "min_seeds": 3,
        "goals": [
            {"direction": "de-en", "recipe": "base", "metric": "bleu_greedy", "at_least": 38.5},
            {"direction": "de-en", "recipe": "base", "metric": "bleu_beam5", "at_least": 40.5},
            {"direction": "en-de", "recipe": "base", "metric": "bleu_greedy", "at_least": 39},
        ],
    }
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump(goals))
    page = results_page(load_records(tmp_path))
    assert "greedy ≥ 38.5: **met** (mean 39.00 over 3 seeds)" in page
    assert "beam 5 ≥ 40.5: not met (mean 40.00 over 3 seeds)" in page
    assert "- en→de, base, test BLEU greedy ≥ 39: no record yet" in page
    goals["min_seeds"] = 4
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump(goals))
    page = results_page(load_records(tmp_path))
    assert "not decided: mean 39.00 over 3 seeds; the goal counts ≥ 4 seeds" in page


def test_the_readme_shows_the_headline_recipes_and_results_md_every_recipe(tmp_path):
    three_seeds(tmp_path)
    test = {"greedy": 30.5, "beam": 31.5, "literature": 32.5, "chrf": 50.0}
    write_record(tmp_path, "former-s1", 1, 35.0, test, recipe="former", lr=0.001)
    assert "| former |" in tuning_or_compact(tmp_path)  # no headline: every recipe
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"headline": ["base"]}))
    readme = tuning_or_compact(tmp_path)
    assert "| de→en | base | 3 |" in readme and "former" not in readme
    assert "| former |" in results_page(load_records(tmp_path))
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"headline": ["base", "bsae"]}))
    with pytest.raises(RecordError, match="no tested record of 'bsae'"):
        tuning_or_compact(tmp_path)
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"headline": "base"}))
    with pytest.raises(RecordError, match="headline must be a list of recipe labels"):
        load_records(tmp_path)


def test_the_readme_names_a_shared_recipe_once_and_leaves_the_goals_to_results_md(tmp_path):
    test = {"greedy": 30.5, "beam": 31.5, "literature": 32.5, "chrf": 50.0}
    write_record(tmp_path, "a-s1", 1, 35.0, test, recipe="base; 1200 steps")
    write_record(tmp_path, "b-s1", 1, 36.0, test, recipe="base; 4900 steps", lr=0.001)
    goal = {"direction": "de-en", "recipe": "base; 1200 steps", "metric": "bleu_greedy"}
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"goals": [{**goal, "at_least": 40}]}))
    readme = tuning_or_compact(tmp_path)
    assert "Recipe: base.\n" in readme and "| direction | budget | seeds |" in readme
    assert "| de→en | 1200 steps | 1 |" in readme and "| de→en | 4900 steps | 1 |" in readme
    assert "≥ 40" not in readme and "not met" not in readme
    assert "greedy ≥ 40: not met" in results_page(load_records(tmp_path))


def test_each_readme_row_names_the_machine_and_trainer_of_its_seeds(tmp_path):
    """A row that pools seeds of two machines says so: a letter per machine and trainer,
    with the seeds each trained, the letters named below the table."""
    test = {"greedy": 30.5, "beam": 31.5, "literature": 32.5, "chrf": 50.0}
    write_record(tmp_path, "a-s1", 1, 35.0, test, cpus=("CPU A",))
    write_record(tmp_path, "a-s2", 2, 35.5, test, cpus=("CPU A",))
    write_record(tmp_path, "a-s3", 3, 36.0, test, cpus=("CPU B",))
    readme = tuning_or_compact(tmp_path)
    assert (
        "| de→en | base | 3 | 25 ± 0 | 30.50 ± 0.00 | 31.50 ± 0.00 | 32.50 ± 0.00 | A (seeds 1, 2), B (seed 3) |"
        in readme
    )
    legend = "A: CPU A (bf16 flags not recorded), fp32, 2 threads; test trainer. B: CPU B (bf16 "
    assert f"\n\n{legend}flags not recorded), fp32, 2 threads; test trainer.\nRendered" in readme


def test_a_missing_record_field_is_a_one_line_error(tmp_path, capsys):
    out = write_record(tmp_path, "base-s1", 1, 40.0)
    record = json.loads((out / "record.json").read_text())
    del record["steps"]
    (out / "record.json").write_text(json.dumps(record))
    with pytest.raises(RecordError, match="no 'steps' field"):
        load_records(tmp_path)
    assert main(["--results", str(tmp_path), "render", "--check"]) == 2
    [error] = capsys.readouterr().err.splitlines()
    assert error.startswith("records: error: ") and "no 'steps' field" in error
    assert main(["--results", str(tmp_path), "render"]) == 2  # docs/ shows the repo's only


def test_seeds_of_one_recipe_must_share_the_recipe(tmp_path):
    write_record(tmp_path, "base-s1", 1, 40.0)
    write_record(tmp_path, "base-s2", 2, 40.0, lr=0.003)
    with pytest.raises(RecordError, match="differ in train.lr"):
        load_records(tmp_path)


def test_a_setting_newer_than_a_record_reads_as_its_default(tmp_path):
    """A seed recorded before ``train.ema`` existed shares the recipe of one that writes the
    default; one that sets it differs. The precision asked for is the machine's, not the
    recipe's (what it resolved to is in the machine column)."""
    write_record(tmp_path, "base-s1", 1, 40.0)
    write_record(tmp_path, "base-s2", 2, 40.0)
    path = tmp_path / "base-s2" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config["train"].update(ema=0.0, precision="bf16")
    path.write_text(yaml.safe_dump(config))
    assert len(load_records(tmp_path).trainings) == 2
    config["train"]["ema"] = 0.999
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(RecordError, match="differ in train.ema"):
        load_records(tmp_path)


def test_the_markers_take_the_compact_table_and_check_finds_stale_files(tmp_path):
    three_seeds(tmp_path)
    text = tuning_or_compact(tmp_path)
    assert text.startswith(f"intro\n{START}\n") and text.endswith(f"{END}\nrest\n")
    assert "| de→en | base | 3 | 25 ± 0 | 39.00 ± 1.00 | 40.00 ± 1.00 | 41.50 ± 0.00 |" in text
    assert "old" not in text
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    files = rendered(tmp_path, tmp_path / "results.md", [plain])
    assert plain not in files  # a page without the markers is left alone
    assert differences(files) == [f"{tmp_path / 'results.md'} (missing)"]
    for path, content in files.items():
        path.write_text(content)
    assert differences(files) == []
    (tmp_path / "results.md").write_text(content.replace("39.00 ± 1.00", "39.50 ± 1.00"))
    [stale] = differences(files)
    assert stale.startswith(str(tmp_path / "results.md")) and "(line " in stale
    broken = tmp_path / "broken.md"
    broken.write_text(f"{START}\nno end\n")
    with pytest.raises(RecordError, match="without"):
        rendered(tmp_path, tmp_path / "results.md", [broken])


def test_decode_benchmark_records_become_a_speed_table(tmp_path):
    out = tmp_path / "bench-decode"
    out.mkdir()
    environment = {"cpu": "Test CPU", "threads": 2, "versions": {"torch": "9.9"}, "git_commit": "c"}
    case = {"case": "greedy N=64: cache vs no cache", "ours_tok_s": 4321.0}
    case.update(reference_tok_s=987.6, ratio=4.38, goal=">= 4x", **{"pass": True})
    setup = {"run": "runs/de-en", "sentences": 64, "lengths": [64], "repeats": 5, "device": "cpu"}
    benchmark = {"benchmark": "decode", "environment": environment, "setup": setup}
    (out / "benchmark.json").write_text(json.dumps({**benchmark, "cases": [case], "bleu": []}))
    page = results_page(load_records(tmp_path))
    speed = page.split("## Decoding speed")[1]
    assert "Test CPU, 2 torch thread(s), torch 9.9" in speed
    assert "| greedy N=64: cache vs no cache | 4,321 | 988 | 4.38 | >= 4x | pass |" in speed


def test_the_committed_results_page_is_the_render_of_the_committed_records(capsys):
    assert main(["render", "--check"]) == 0, capsys.readouterr().out


# --- the committed records, cross-checked ----------------------------------------------

COMMITTED = REPO / "experiments" / "results"
RECORDS = record_dirs(COMMITTED)[0]


@pytest.mark.parametrize("folder", RECORDS, ids=lambda folder: folder.name)
def test_a_committed_record_agrees_with_its_metrics(folder):
    """How far it trained, which state it scored, and that state's validation BLEU, as its
    ``metrics.jsonl`` logged them."""
    record, rows = record_of(folder), metrics_rows(folder)
    assert record["steps"] == rows[-1]["step"], "steps: not the last step logged"
    averaged = record["weights"].startswith("average")
    averages = [r for r in rows if r["kind"] == "average"]
    assert not averages or averages[-1]["kept"] == averaged, "the average kept, or not"
    assert record["valid_bleu"] == scored_row(record["weights"], rows)["bleu"], record["weights"]


def scored_row(weights: str, rows: list[dict]) -> dict:
    """The metrics row that validated ``weights``: "step N" or "average of steps A–B"."""
    if match := re.fullmatch(r"step (\d+)", weights):
        return next(r for r in rows if r["kind"] == "valid" and r["step"] == int(match[1]))
    span = tuple(map(int, re.fullmatch(r"average of steps (\d+)–(\d+)", weights).groups()))
    averages = [r for r in rows if r["kind"] == "average"]
    return next(r for r in averages if (r["steps"][0], r["steps"][-1]) == span)


TESTED = [(f, name) for f in RECORDS for name in record_of(f)["scores"]["test"].values()]


@pytest.mark.parametrize(("folder", "scores"), TESTED, ids=[f"{f.name}/{n}" for f, n in TESTED])
def test_a_committed_test_score_is_its_hypotheses_scored_again(folder, scores):
    """sacreBLEU over the committed hypotheses against the references, by the functions
    ``seq2seq evaluate`` scores with, gives every figure the scores file records."""
    recorded = read_json(folder / scores)
    hyps = read_text(folder / Path(scores).with_suffix(".txt")).splitlines()
    data = read_yaml(folder / "config.yaml")["data"]
    refs = references(tuple(data[key] for key in CORPUS_KEYS))
    assert plain(recorded["data"]) == record_of(folder)["data"] and recorded["split"] == "test"
    assert len(hyps) == len(refs) == recorded["sentences"]
    tgt = data["tgt"]
    again = {**score(hyps, refs, bleu_tokenize(tgt)), **literature_bleu(hyps, refs, tgt)}
    for key in ("bleu", "chrf", "bleu_lowercase", "bleu_lc_norm_tok", "sys_len", "ref_len"):
        assert again[key] == recorded[key], f"{key} {recorded[key]}, scored again {again[key]}"
    for key in ("bleu_signature", "chrf_signature"):  # but the version that computed them
        assert _unversioned(again[key]) == _unversioned(recorded[key]), key


# Records whose test scores an older ``seq2seq evaluate`` wrote, before a scores file named
# the weights it scored (no ``sha256``): the former default's seeds and its dropout-0.3
# variant. Nothing ties their scores to the record's weights; docs/results.md says so in
# their rows ("test scores tied to them: no").
UNHASHED = {
    *(f"default-{d}-s{seed}" for d in ("deen", "ende") for seed in (1, 2, 3)),
    *(f"do0.3-alone-{d}-s{seed}" for d in ("deen", "ende") for seed in (1, 2, 3)),
    "alone-deen-s1",
}
SCORED = [f for f in RECORDS if record_of(f)["scores"]["test"]]


@pytest.mark.parametrize("folder", SCORED, ids=lambda folder: folder.name)
def test_committed_test_scores_are_of_the_weights_their_record_names(folder):
    """Each scores file the record lists names the weights file, the weights and the sha256
    the record does; only the records ``UNHASHED`` lists carry no hash, each listed one none."""
    record = record_of(folder)
    for name in record["scores"]["test"].values():
        scores = read_json(folder / name)
        if folder.name in UNHASHED:
            assert "sha256" not in scores, (
                f"{name} names its weights: {folder.name} is not UNHASHED"
            )
            continue
        assert "sha256" in scores, f"{name}: no weights hash, and {folder.name} is not UNHASHED"
        for key in ("weights_file", "weights", "sha256"):
            assert scores[key] == record[key], f"{name}: {key} {scores[key]}, record {record[key]}"


def test_every_record_listed_as_unhashed_is_committed():
    assert {f.name for f in SCORED} >= UNHASHED


CORPUS_KEYS = ("data", "src", "tgt", "test_split", "carve_valid", "carve_test", "columns")


@functools.cache
def references(corpus: tuple) -> list[str]:
    """The test split's references of the corpus a config's ``CORPUS_KEYS`` name, read once."""
    return [t for _, t in open_corpus(*corpus).splits["test"]]


def _unversioned(signature: str) -> str:
    return re.sub(r"\|version:[^|]*", "", signature)


# Figures the prose of a page quotes from committed records, each with the step it names (None:
# the last validation) and the digits it prints. Prose is not rendered: each figure must stand,
# with its step, in a paragraph that names its record (`name`).
QUOTED = {}
# Figures printed as records print BLEU and loss (two or more decimals), in a paragraph that
# names a record, that come from no record: each says what it is.
NOT_FROM_RECORDS: dict[str, list[str]] = {}
# Every hand-written page (docs/results.md is the render itself).
PROSE = [
    "README.md",
    *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")) if p.name != "results.md"),
    "data/README.md",
    *(p.relative_to(REPO).as_posix() for p in sorted(REPO.glob("experiments/*/README.md"))),
]
_FIGURE = re.compile(r"(?<![\d.])\d+\.\d{2,}(?![\d.])")


def paragraphs(page: str) -> list[str]:
    """The paragraphs of a page, each on one line: "next to" a record's name, for a figure."""
    text = (REPO / page).read_text(encoding="utf-8")
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]


def quoted(name: str, step: int | None, metric: str, digits: int) -> tuple[str, int]:
    """The figure as the prose prints it, and the step of the validation it is from."""
    valid = [r for r in metrics_rows(COMMITTED / name) if r["kind"] == "valid"]
    row = valid[-1] if step is None else next(r for r in valid if r["step"] == step)
    return f"{row[metric]:.{digits}f}", row["step"]


@pytest.mark.parametrize("page", sorted(QUOTED))
def test_a_figure_the_prose_quotes_stands_beside_its_record(page):
    for name, step, metric, digits in QUOTED[page]:
        figure, at = quoted(name, step, metric, digits)
        beside = [p for p in paragraphs(page) if f"`{name}`" in p]
        assert beside, f"{page} no longer names record {name}"
        assert any(figure in _FIGURE.findall(p) and f"step {at:,}" in p for p in beside), (
            f"{page}: {name}'s {metric} at step {at:,} is {figure}: not beside its name"
        )


@pytest.mark.parametrize("page", PROSE)
def test_every_figure_beside_a_record_is_checked(page):
    """A figure in a paragraph that names a record is one ``QUOTED`` checks, or one said to
    come from no record."""
    names = {f.name for f in RECORDS}
    checked = {quoted(*q)[0] for q in QUOTED.get(page, [])} | set(NOT_FROM_RECORDS.get(page, []))
    for paragraph in paragraphs(page):
        if any(f"`{name}`" in paragraph for name in names):
            unchecked = set(_FIGURE.findall(paragraph)) - checked
            assert not unchecked, f"{page}: {sorted(unchecked)} beside a record, unchecked"


def test_a_comparison_calls_a_lead_only_outside_its_95_percent_interval(tmp_path):
    for seed, base, close, far, other in (
        (1, 40.0, 40.2, 41.5, 40.9),
        (2, 40.5, 40.6, 41.9, 41.6),
        (3, 40.2, 40.5, 41.7, 41.2),
    ):
        write_record(tmp_path, f"base-s{seed}", seed, base)
        write_record(tmp_path, f"close-s{seed}", seed, close, recipe="close", lr=0.003)
        write_record(tmp_path, f"far-s{seed}", seed, far, recipe="far", lr=0.004)
        write_record(tmp_path, f"other-s{seed}", seed, other, recipe="other", lr=0.006, cpus=("B",))
    write_record(tmp_path, "one-s1", 1, 45.0, recipe="one", lr=0.005, cpus=("Other CPU",))
    base = {"label": "default", "records": ["base-s1", "base-s2", "base-s3"]}

    def arm(name, seeds=(1, 2, 3)):
        return {"label": name, "records": [f"{name}-s{s}" for s in seeds]}

    def comparison(name, question="lr", seeds=(1, 2, 3)):
        return {"question": question, "case": name, "baseline": base, "candidate": arm(name, seeds)}

    comparisons = [
        comparison("close"),
        comparison("far"),
        comparison("other", question="machines"),
        comparison("one", seeds=(1,)),
    ]
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"comparisons": comparisons}))
    page = results_page(load_records(tmp_path))
    section = page.split("## Comparisons")[1].split("\n## ")[0]
    lr, machines = section.split("### lr")[1].split("### machines")
    assert "| close | default | 1, 2, 3 | 40.23 ± 0.25 |" in lr
    # paired: differences 0.2, 0.1, 0.3, t(2) = 4.303 × 0.1 / √3 = 0.248: a tie; where
    # 2 × SE of the means (0.38) would have said the same, at 0.25 it is closer
    assert "| close | 1, 2, 3 | 40.43 ± 0.21 | +0.20 | ±0.25 (paired t, df 2) | tie |" in lr
    assert "| far | 1, 2, 3 | 41.70 ± 0.20 | +1.47 | ±0.14 (paired t, df 2) | lead |" in lr
    # another machine: Welch's t, at Welch-Satterthwaite's degrees of freedom
    assert (
        "| other | 1, 2, 3 | 41.23 ± 0.35 | +1.00 | ±0.72 (Welch t, df 3.63) | lead, unpaired |"
        in machines
    )
    assert "| one | 1 | 45.00 | +4.77 | – | not judged (1 seed), unpaired |" in lr
    assert lr.count("| case | arm |") == 1 and machines.count("| case | arm |") == 1  # a table each
    del comparisons[1]["case"]
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"comparisons": comparisons}))
    with pytest.raises(RecordError, match="comparison 2: needs a question and a case"):
        results_page(load_records(tmp_path))
    comparisons[1]["case"] = "far"
    comparisons[0]["candidate"]["records"][0] = "clsoe-s1"
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"comparisons": comparisons}))
    with pytest.raises(RecordError, match="comparison 1 candidate: no record 'clsoe-s1'"):
        results_page(load_records(tmp_path))


def test_runs_of_code_no_commit_names_are_never_paired(tmp_path):
    """Two arms on one machine with the same seeds pair, unless a run's trainer is unknown
    (code with uncommitted changes, or a commit git does not know): Welch's t then."""
    for seed, base, cand in ((1, 40.0, 40.2), (2, 40.5, 40.6), (3, 40.2, 40.5)):
        write_record(tmp_path, f"base-s{seed}", seed, base)
        write_record(tmp_path, f"cand-s{seed}", seed, cand, recipe="cand", lr=0.003)
        for trainer in ("unknown", "unknown + test trainer"):
            name = f"dirty{len(trainer)}"
            write_record(tmp_path, f"{name}-s{seed}", seed, cand, recipe=name, trainer=trainer)
            write_record(
                tmp_path, f"{name}b-s{seed}", seed, base, recipe=f"{name}b", lr=0.1, trainer=trainer
            )

    def comparison(base: str, cand: str) -> dict:
        def arm(name: str) -> dict:
            return {"label": name, "records": [f"{name}-s{s}" for s in (1, 2, 3)]}

        return {"question": "q", "case": cand, "baseline": arm(base), "candidate": arm(cand)}

    specs = [
        comparison("base", "cand"),
        comparison("dirty7b", "dirty7"),
        comparison("dirty22b", "dirty22"),
    ]
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"comparisons": specs}))
    section = results_page(load_records(tmp_path)).split("## Comparisons")[1]
    assert "| cand | 1, 2, 3 | 40.43 ± 0.21 | +0.20 | ±0.25 (paired t, df 2) | tie |" in section
    for name in ("dirty7", "dirty22"):
        row = next(line for line in section.splitlines() if line.startswith(f"|  | {name} |"))
        assert "(Welch t," in row and "unpaired" in row, row


def test_a_comparison_of_one_set_of_weights_with_itself_is_refused(tmp_path):
    """Two arms that scored the same weights (one sha256: a candidate that changed nothing
    before the step both scored) cannot differ: the render refuses the comparison."""
    write_record(tmp_path, "base-s1", 1, 40.0, sha256="ab" * 32)
    write_record(tmp_path, "same-s1", 1, 40.0, recipe="same", lr=0.003, sha256="ab" * 32)
    write_record(tmp_path, "moved-s1", 1, 40.0, recipe="moved", lr=0.004, sha256="cd" * 32)
    comparisons = [
        {
            "question": "q",
            "case": name,
            "baseline": {"label": "default", "records": ["base-s1"]},
            "candidate": {"label": name, "records": [f"{name}-s1"]},
        }
        for name in ("moved", "same")
    ]
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"comparisons": comparisons}))
    with pytest.raises(RecordError, match="comparison 2: both arms scored the same weights"):
        results_page(load_records(tmp_path))
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump({"comparisons": comparisons[:1]}))
    assert "| moved | 1 | 40.00 | +0.00 | – | not judged (1 seed) |" in results_page(
        load_records(tmp_path)
    )


def test_the_t_quantile_is_students_at_any_degrees_of_freedom():
    from experiments.records.stats import t_quantile

    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (1e6, 1.960)):
        assert t_quantile(df) == pytest.approx(t, abs=1e-3)
    stats = pytest.importorskip("scipy.stats")
    for df in (1.06, 2.5, 3.56, 7.3):
        assert t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)


def test_the_machine_names_the_cpus_bf16_flags(tmp_path):
    """One model name covers hosts with AMX, with AVX512-BF16 and with neither: the flags
    are part of the machine, so runs on two of them are not paired."""
    out = write_record(tmp_path, "base-s1", 1, 40.0)
    segment = {"cpu": "AMD EPYC", "device": "cpu", "threads": 1, "precision": "bf16 autocast"}
    for flags, shown in (
        (["avx512_bf16"], "AMD EPYC (avx512_bf16), bf16 autocast, 1 thread"),
        ([], "AMD EPYC (no bf16 flags), bf16 autocast, 1 thread"),
        (None, "AMD EPYC (bf16 flags not recorded), bf16 autocast, 1 thread"),
    ):
        with_flags = segment if flags is None else {**segment, "cpu_bf16_flags": flags}
        (out / "environment.json").write_text(json.dumps({"segments": [with_flags]}))
        assert load_training(out).machine == shown


def test_every_committed_record_names_its_trainer_as_numerics_yaml_decides(tmp_path):
    from experiments.records import RESULTS
    from experiments.records.compare import load_numerics, record_trainer, trainer_of_run

    numerics = load_numerics(RESULTS)
    names = {e["trainer"] for e in numerics}
    for folder in sorted(RESULTS.glob("*/record.json")):
        record = json.loads(folder.read_text())
        assert record.get("trainer") in names | {"unknown"}, folder.parent.name
        # as numerics.yaml decides today (its commits and precision), where git knows them
        now = record_trainer(folder.parent, numerics)
        if "unknown" not in now:
            assert record["trainer"] == now, f"{folder.parent.name}: relabel it {now!r}"
    # the segments' commits decide, where git knows them: before and after the mask change
    first, masks = numerics[0]["trainer"], numerics[1]
    env = {"segments": [{"git_commit": masks["since"]}]}
    assert trainer_of_run(env, numerics) == masks["trainer"]
    env["segments"].insert(0, {"git_commit": None})
    assert trainer_of_run(env, numerics) == f"unknown + {masks['trainer']}"
    assert first == "F.dropout masks"


def parent_or_skip(commit: str) -> str:
    """The parent of a commit numerics.yaml names; a skip where this history lacks it."""
    parent = subprocess.run(
        ["git", "rev-parse", f"{commit}~1"],
        cwd=REPO, capture_output=True, text=True, env=child_env(),
    ).stdout.strip()  # fmt: skip
    if not parent:
        pytest.skip("this checkout's history does not hold the commit numerics.yaml names")
    return parent


def trainer_in(commit: str, precision: str, numerics: list[dict]) -> str:
    """The trainer of a one-segment run at ``commit`` in ``precision``."""
    from experiments.records.compare import trainer_of_run

    segment = {"git_commit": commit, "precision": precision}
    return trainer_of_run({"segments": [segment]}, numerics)


def test_the_packed_attention_projection_is_a_change_of_every_precision(tmp_path):
    """e0b2d2d moved fp32's numbers too (experiments/results/numerics_e0b2d2d_fp32.json): a
    run of any precision from it on is another trainer than one from its parent. An entry
    naming a precision environment.json never writes is refused."""
    from experiments.records import RESULTS
    from experiments.records.compare import load_numerics
    from seq2seq.run.precision import PRECISIONS

    numerics = load_numerics(RESULTS)
    packed = next(e["since"] for e in numerics if "packed attention" in e["trainer"])
    parent = parent_or_skip(packed)

    def trainer(commit: str, precision: str) -> str:
        return trainer_in(commit, precision, numerics)

    for precision in PRECISIONS:
        after, before = trainer(packed, precision), trainer(parent, precision)
        assert after.endswith("packed attention projections") and before != after, precision
    (tmp_path / "numerics.yaml").write_text("- {since: null, trainer: t, precision: fp16}\n")
    with pytest.raises(RecordError, match="one of bf16 autocast, fp32, fp32, TF32"):
        load_numerics(tmp_path)


def test_the_h200_main_jobs_are_labelled_by_the_code_that_ran():
    """The copy's stale .git named 85f06ab; the code that ran had the packed attention
    projections (its environment.json holds what only that code writes), and its label
    says so."""
    from experiments.records import RESULTS
    from experiments.records.compare import load_numerics, trainer_of_run

    numerics = load_numerics(RESULTS)
    for job, trainer in (
        ("main-job-2min-bf16", "16-bit dropout masks, float32 scale in bf16, packed attention"),
        ("main-job-3min-tf32", "16-bit dropout masks, packed attention"),
    ):
        environment = json.loads(
            (RESULTS / "gpu-check-h200" / job / "environment.json").read_text()
        )
        [segment] = environment["segments"]
        assert {"sdpa_kernels", "tf32_matmul"} <= segment.keys()  # written from e0b2d2d on
        assert segment["git_commit_recorded"].startswith("85f06ab")
        found = trainer_of_run(environment, numerics)
        if found == "unknown":
            pytest.skip("this checkout's history does not hold the commits the records name")
        assert found == trainer + " projections", job


def test_a_run_from_uncommitted_code_has_no_trainer_its_commit_names():
    """A dirty tree's numbers are no commit's: its trainer is unknown (and never paired),
    clean or not recorded (records before the flag) its commit decides."""
    from experiments.records import RESULTS
    from experiments.records.compare import load_numerics, trainer_of_run

    numerics = load_numerics(RESULTS)
    masks = numerics[1]

    def trainer(**segment) -> str:
        return trainer_of_run({"segments": [{"git_commit": masks["since"], **segment}]}, numerics)

    assert trainer(git_dirty=True) == "unknown"
    assert trainer(git_dirty=False) == trainer() == masks["trainer"]


def test_a_change_of_one_precision_relabels_only_the_runs_in_it():
    """15bbc8d moved bf16's dropout scale and left fp32's numbers as they were: a bf16 run
    from it on is another trainer, an fp32 run is the trainer before it, and so is a bf16 run
    from its parent."""
    from experiments.records import RESULTS
    from experiments.records.compare import load_numerics

    numerics = load_numerics(RESULTS)
    scale = next(e for e in numerics if e.get("since", "") and e["since"].startswith("15bbc8d"))
    before = next(e for e in numerics if e["trainer"] == "16-bit dropout masks")["trainer"]

    def trainer(commit: str, precision: str) -> str:
        return trainer_in(commit, precision, numerics)

    parent = parent_or_skip(scale["since"])
    assert trainer(scale["since"], "bf16 autocast") == scale["trainer"]
    assert trainer(scale["since"], "fp32") == before
    assert trainer(parent, "bf16 autocast") == before


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lowercased, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PROSE)
def test_a_link_into_results_md_names_one_of_its_headings(page):
    """User pages link the evidence in docs/results.md by heading: a renamed question or
    section would leave the link at the top of the page."""
    results = (REPO / "docs/results.md").read_text(encoding="utf-8")
    anchors = {_slug(m) for m in re.findall(r"^#+ (.+)$", results, flags=re.M)}
    text = (REPO / page).read_text(encoding="utf-8")
    for anchor in re.findall(r"results\.md#([\w\-]+)", text):
        assert anchor in anchors, f"{page}: results.md#{anchor} is no heading of results.md"


def test_a_question_says_what_it_asks_above_its_table(tmp_path):
    write_record(tmp_path, "base-s1", 1, 40.0)
    write_record(tmp_path, "cand-s1", 1, 39.0, recipe="cand", lr=0.003)
    comparison = {
        "question": "Does cand help?",
        "case": "de→en",
        "baseline": {"label": "default", "records": ["base-s1"]},
        "candidate": {"label": "cand", "records": ["cand-s1"]},
    }
    goals = {"comparisons": [comparison], "about": {"Does cand help?": "Why it might."}}
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump(goals))
    assert "### Does cand help?\n\nWhy it might.\n\n| case |" in results_page(
        load_records(tmp_path)
    )
    goals["about"] = {"Does cnad help?": "Why it might."}
    (tmp_path / "goals.yaml").write_text(yaml.safe_dump(goals))
    with pytest.raises(RecordError, match="about maps a comparison's question"):
        load_records(tmp_path)


def test_the_measurements_behind_the_user_pages_name_their_records():
    """Each measurement a user page links is rendered from its committed record, named
    beside it, with the command that wrote it."""
    from experiments.records.notes import NOTES, notes_section

    section = notes_section()
    for title, paths, _ in NOTES:
        part = section.split(f"### {title}\n")[1].split("\n### ")[0]
        assert all(f"`{path}`" in part for path in paths) and "Command" in part, title
