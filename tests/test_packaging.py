"""What ``pip install .`` gives: every import declared, and a wheel that finds its corpora,
trains and translates with no checkout at hand."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from helpers import TINY_RUN, child_env

REPO = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT_S = 300  # importing torch alone takes ~20 s on a loaded 2-core machine


def _distribution(requirement: str) -> str:
    name = re.split(r"[<>=!~\[;\s]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_distributions(top_level_only: bool) -> dict[str, str]:
    """The distributions the package's modules import (module level only, or anywhere), each
    with a module that imports it."""
    dists = packages_distributions()
    found = {}
    for path in sorted((REPO / "seq2seq").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "seq2seq":
                    continue
                for dist in dists.get(top, [top]):
                    found.setdefault(_distribution(dist), path.name)
    return found


def test_every_import_is_declared():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    required = {_distribution(r) for r in project["dependencies"]}
    extras = {_distribution(r) for rs in project["optional-dependencies"].values() for r in rs}
    undeclared = {
        dist: module
        for dist, module in _imported_distributions(top_level_only=True).items()
        if dist not in required
    }
    assert undeclared == {}, "imported on import of seq2seq but not in dependencies"
    optional = {
        dist: module
        for dist, module in _imported_distributions(top_level_only=False).items()
        if dist not in required | extras
    }
    assert optional == {}, "imported by a command but in neither dependencies nor an extra"


def _copy_source(dest: Path) -> Path:
    """What ``pip install .`` reads, so that building leaves the checkout untouched."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "cache", "prepared")
    for name in ("seq2seq", "data"):
        shutil.copytree(REPO / name, dest / name, ignore=skip)
    return dest


_PROBE = """
import json, sys
import seq2seq
from seq2seq.config import DataConfig
from seq2seq.data.corpora import load_corpus
from seq2seq.explorer.page import render_page

d = DataConfig()
corpus = load_corpus(d.data, d.src, d.tgt)
print(json.dumps({
    "package": seq2seq.__file__,
    "default": corpus.source_description,
    "pairs": {split: len(pairs) for split, pairs in corpus.splits.items()},
    "sample": len(load_corpus("sample", "de", "en").splits["train"]),
    "path": sys.path,
    "page": render_page([], title="t")[:15],
}))
"""


@pytest.mark.slow
def test_a_built_wheel_installed_without_the_checkout_finds_the_corpus_trains_and_translates(
    tmp_path,
):
    pytest.importorskip("setuptools", reason="pip --no-build-isolation builds with setuptools")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    source = _copy_source(tmp_path / "source")
    dist, site = tmp_path / "dist", tmp_path / "site"
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist)]
    subprocess.run([*build, str(source)], check=True, timeout=SUBPROCESS_TIMEOUT_S, env=child_env())
    [wheel] = dist.glob("seq2seq-*.whl")
    install = [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, timeout=SUBPROCESS_TIMEOUT_S, env=child_env())
    shutil.rmtree(source)  # nothing may come from the tree it was built from

    env = child_env(PYTHONPATH=str(site))
    env["SEQ2SEQ_CACHE"] = str(tmp_path / "cache")
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert Path(found["package"]).is_relative_to(site)
    assert not any(p and Path(p).resolve() == REPO for p in found["path"])
    assert str(site / "seq2seq" / "data" / "shipped" / "multi30k") in found["default"]
    assert found["pairs"] == {"train": 29000, "validation": 1014, "test": 1000}
    assert found["sample"] == 40
    assert found["page"] == "<!DOCTYPE html>"  # the explorer's templates shipped with it

    # The installed command trains a few steps on the shipped sample corpus, then translates.
    tiny = [*TINY_RUN, "train.threads=1", "train.valid_bleu_sentences=2"]
    run = tmp_path / "run"
    commands = {
        "train": ["train", "--data", "sample", "--out", str(run), "--max-steps", "3"],
        "translate": ["translate", str(run), "--verbose", "Ein Hund läuft."],
    }
    commands["train"] += ["--no-progress", *(arg for s in tiny for arg in ("--set", s))]
    done = {}
    for name, args in commands.items():
        done[name] = subprocess.run(
            [sys.executable, "-m", "seq2seq", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
        )
        assert done[name].returncode == 0, done[name].stderr[-2000:]
    assert "stopped: max_steps 3" in done["train"].stderr
    assert (run / "model.safetensors").is_file()
    assert len(done["translate"].stdout.splitlines()) == 1  # one translation for one line
    assert "line 1: source Tk=" in done["translate"].stderr


# The torch APIs the package calls that are newer than its floor, with the release that brought
# each (read in the 2.2.2, 2.3.0, 2.6.0 and 2.7.0 wheels' sources). Each is reached only
# through getattr or hasattr, or imported in a try that has a fallback, so a torch of the
# floor runs without them (train, resume, translate, evaluate, attention and torch.compile
# ran under torch 2.2.2 on CPU).
NEWER_THAN_THE_FLOOR = {
    "torch.compiler.is_compiling": "2.3",
    "torch._dynamo.exc.FailOnRecompileLimitHit": "2.6",
    "torch._inductor.exc.InductorError": "2.7",
    "torch._dynamo.config.recompile_limit": "2.7",
    "torch._dynamo.config.fail_on_recompile_limit_hit": "2.7",
}


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` sits in the body of a try that catches ImportError or AttributeError."""
    while node in parents:
        node, child = parents[node], node
        if isinstance(node, ast.Try) and child in node.body:
            caught = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if caught & {"ImportError", "AttributeError", "ModuleNotFoundError"}:
                return True
    return False


def _unguarded_torch_names(tree: ast.AST) -> set[str]:
    """Every dotted torch name the module reads or imports outside such a try."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
            found = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute) and ast.unparse(node).startswith("torch."):
            found = [ast.unparse(node)]
        else:
            continue
        if not _guarded(node, parents):
            names.update(found)
    return names


def test_the_torch_floor_has_every_torch_api_the_package_reads_unguarded():
    floor = re.search(r'"torch>=([0-9.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert f"any torch >= {floor}" in (REPO / "README.md").read_text()
    assert all(since > floor for since in NEWER_THAN_THE_FLOOR.values())
    for path in sorted((REPO / "seq2seq").rglob("*.py")):
        used = _unguarded_torch_names(ast.parse(path.read_text(encoding="utf-8")))
        newer = [name for name in NEWER_THAN_THE_FLOOR if any(u.startswith(name) for u in used)]
        assert not newer, f"{path.relative_to(REPO)} reads {newer} with no fallback"
