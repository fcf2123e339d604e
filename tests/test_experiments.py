"""Every experiment script runs end to end in ``--quick`` mode (tiny models on data/sample),
so the scripts cannot rot between full runs. The four run at once, one torch thread each,
and each writes its README, results and figures into a temporary folder. Each committed
README is its template filled from the committed results, so neither can drift."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("length_from_decoding", "attention_not_explanation", "kv_heads", "kv_cache")


def test_experiments_run_in_quick_mode(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
    same_seed = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(out), "--models", *models[:1] * 2],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert same_seed.returncode != 0 and "same train.seed" in same_seed.stderr


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_committed_readme_is_its_template_filled_from_results(name):
    here = REPO / "experiments" / name
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", here / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)  # puts experiments/ on sys.path, so common imports
    from common import readme

    assert readme(here, here, run.readme_values) == (here / "README.md").read_text(
        encoding="utf-8"
    ), f"{name}/README.md differs from its template: run.py --readme-only rewrites it"


def _readme_bytes(name: str) -> bytes | None:
    path = REPO / "experiments" / name / "README.md"
    return path.read_bytes() if path.exists() else None


def test_bench_train_profile_says_where_the_step_time_goes():
    script = REPO / "experiments" / "bench_train.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick", "--profile", "2", "--threads", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.split("self CPU time by kind:\n")[1].splitlines()
    shares = {line[:24].strip(): float(line[24:].rstrip("%")) for line in summary if line}
    assert shares["matrix multiplies"] > 0 and "other" in shares
    assert sum(shares.values()) == pytest.approx(100, abs=0.5)
