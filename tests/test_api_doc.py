"""The Python example in docs/python_api.md runs as written against a tiny trained run, and
draws readable PNGs: the documentation cannot fall behind the code."""

import re
from pathlib import Path

import matplotlib.image
import pytest
from helpers import tiny_run_dir

DOC = Path(__file__).resolve().parents[1] / "docs" / "python_api.md"
RUN_LINE = re.compile(r'^RUN = "[^"]*"', re.MULTILINE)


def _example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) == 1, "docs/python_api.md should hold exactly one python block"
    assert len(RUN_LINE.findall(blocks[0])) == 1, 'the block should set RUN = "..." once'
    return blocks[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run_dir(tmp_path_factory)


def test_python_api_example_runs(run_dir, tmp_path, monkeypatch, capsys):
    code = RUN_LINE.sub(lambda _: f"RUN = {str(run_dir)!r}", _example())
    monkeypatch.chdir(tmp_path)  # the example writes its figures and hyps.txt here
    namespace: dict = {"__name__": "__main__"}
    exec(compile(code, str(DOC), "exec"), namespace)

    out = capsys.readouterr().out
    assert "BLEU" in out and "chrF" in out and "nrefs:1" in out
    for name in ("attention.png", "attention_heads.png", "attention_words.png"):
        image = matplotlib.image.imread(tmp_path / name)
        assert image.ndim == 3 and min(image.shape[:2]) > 50
    sentences = namespace["sentences"]
    assert len(namespace["beam_results"]) == len(sentences)
    assert all(1 <= len(hyps) <= 3 for hyps in namespace["beam_results"])
    lines = (tmp_path / "hyps.txt").read_text(encoding="utf-8").splitlines()
    assert lines == namespace["greedy_texts"]
