"""experiments/scale runs end to end in ``--quick`` mode (one tiny corpus, a tiny model),
writes seeded corpora, and its committed README is its template filled from its results."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from helpers import child_env

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "experiments" / "scale"


def load_script():
    spec = importlib.util.spec_from_file_location("experiment_scale", HERE / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)  # puts experiments/ on sys.path, so common imports
    return run


def test_scale_runs_in_quick_mode(tmp_path):
    committed = (HERE / "README.md").read_bytes() if (HERE / "README.md").exists() else None
    done = subprocess.run(
        [sys.executable, str(HERE / "run.py"), "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    [size] = results["sizes"]
    assert size["pairs"] == 300 and size["train_pairs"] == 240  # 30 + 30 carved off
    assert size["prepare_s"] > 0 and size["store_mb"] > 0
    for run in ("fresh", "resume"):
        measured = size[run]
        assert measured["peak_rss_mb"] > 50
        # before the first step the trainer holds less than its peak after some steps
        assert 50 < measured["ready_rss_mb"] <= measured["peak_rss_mb"]
        assert 0 < measured["first_step_s"] < measured["wall_s"]
        assert measured["steps_per_s"] > 0
    access = results["access"]
    assert access["pairs"] == 240 and access["batch"] == 120
    assert access["store_ms"] > 0 and access["arrow_ms"] > 0
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "--quick" in readme and "| 300 |" in readme and "## Reproduce" in readme
    after = (HERE / "README.md").read_bytes() if (HERE / "README.md").exists() else None
    assert after == committed, "--quick touched experiments/scale/README.md"


def test_the_corpora_are_seeded_lines_of_two_joined_pairs(tmp_path):
    run = load_script()
    run.write_corpus(tmp_path / "a.tsv", 50)
    run.write_corpus(tmp_path / "b.tsv", 50)
    run.write_corpus(tmp_path / "c.tsv", 50, seed=1)
    lines = (tmp_path / "a.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "de\ten" and len(lines) == 51
    assert all(line.count("\t") == 1 for line in lines)
    assert (tmp_path / "a.tsv").read_bytes() == (tmp_path / "b.tsv").read_bytes()
    assert (tmp_path / "a.tsv").read_bytes() != (tmp_path / "c.tsv").read_bytes()


def test_committed_readme_is_its_template_filled_from_results():
    run = load_script()
    from common import readme

    assert readme(HERE, HERE, run.readme_values) == (HERE / "README.md").read_text(
        encoding="utf-8"
    ), "scale/README.md differs from its template: run.py --readme-only rewrites it"


def test_the_versions_benchmark_compares_two_checkouts(tmp_path):
    # --before . compares this checkout with itself: the script runs end to end
    out = tmp_path / "versions.json"
    done = subprocess.run(
        [sys.executable, str(HERE / "versions.py"), "--before", str(REPO), "--quick"]
        + ["--json", str(out)],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert [len(v) for v in result["each_round"].values()] == [2, 2]
    assert result["ratio_after_before"] > 0 and set(result["checkouts"]) == {"before", "after"}
    bad = subprocess.run(
        [sys.executable, str(HERE / "versions.py"), "--before", str(tmp_path)],
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "not a seq2seq checkout" in bad.stderr
