"""The suite on other machines: workers within the CPU quota, one thread a child process, and
plain pytest without pytest-xdist (tests/conftest.py, tests/helpers.py); and the training
threads sized by the same CPUs (seq2seq/run/runtime.py, experiments/common.py)."""

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import child_env

from seq2seq.run import runtime
from seq2seq.run.runtime import cgroup_cpu_quota, usable_cpus

TESTS = Path(__file__).resolve().parent
SUBPROCESS_TIMEOUT_S = 300  # importing torch alone takes ~20 s on a loaded 2-core machine


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),  # cgroup v2: 200 ms in every 100 ms
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3.0),  # v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu.max": "a lot\n"}, None),  # a file this does not read
        ({}, None),  # no cgroup files at all (macOS)
    ],
)
def test_the_cgroup_cpu_quota_is_read_from_either_cgroup_version(tmp_path, files, quota):
    assert cgroup_cpu_quota(write(tmp_path, files)) == quota


@pytest.mark.parametrize(
    ("membership", "files", "quota"),
    [
        # cgroup v2 on a host: a systemd slice's quota limits the unit inside it
        ("0::/system.slice/job.service\n", {"system.slice/cpu.max": "400000 100000\n"}, 4.0),
        (  # nested: the tightest of the process's own cgroup and those above it
            "0::/a.slice/b.slice/c.scope\n",
            {
                "a.slice/cpu.max": "300000 100000\n",
                "a.slice/b.slice/cpu.max": "max 100000\n",
                "a.slice/b.slice/c.scope/cpu.max": "150000 100000\n",
            },
            1.5,
        ),
        (
            "0::/a.slice/b.slice\n",
            {"a.slice/cpu.max": "200000 100000\n", "a.slice/b.slice/cpu.max": "600000 100000\n"},
            2.0,
        ),
        (  # cgroup v1: the cpu controller's line (a Slurm job), not the memory one's
            "5:memory:/elsewhere\n4:cpu,cpuacct:/slurm/uid_1/job_7\n0::/\n",
            {
                "cpu/slurm/uid_1/job_7/cpu.cfs_quota_us": "250000\n",
                "cpu/slurm/uid_1/job_7/cpu.cfs_period_us": "100000\n",
                "cpu/slurm/cpu.cfs_quota_us": "-1\n",
                "cpu/slurm/cpu.cfs_period_us": "100000\n",
                "elsewhere/cpu.max": "100000 100000\n",
            },
            2.5,
        ),
        # a container without a cgroup namespace: its path is not in its view, its root is
        ("0::/docker/0123abcd\n", {"cpu.max": "200000 100000\n"}, 2.0),
        ("0::/user.slice\n", {"user.slice/cpu.max": "max 100000\n"}, None),
    ],
)
def test_the_cpu_quota_is_the_tightest_of_the_processs_own_cgroup_and_those_above(
    tmp_path, membership, files, quota
):
    root = write(tmp_path / "cgroup", files)
    proc = write(tmp_path, {"proc_self_cgroup": membership}) / "proc_self_cgroup"
    assert cgroup_cpu_quota(root, proc) == quota
    without_proc = 2.0 if "cpu.max" in files else None  # macOS-like: the mount's root alone
    assert cgroup_cpu_quota(root, tmp_path / "no_proc") == without_proc


