"""Shared test setup: one torch thread.

The models in tests are tiny, so a second thread buys nothing, and on a 2-core machine
shared with other work OpenMP threads that spin-wait for each other slow every op down
many times over.
"""

import pytest
import torch

torch.set_num_threads(1)


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
