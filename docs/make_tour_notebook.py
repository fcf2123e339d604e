"""Write docs/tour.ipynb from docs/tour.md: the page is the one source, the notebook is made.

    python docs/make_tour_notebook.py            # write docs/tour.ipynb
    python docs/make_tour_notebook.py --check    # exit 1 if docs/tour.ipynb is not the page's

The page's prose becomes markdown cells, its python blocks code cells, and each text block
(what the block before it printed, as ``tests/test_docs.py`` checks it) a markdown cell under
it. Its bash blocks of ``seq2seq`` commands become ``%%bash`` cells, but the tour's first
command, which trains its model, becomes ``seq2seq.train`` in Python, so that its progress
bar is the notebook's, the stop button saves the run and running the cell again resumes it.
A bash block that runs something else (the experiments' scripts, which take minutes or need
other runs) stays a shell command to copy. Two cells come first: one that moves to the
repository's root, where the page's paths lead, and one of parameters (``SET``, the
training's ``--set`` overrides: ``tests/test_tour_notebook.py`` trains fewer steps). The
notebook is written without outputs, with cell ids numbered, so that one page makes one file.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
PAGE, NOTEBOOK = HERE / "tour.md", HERE / "tour.ipynb"
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
TRAIN = re.compile(r"seq2seq train --config (?P<config>\S+) --out (?P<out>\S+)")

SETUP = """\
# The page's paths start at the repository's root: move there from docs/ if opened there.
import os
from pathlib import Path

if not Path("docs/tour.yaml").is_file() and Path("tour.yaml").is_file():
    os.chdir("..")"""
PARAMETERS = """\
# parameters: --set overrides for the training below (none: the tour's own model)
SET = []"""
TRAIN_CELL = """\
# `{command}`, from Python: run this cell again after the stop button to resume
import seq2seq

state = seq2seq.train("{out}", "{config}", SET)"""


def code(source: str, n: int) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source.rstrip("\n"), id=f"cell-{n}")


def markdown(source: str, n: int) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(source.strip("\n"), id=f"cell-{n}")


def bash_cell(body: str) -> tuple[str, str]:
    """("code" or "markdown", the cell's source) for a bash block."""
    joined = body.replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines() if line.strip()]
    train = TRAIN.fullmatch(lines[0]) if len(lines) == 1 else None
    if train:
        return "code", TRAIN_CELL.format(command=lines[0], **train.groupdict())
    if all(shlex.split(line)[0] == "seq2seq" for line in lines):
        return "code", "%%bash\nset -e\n" + body
    return "markdown", f"In a terminal (not run here):\n\n```bash\n{body}```"


def tour_notebook(page: str) -> nbformat.NotebookNode:
    cells, end = [code(SETUP, 0), code(PARAMETERS, 1)], 0
    cells[1].metadata["tags"] = ["parameters"]  # papermill's name for such a cell
    for m in FENCE.finditer(page):
        prose = page[end : m.start()]
        if prose.strip():
            cells.append(markdown(prose, len(cells)))
        lang, body = m["lang"], m["body"]
        if lang == "python":
            cells.append(code(body, len(cells)))
        elif lang == "bash":
            kind, source = bash_cell(body)
            cells.append((code if kind == "code" else markdown)(source, len(cells)))
        elif lang == "text":
            cells.append(markdown(f"The page shows:\n\n```text\n{body}```", len(cells)))
        else:
            raise SystemExit(f"docs/tour.md: a ```{lang} block has no rule here")
        end = m.end()
    if page[end:].strip():
        cells.append(markdown(page[end:], len(cells)))
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata.update(
        kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
        language_info={"name": "python"},
    )
    return notebook


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    made = nbformat.writes(tour_notebook(PAGE.read_text(encoding="utf-8"))) + "\n"
    if args.check:
        same = NOTEBOOK.is_file() and NOTEBOOK.read_text(encoding="utf-8") == made
        print("docs/tour.ipynb is the page's" if same else "docs/tour.ipynb differs: remake it")
        return 0 if same else 1
    NOTEBOOK.write_text(made, encoding="utf-8")
    print(f"wrote {NOTEBOOK.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
