"""experiments/device_check.py, the check a lent GPU runs in one call: its stage runner (a stage
cut at its deadline with everything it started, the next one run, the record saved after
each), its ``--cpu`` dry run with ``--only``, the wheels it unpacks, the rates it pairs, and
the render of its record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from helpers import child_env

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments.stages import Stage, run_stages  # noqa: E402

SCRIPT = REPO / "experiments" / "device_check.py"
DRY_RECORD = REPO / "tests" / "data" / "device_check_dry_run.json"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent to read it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_stage_past_its_deadline_is_cut_with_what_it_started_and_the_next_one_runs(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    starts_a_server = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('begun', flush=True); "
        "time.sleep(60)"
    )
    stages = [
        Stage("slow", [sys.executable, "-c", starts_a_server], deadline=2),
        Stage("after", [sys.executable, "-c", "print('ran')"], deadline=10),
        Stage("needs slow", [sys.executable, "-c", "pass"], deadline=10, needs=["slow"]),
    ]
    results: dict[str, dict] = {}
    saved: list[dict] = []
    began = time.monotonic()
    run_stages(stages, results, lambda: saved.append(dict(results)), lambda: 100.0)
    assert time.monotonic() - began < 15
    assert results["slow"]["status"] == "timed out" and results["slow"]["tail"] == ["begun"]
    assert not alive(int(pid_file.read_text()))  # the stage's own child went with it
    assert results["after"]["status"] == "passed" and results["after"]["tail"] == ["ran"]
    assert results["needs slow"] == {"status": "skipped", "why": "needs slow"}
    assert [list(s) for s in saved] == [["slow"], ["slow", "after"], list(results)]


def test_wheels_are_unpacked_onto_the_stages_path_without_pip(tmp_path, monkeypatch):
    from experiments.device_check import unpack_wheels

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "probe-1.0-py3-none-any.whl", "w") as z:
        z.writestr("probe_pkg/__init__.py", "VALUE = 7\n")
        z.writestr("probe_pkg-1.0.dist-info/METADATA", "Name: probe_pkg\nVersion: 1.0\n")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert unpack_wheels(wheels, tmp_path / "deps") == ["probe-1.0-py3-none-any.whl"]
    assert os.environ["PYTHONPATH"] == f"{tmp_path / 'deps'}{os.pathsep}/elsewhere"
    done = subprocess.run(
        [sys.executable, "-c", "import probe_pkg; print(probe_pkg.VALUE)"],
        capture_output=True, text=True, env=child_env(), timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "7", done.stderr
    assert unpack_wheels(tmp_path / "none", tmp_path / "deps") == []


def test_abba_blocks_pair_every_arm_twice_and_ratios_come_per_pair():
    from experiments.device_measure import abba_order, rates_summary

    assert abba_order(["a", "b", "c"], 2) == [
        *[(0, x) for x in "abccba"],
        *[(1, x) for x in "abccba"],
    ]
    rates = {"a": [100.0, 110.0, 200.0, 220.0], "b": [150.0, 165.0, 100.0]}  # pair 1 of b: half
    blocks = [
        {"pair": i // 2, "arm": arm, "tokens_per_s": r}
        for arm, rs in rates.items()
        for i, r in enumerate(rs)
    ]
    found = rates_summary(blocks, ["a", "b"])
    assert found["pairs"] == [{"pair": 0, "a": 105.0, "b": 157.5}]  # pair 1 is not whole
    assert found["ratios"]["b"]["per_pair"] == [1.5] and found["ratio_to"] == "a"
    assert found["median_tokens_per_s"] == {"a": 155.0, "b": 150.0}


def test_an_arm_the_config_refuses_is_recorded_with_its_message():
    from experiments.device_measure import precision_arms
    from experiments.stages import dry_run

    accepted, refused = precision_arms(dry_run(), ("tf32", "no-such-precision"))
    assert list(accepted) == ["tf32"] and accepted["tf32"].train.precision == "tf32"
    assert list(refused) == ["no-such-precision"]
    assert "train.precision must be" in refused["no-such-precision"]


def dry_run(out: Path, scratch: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--cpu", "--out", str(out), "--scratch", str(scratch)]
    return subprocess.run(
        [*command, *flags], capture_output=True, text=True, timeout=300, env=child_env()
    )


@pytest.mark.slow  # two dry-run calls; the profile stage imports torch and trains
def test_the_dry_run_cuts_a_stage_runs_the_next_and_reruns_one_alone(tmp_path):
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    done = dry_run(out, scratch, "--only", "env,profile", "--deadline", "env=1")
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "benchmark.json").read_text())
    stages = record["stages"]
    assert list(stages) == ["env", "profile"] and record["dry_run_on_cpu"]
    assert stages["env"]["status"] == "timed out" and stages["env"]["deadline_s"] == 1
    profile = stages["profile"]
    assert profile["status"] == "passed", profile["tail"]
    assert profile["steps"] == 3 and profile["top_cpu"][0]["self_cpu_ms"] > 0
    assert profile["top_device"] == profile["sync_debug"] == "skipped (no cuda)"
    with tarfile.open(out / "files.tar.gz") as tar:
        names = tar.getnames()
    assert "logs/profile.log" in names and "profile-tables/top20_self_cpu_time_total.txt" in names
    assert not any(n.endswith(".safetensors") or n.startswith("profile/data/") for n in names)
    assert all(name in done.stdout for name in stages)

    again = dry_run(out, scratch, "--only", "env", "--deadline", "env=1")
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = json.loads((out / "benchmark.json").read_text())
    assert rerun["rerun"] == ["env"] and rerun["stages"]["profile"] == profile  # kept


def test_only_names_stages_it_has(tmp_path):
    done = dry_run(tmp_path / "out", tmp_path / "scratch", "--only", "env,bench")
    assert done.returncode == 2 and "--only: no stage bench" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_dry_runs_record_renders_as_a_device_check_section(tmp_path):
    # The committed record of a whole dry run (python experiments/device_check.py --cpu):
    # every stage passed, the GPU's parts skipped; and the same with a GPU's fields put in.
    from experiments.records.render import load_records, results_page

    record = json.loads(DRY_RECORD.read_text())
    gpu = json.loads(DRY_RECORD.read_text())
    gpu["dry_run_on_cpu"] = False
    gpu["stages"]["env"]["nvidia_smi"] = {"name": "NVIDIA H200", "clocks.sm": "1980 MHz"}
    profile = gpu["stages"]["profile"]
    profile["top_device"] = profile["top_cpu"]
    profile["sync_debug"] = {"per_step": 1.0, "sites": [{"site": "trainer.py:341", "count": 5}]}
    for name, value in (("dry", record), ("gpu", gpu)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "benchmark.json").write_text(json.dumps(value))
    page = results_page(load_records(tmp_path)).split("## On a GPU: device_check")[1]
    dry, lent = page.split("### gpu")
    assert "**A dry run on the CPU" in dry and "**A dry run" not in lent
    for stage in ("env", "rates", "profile", "main", "readme", "torchrun"):
        assert f"| {stage} | passed |" in dry
    assert "tf32-graphs refused by the config" in dry and "bf16 / tf32" in dry
    assert "GPU busy" not in dry and "no GPU read by nvidia-smi" in dry
    assert "NVIDIA H200" in lent and "GPU busy" in lent and "(first at trainer.py:341)" in lent
    assert "| serve | passed |" in dry and "| NCCL calls, one rank | passed |" in dry


def test_a_stage_is_skipped_with_the_reason_stage_0_gives():
    from experiments.device_check import blocked

    env_stage, rates = (Stage(name, ["true"], 1) for name in ("env", "rates"))
    no_torch = {"cuda": True, "imports": {"torch": {"error": "ModuleNotFoundError: torch"}}}
    assert blocked(rates, no_torch, cpu=False) == "needs torch, which did not import"
    assert blocked(env_stage, no_torch, cpu=False) is None
    no_gpu = {"cuda": False, "imports": {"torch": {"version": "2.11"}}}
    assert blocked(rates, no_gpu, cpu=False) == "no CUDA device here"
    assert blocked(rates, no_gpu, cpu=True) is None  # the dry run wants none
    assert blocked(rates, {}, cpu=False) is None  # stage 0 cut: nothing known, nothing skipped


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_check_stopped_by_sigterm_ends_the_stage_it_was_running(tmp_path):
    # A call's time limit stops the check with SIGTERM: the stage's group must go too, or a
    # training would run on, holding the GPU, into the next call.
    pid_file = tmp_path / "stage.pid"
    stage = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    check = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        "from experiments.stages import Stage, run_stages; "
        f"run_stages([Stage('slow', [sys.executable, '-c', {stage!r}], 60)], {{}}, "
        "lambda: None, lambda: 100.0)"
    )
    with subprocess.Popen([sys.executable, "-c", check], env=child_env()) as driver:
        began = time.monotonic()
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() - began < 30, "the stage never started"
            time.sleep(0.05)
        driver.terminate()
        assert driver.wait(timeout=30) == 128 + 15
    assert not alive(int(pid_file.read_text()))


def test_main_set_reaches_the_main_jobs_child(tmp_path):
    """--main-set passes a setting to every stage's child, whose main job trains with it (a
    second call can train the main job captured: train.cuda_graphs=true)."""
    from experiments.device_check import parse_args, stages

    args = parse_args(["--out", str(tmp_path), "--main-set", "train.cuda_graphs=true"])
    (main,) = [s for s in stages(args) if s.name == "main"]
    at = main.command.index("--main-set")
    assert main.command[at + 1] == "train.cuda_graphs=true"
    assert parse_args(main.command[2:]).main_set == ["train.cuda_graphs=true"]
