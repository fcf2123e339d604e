"""The package's import layers (pyproject.toml's import-linter contract, not model/layers.py): the
contract holds, it fails on an import that runs back up (even one hidden in a function body),
between folders on one layer, or in a cycle, and the README and the package's docstring list
the folders in its order."""

from __future__ import annotations

import re
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
            "\nfrom seq2seq.explorer import serve  # noqa\n",
            "seq2seq.model.layers -> seq2seq.explorer.serve",
        ),
        # an instrument reaching up into the faces that show it
        (
            "inspect/records.py",
            "\ndef _late():\n    from seq2seq.explorer import page  # noqa\n",
            "seq2seq.inspect.records -> seq2seq.explorer.page",
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
        # folders on one layer import none of each other
        (
            "model/transformer.py",
            "\ndef _late():\n    from seq2seq.data import tokenizer  # noqa\n",
            "seq2seq.model.transformer -> seq2seq.data.tokenizer",
        ),
        (
            "run/checkpoint.py",
            "\ndef _late():\n    from seq2seq.model import transformer  # noqa\n",
            "seq2seq.run.checkpoint -> seq2seq.model.transformer",
        ),
        (
            "inspect/influence.py",
            "\ndef _late():\n    from seq2seq.training import curves  # noqa\n",
            "seq2seq.inspect.influence -> seq2seq.training.curves",
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
    assert ".attention -> .layers" in result.stdout  # the planted import, the one to remove


def contract_layers() -> list[list[str]]:
    """The contract's layers, bottom first, each the names of its folders and modules under
    ``seq2seq`` (``data``, ``config``)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [
        [name.strip().removeprefix("seq2seq.") for name in re.split("[|:]", layer)]
        for layer in reversed(contract["layers"])
    ]


def in_contract_order(listed: list[list[str]]) -> None:
    """``listed`` (groups of names, bottom first) names every layer's folders and modules
    once (``version`` may go unnamed), never one before a name of a layer below it."""
    level = {name: n for n, layer in enumerate(contract_layers()) for name in layer}
    named = [name for group in listed for name in group]
    assert sorted(set(named) | {"version"}) == sorted(level), named
    assert len(named) == len(set(named)), named
    assert [level[n] for n in named] == sorted(level[n] for n in named), named


def test_the_readme_table_lists_the_folders_in_the_contracts_order():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("| folder | what lives there |", 1)[1].split("\n\n", 1)[0]
    first_cells = [line.split("|")[1] for line in table.strip().splitlines()[1:]]  # past |---|
    found = [re.findall(r"\[(\w+)/\]|`(\w+)\.py`", cell) for cell in first_cells]
    in_contract_order([[folder or module for folder, module in row] for row in found])


def test_the_package_docstring_lists_the_folders_in_the_contracts_order():
    import seq2seq

    listing = seq2seq.__doc__.split("bottom to top", 1)[1].split("\n\n")[1]
    heads = [re.split(r"\s{2,}", line.strip())[0] for line in listing.splitlines()]
    in_contract_order([re.findall(r"\w+", head) for head in heads])
