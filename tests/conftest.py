"""Shared test setup: one torch thread, and with pytest-xdist one worker a usable CPU.

The models in tests are tiny, so a second thread buys nothing, and on a 2-core machine
shared with other work OpenMP threads that spin-wait for each other slow every op down
many times over. The processes tests start get one thread too (``helpers.child_env``).
"""

import os

import pytest
import torch

from seq2seq.run.runtime import usable_cpus

torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """With pytest-xdist installed and no ``-n`` given: ``-n auto --dist loadfile``, each test
    file whole on one worker (its module fixtures built once); on 2 cores the suite takes
    half the time. ``-n 0`` runs it in this process, as plain pytest does without xdist.
    Runs before xdist's own hook of the same name, which turns ``-n`` into workers; not in a
    worker (``PYTEST_XDIST_WORKER``), which would start workers of its own, and they theirs."""
    worker = "PYTEST_XDIST_WORKER" in os.environ
    if (
        config.pluginmanager.hasplugin("xdist")
        and config.option.numprocesses is None
        and not worker
    ):
        config.option.numprocesses = "auto"
        if config.option.dist == "no":
            config.option.dist = "loadfile"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: the CPUs this process may use, within the container's quota, not the
    host's cores (a 2-CPU quota on a 64-core host starts 2 workers importing torch, not 64).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set (xdist reads it)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return usable_cpus()


# The test files whose end-to-end tests take longest (``--durations``: training subprocesses,
# torchrun jobs, the experiments' quick runs), run first: the workers (``-n``, one test file
# each at a time) then finish together instead of one waiting on the other's last long file.
LONGEST_FIRST = (
    "test_train.py",
    "test_experiments.py",
    "test_scale_experiment.py",
    "test_robustness.py",
    "test_records.py",
    "test_docs.py",
    "test_explorer.py",
    "test_serve.py",
)


def pytest_collection_modifyitems(items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device, and this machine has none")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)

    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order


@pytest.fixture
def tf32_switch():
    """torch's TF32 switch for CUDA matrix multiplies (the current API; a CPU build has it
    too), put back after the test: it is the process's."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision
    yield matmul
    matmul.fp32_precision = saved
