"""Every experiment script runs end to end in ``--quick`` mode (tiny models on data/sample),
so the scripts cannot rot between full runs. The four run at once, one torch thread each,
and each writes its README, results and figures into a temporary folder. Each committed
README is its template filled from the committed results, so neither can drift."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import child_env
from matplotlib.image import imread

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("length_from_decoding", "attention_not_explanation", "kv_heads", "kv_cache")


def test_experiments_run_in_quick_mode(tmp_path):
    env = child_env()
    committed = {name: _readme_bytes(name) for name in EXPERIMENTS}
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                str(REPO / "experiments" / name / "run.py"),
                "--quick",
                "--out",
                str(tmp_path / name),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in EXPERIMENTS
    }
    logs = {name: p.communicate(timeout=600)[0] for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, f"{name} failed:\n{logs[name][-3000:]}"
        out = tmp_path / name
        readme = (out / "README.md").read_text(encoding="utf-8")
        assert "--quick" in readme and "## Reproduce" in readme
        json.loads((out / "results.json").read_text(encoding="utf-8"))
        figures = sorted(out.glob("*.png"))
        assert figures, f"{name} wrote no figure"
        for figure in figures:
            assert imread(figure).ndim == 3
        assert _readme_bytes(name) == committed[name], f"--quick touched {name}/README.md"

    # attention_not_explanation can analyse finished runs instead of training its own:
    # kv_heads trains two MHA seeds of one recipe.
    kv_runs = tmp_path / "kv_heads" / "runs"
    out = tmp_path / "from_models"
    script = REPO / "experiments" / "attention_not_explanation" / "run.py"
    models = [str(kv_runs / "mha"), str(kv_runs / "mha-seed2")]
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(out), "--models", *models],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["seeds"] == [1, 2] and not results["trained_here"]
    assert all(results["training"][s]["weights"].startswith(("step ", "average")) for s in "12")
    assert "no training: --models" in (out / "README.md").read_text(encoding="utf-8")
    with pytest.raises(SystemExit, match="same train.seed"):
        _experiment("attention_not_explanation").seeded_runs([Path(models[0])] * 2)


def _experiment(name: str):
    """``experiments/NAME/run.py`` as a module (it puts experiments/ on sys.path)."""
    here = REPO / "experiments" / name
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", here / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    return run


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_committed_readme_is_its_template_filled_from_results(name):
    here = REPO / "experiments" / name
    run = _experiment(name)
    from common import readme

    assert readme(here, here, run.readme_values) == (here / "README.md").read_text(
        encoding="utf-8"
    ), f"{name}/README.md differs from its template: run.py --readme-only rewrites it"


# Conclusions whose figures are all placeholders (``{field}``) filled from the experiment's
# results, as the rest of its README is: a figure typed into one would go stale unseen.
RENDERED_CONCLUSIONS = ("kv_heads", "kv_cache")
# A measured figure: decimals, thousands, or a count of times or milliseconds.
_FIGURE = re.compile(r"\d[\d,]*\.\d|\d,\d{3}|\d\s*(?:×|ms\b)")


@pytest.mark.parametrize("name", RENDERED_CONCLUSIONS)
def test_a_conclusion_quotes_only_figures_its_results_fill_in(name):
    text = (REPO / "experiments" / name / "conclusion.md").read_text(encoding="utf-8")
    prose = re.sub(r"\{[^{}]*\}|`[^`]*`", "", text)  # placeholders; code (commands, formulas)
    assert not _FIGURE.findall(prose), f"{name}/conclusion.md types figures in"


def test_kv_heads_verdict_weighs_a_difference_against_the_mha_seeds_spread():
    kv = _experiment("kv_heads")
    tight = [36.0, 36.4, 36.2]  # sd 0.2: a further seed lands within ±0.99 of 36.2
    assert kv.seed_band(tight) == pytest.approx(4.303 * 0.2 * (4 / 3) ** 0.5)
    assert kv.verdict(tight, 36.9) == "no difference beyond seed noise"
    assert kv.verdict(tight, 37.5) == "different: higher"
    assert kv.verdict(tight, 35.0) == "different: lower"
    assert kv.verdict([35.0, 36.0, 37.0], 37.5) == "no difference beyond seed noise"  # sd 1.0
    assert kv.verdict(tight[:2], 40.0) == "needs ≥ 3 MHA seeds; rerun pending"
    rows = [
        {"variant": name, "test_bleu": bleu}
        for name, bleu in (("mha", 36.0), ("mha-seed2", 36.4), ("gqa2", 37.5), ("mha-seed3", 36.2))
    ]
    lines = kv.verdict_lines(rows)
    assert "The 3 mha seed(s): 36.00, 36.40, 36.20; mean 36.20" in lines
    assert "- gqa2: 37.50, +1.30 against the mha mean: different: higher" in lines


def test_kv_heads_refuses_a_model_trained_to_another_budget():
    kv = _experiment("kv_heads")
    kv.check_budget({"mha": {"steps": 2142, "weights": "step 2142"}}, 2142)
    with pytest.raises(SystemExit, match="trained 1666 steps"):
        kv.check_budget({"mha": {"steps": 1666, "weights": "step 1666"}}, 2142)
    with pytest.raises(SystemExit, match="scored average"):
        kv.check_budget({"mha": {"steps": 2142, "weights": "average of steps 1190–2142"}}, 2142)


def _readme_bytes(name: str) -> bytes | None:
    path = REPO / "experiments" / name / "README.md"
    return path.read_bytes() if path.exists() else None


def test_bench_train_profile_says_where_the_step_time_goes_and_records_it(tmp_path):
    script = REPO / "experiments" / "bench_train.py"
    out = tmp_path / "results" / "profile" / "benchmark.json"
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--profile", "2", "--threads", "1"]
        + ["--json", str(out)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.split("self CPU time by kind:\n")[1].splitlines()
    shares = {line[:24].strip(): float(line[24:].rstrip("%")) for line in summary if line}
    assert shares["matrix multiplies"] > 0 and "other" in shares
    assert sum(shares.values()) == pytest.approx(100, abs=0.5)
    # the record holds what was printed; the results page renders it
    profile = json.loads(out.read_text())["profile"]
    assert {k: round(100 * v, 1) for k, v in profile["shares"].items()} == shares
    sys.path.insert(0, str(REPO))
    from experiments.records.render import load_records, results_page

    page = results_page(load_records(tmp_path / "results"))
    section = page.split("## Where a training step's time goes")[1].split("\n## ")[0]
    assert f"| matrix multiplies | {profile['shares']['matrix multiplies']:.1%} |" in section
    assert f"| `{profile['operators'][0]['name']}` |" in section and "--quick" in section


def bench_record(tmp_path: Path, script: str, *args: str) -> tuple[dict, str]:
    """``experiments/SCRIPT ARGS --quick --threads 1 --json ...``: its record, and the results
    page rendered from it."""
    out = tmp_path / "results" / Path(script).stem / "benchmark.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "experiments" / script), *args, "--quick", "--threads", "1"]
        + ["--json", str(out)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sys.path.insert(0, str(REPO))
    from experiments.records.render import load_records, results_page

    return json.loads(out.read_text()), results_page(load_records(tmp_path / "results"))


def test_bench_train_json_is_a_record_the_render_turns_into_a_speed_table(tmp_path):
    record, page = bench_record(tmp_path, "bench_train.py", "--muon-ns-steps", "3")
    assert record["environment"]["threads"] == 1 and record["environment"]["cpu"]
    speed = page.split("## Training speed")[1]
    ours = record["results"][0]
    assert f"| seq2seq | {ours['tokens_per_s']:,.0f} |" in speed
    assert f"{record['speedup_vs_best_reference']:.2f}×" in speed and "--quick" in speed
    # Muon's step against Adam's, by pairs of rounds (--quick: 2 rounds, one pair)
    muon = next(r for r in record["results"] if r["model"].startswith("seq2seq, Muon"))
    assert muon["model"] == "seq2seq, Muon, 3 Newton–Schulz steps"
    ratio = sum(ours["tokens_per_s_rounds"]) / sum(muon["tokens_per_s_rounds"])
    assert f"- {muon['model']} / seq2seq: {ratio:.2f}× the seconds a step, median of 1 " in speed
    # what the count is: profiler events (views and wrapping operators among them), not kernels
    events = ours["profiler_events_per_step"]
    assert events > 0 and "| profiler events/step |" in speed and f"| {events} |" in speed


def test_bench_masks_records_both_masks_memory_and_the_render_shows_it(tmp_path):
    record, page = bench_record(tmp_path, "bench_masks.py", "memory")
    ours, theirs = record["masks"]
    assert (ours["mask"], theirs["mask"]) == ("layers.Dropout", "F.dropout")
    assert 0 < ours["saved_mb"] < theirs["saved_mb"]  # a boolean mask, where F.dropout's is not
    section = page.split("## Dropout masks: training memory")[1]
    assert f"| layers.Dropout | {ours['peak_rss_mb']:,.0f} | {ours['saved_mb']:,.1f} |" in section
    assert "--quick" in section


def test_bench_memory_records_rss_at_two_step_counts_and_the_render_shows_it(tmp_path):
    record, page = bench_record(tmp_path, "bench_memory.py")
    assert record["steps"] == [5, 10] and set(record["memory"]) == {"5", "10"}
    peaks = [record["memory"][s]["peak_rss_mb"] for s in ("5", "10")]
    assert 0 < peaks[0] <= peaks[1]  # a peak never falls
    assert record["peak_growth_mb_per_step"] == (peaks[1] - peaks[0]) / 5
    section = page.split("## Memory through a training run")[1].split("\n## ")[0]
    assert f"| 10 | {peaks[1]:,.0f} |" in section and "--quick" in section


def run_bench_feed(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "bench_feed.py"), "--quick", "--threads", "1"]
        + ["--json", str(out), *extra],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(out.read_text())


def test_bench_feed_times_the_trainer_loop_with_and_without_prefetching(tmp_path):
    done, record = run_bench_feed(tmp_path / "feed.json")
    assert len(record["ratios"]) == record["rounds"] == 2
    assert set(record["ms_per_step"]) == {"prefetch 0", "prefetch 2"}
    assert all(ms > 0 for ms in record["ms_per_step"].values())
    assert f"{record['ratio_prefetch_2_over_0']:.3f} (median ratio)" in done.stdout


def test_bench_feed_times_the_step_beside_subword_sampling(tmp_path):
    done, record = run_bench_feed(tmp_path / "feed.json", "--subword-alpha", "0.1")
    assert len(record["ratios"]) == record["rounds"] == 2
    assert set(record["ms_per_step"]) == {"alone", "sampling beside"}
    assert record["sample_epoch_s"] > 0 and record["pairs"] == 40
    assert f"{record['ratio_sampling_over_alone']:.3f} (median ratio)" in done.stdout


def test_train_all_keeps_finished_runs_and_resumes_killed_ones(tmp_path):
    # With reuse, an experiment spans sessions: a finished run is left as it is, a run that
    # was killed continues from its last state, and without reuse everything starts afresh.
    sys.path.insert(0, str(REPO / "experiments"))
    from common import train_all

    from seq2seq.run.checkpoint import read_tensors, write_tensors
    from tests.test_train import read_metrics, tiny_config

    configs = {name: tiny_config(train__max_steps=4) for name in ("done", "killed")}
    train_all(configs, tmp_path, reuse=False, jobs=1)
    last = tmp_path / "killed" / "last.safetensors"
    tensors, state = read_tensors(last)
    write_tensors(last, tensors, {**state, "finished": False})  # as a kill leaves it
    kept = (tmp_path / "done" / "last.safetensors").stat().st_mtime_ns
    configs["killed"] = tiny_config(train__max_steps=6)
    train_all(configs, tmp_path, reuse=True, jobs=1)
    assert (tmp_path / "done" / "last.safetensors").stat().st_mtime_ns == kept
    assert [r["step"] for r in read_metrics(tmp_path / "killed", "start")] == [0, 4]
    assert read_tensors(last)[1]["step"] == 6 and read_tensors(last)[1]["finished"]
    train_all(configs, tmp_path, reuse=False, jobs=1)
    assert [r["step"] for r in read_metrics(tmp_path / "killed", "start")] == [0]


def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the check would run")
    script = REPO / "experiments" / "gpu_check.py"
    done = subprocess.run(
        [sys.executable, str(script), "--json", str(tmp_path / "record.json")],
        capture_output=True, text=True, timeout=300, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no GPU is present" in done.stderr and not (tmp_path / "record.json").exists()


def test_gpu_check_dry_run_records_a_failing_stage_and_goes_on_within_its_time(tmp_path):
    # A stage made to fail, and a total too short for the rest: each is recorded, the
    # record is written, the summary names every stage, and the check itself succeeds.
    script = REPO / "experiments" / "gpu_check.py"
    record_path = tmp_path / "record.json"
    command = [sys.executable, str(script), "--cpu", "--fail", "planted", "--total", "20"]
    done = subprocess.run(
        [*command, "--json", str(record_path)],
        capture_output=True, text=True, timeout=300, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(record_path.read_text())
    stages = record["stages"]
    assert stages["made to fail: planted"]["status"] == "failed"
    assert {s["status"] for s in stages.values()} <= {"passed", "failed", "timed out", "skipped"}
    assert any(s["status"] in ("timed out", "skipped") for s in stages.values())
    assert record["seconds"] < 60 and record["environment"]["device"] == "cpu"
    assert all(name in done.stdout for name in stages)
