"""The package's layers contract (pyproject.toml, import-linter): it holds, and it fails on an
import that runs back up, even one hidden in a function body."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import child_env

REPO = Path(__file__).resolve().parents[1]
LINT = [
    sys.executable,
    "-c",
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())",
    "--no-cache",
]


def lint(root: Path) -> subprocess.CompletedProcess:
    env = child_env(PYTHONPATH=str(root))
    return subprocess.run(LINT, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def planted_copy(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package and its contract with ``line`` added to ``module``'s end."""
    shutil.copytree(
        REPO / "seq2seq", tmp_path / "seq2seq", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "seq2seq" / module
    path.write_text(path.read_text(encoding="utf-8") + line, encoding="utf-8")
    return tmp_path


def test_the_layers_contract_holds_on_the_package():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "offender"),
    [
        # the model reaching up into the server
        (
            "model/layers.py",
            "\nfrom seq2seq.inspect import serve  # noqa\n",
            "seq2seq.model.layers -> seq2seq.inspect.serve",
        ),
        # a lazy import is an import like any other
        (
            "decoding/search.py",
            "\ndef _late():\n    from seq2seq.training import trainer  # noqa\n",
            "seq2seq.decoding.search -> seq2seq.training.trainer",
        ),
        # the foundation imports no folder
        (
            "config.py",
            "\ndef _late():\n    from seq2seq.data import store  # noqa\n",
            "seq2seq.config -> seq2seq.data.store",
        ),
    ],
)
def test_an_import_that_runs_back_up_breaks_the_contract(tmp_path, module, line, offender):
    result = lint(planted_copy(tmp_path, module, line))
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and offender in result.stdout, result.stdout


def test_an_import_cycle_breaks_the_contract(tmp_path):
    # attention -> layers, while layers already imports attention
    result = lint(
        planted_copy(
            tmp_path,
            "model/attention.py",
            "\ndef _late():\n    from seq2seq.model import layers  # noqa\n",
        )
    )
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and "in seq2seq.model" in result.stdout, result.stdout
    assert ".layers -> .attention" in result.stdout