@pytest.mark.parametrize(
    ("files", "affinity", "cpus"),
    [
        ({"cpu.max": "200000 100000\n"}, 64, 2),  # a 2-CPU quota on a 64-core host
        ({"cpu.max": "150000 100000\n"}, 64, 1),  # rounded down: no worker over the quota
        ({"cpu.max": "50000 100000\n"}, 64, 1),  # at least one
        ({"cpu.max": "800000 100000\n"}, 2, 2),  # pinned to 2 cores, whatever the quota
        ({"cpu.max": "max 100000\n"}, 64, 64),
    ],
)
def test_usable_cpus_are_the_affinity_capped_by_the_quota(
    tmp_path, monkeypatch, files, affinity, cpus
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    assert usable_cpus(write(tmp_path, files)) == cpus


def test_xdist_sizes_its_workers_by_the_usable_cpus(pytestconfig, monkeypatch, tmp_path):
    """``-n auto`` asks tests/conftest.py, not xdist's count of the host's cores."""
    if not pytestconfig.pluginmanager.hasplugin("xdist"):
        pytest.skip("pytest-xdist is not installed or not loaded (-p no:xdist)")
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(runtime, "CGROUP", write(tmp_path, {"cpu.max": "200000 100000\n"}))
    assert pytestconfig.hook.pytest_xdist_auto_num_workers(config=pytestconfig) == 2


@pytest.fixture
def quota_of_one_cpu_on_64_cores(monkeypatch, tmp_path):
    """A container allowed 1 CPU on a 64-core host; torch's threads put back afterwards."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(runtime, "CGROUP", write(tmp_path, {"cpu.max": "100000 100000\n"}))
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_training_threads_stay_within_the_cpu_quota(quota_of_one_cpu_on_64_cores, monkeypatch):
    for name in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(4)  # torch's own default counts the host's cores
    runtime.setup_runtime("cpu")
    assert torch.get_num_threads() == 1
    runtime.setup_runtime("cpu", threads=3)  # asked for: given
    assert torch.get_num_threads() == 3


def test_the_experiments_share_the_usable_cpus_among_their_jobs(quota_of_one_cpu_on_64_cores):
    from experiments.common import train_threads

    args = argparse.Namespace(train_threads=None, jobs=2)
    assert train_threads(args) == 1  # not 64 // 2
    assert train_threads(argparse.Namespace(train_threads=5, jobs=2)) == 5


def test_the_suite_collects_without_xdist():
    """Plain pytest, with pytest-xdist absent: the suite's options must not need it."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "--co", "-q", "tests/test_config.py"],
        cwd=TESTS.parent,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tests collected" in done.stdout


def test_a_child_process_runs_one_thread(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert done.stdout.strip() == "1", done.stderr[-2000:]


def subprocess_calls_without_env(source: str) -> list[int]:
    """Lines of ``subprocess.run(...)``/``Popen(...)`` calls in ``source`` given no ``env``:
    their children would inherit every thread."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "subprocess"
        and node.func.attr in ("run", "Popen", "call", "check_call", "check_output")
        and not any(k.arg == "env" for k in node.keywords)
    ]


def test_every_process_the_tests_start_gets_the_child_environment():
    assert subprocess_calls_without_env("subprocess.run(['x'], env=child_env())") == []
    assert subprocess_calls_without_env("subprocess.Popen(['x'])") == [1]
    missing = {
        path.name: lines
        for path in sorted(TESTS.glob("*.py"))
        if (lines := subprocess_calls_without_env(path.read_text(encoding="utf-8")))
    }
    assert not missing, f"subprocess calls without env=child_env(...): {missing}"
    spread = [
        p.name
        for p in TESTS.glob("*.py")
        if "**os.environ" in p.read_text() and p.name not in ("helpers.py", "test_suite_setup.py")
    ]
    assert not spread, f"environments built apart from helpers.child_env: {spread}"


def test_an_xdist_worker_starts_no_workers_of_its_own(monkeypatch):
    """The hook that turns plain ``pytest`` into ``-n auto`` runs in xdist's workers too: there
    it must leave ``-n`` alone, or each worker starts workers, and they theirs."""
    import conftest

    class Option:
        numprocesses = None
        dist = "no"

    class Config:
        option = Option()
        pluginmanager = type("PM", (), {"hasplugin": staticmethod(lambda name: True)})()

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    conftest.pytest_cmdline_main(Config)
    assert (Config.option.numprocesses, Config.option.dist) == ("auto", "loadfile")
    Config.option.numprocesses, Config.option.dist = None, "no"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest.pytest_cmdline_main(Config)
    assert Config.option.numprocesses is None
