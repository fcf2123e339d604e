"""Every measured figure a hand-written page prints comes from a committed record or from the
code's own settings, and stands on the page as they give it.

A figure here is a number with a unit of time, size, speed or share (``5 min``, ``48.6 ms``,
``223 kB``, ``1.20×``, ``84%``) or any decimal (``0.93``, ``18.0``), in prose: fenced blocks
(``tests/test_docs.py`` runs them and compares their output), inline code and the regions the
records render (``<!-- records:… -->``, checked by ``tests/test_records.py``) are left out.
``SOURCES`` gives, per page, what each record or setting says the page prints; ``NOT_MEASURED``
names the few figures that are neither (a fact about another program, a shape of an example),
each with what it is. A figure in neither fails: a new measurement in prose comes with its
record, and a re-measured record with its page.
"""

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from seq2seq.config import Config, DecodeConfig
from seq2seq.inspect.influence import TIE_NATS

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")) if p.name != "results.md"),
    "data/README.md",
]
_NUMBER = r"\d[\d,]*"
_UNIT = r"\s?(?:×|ms|s|min|kB|MB|GB|%)(?![\w])"
FIGURE = re.compile(rf"(?<![\w.\-/]){_NUMBER}(?:\.\d+(?!\d|\.\d)(?:{_UNIT})?|{_UNIT})")
RENDERED = re.compile(r"<!-- (records:[\w-]+) -->.*?<!-- /\1 -->", re.S)


def prose(page: str) -> str:
    return prose_of((REPO / page).read_text(encoding="utf-8"))


def prose_of(text: str) -> str:
    """``text``'s prose on one line: no fenced blocks, inline code or rendered regions."""
    text = RENDERED.sub(" ", text)
    text = re.sub(r"^\s*```.*?^\s*```", " ", text, flags=re.S | re.M)
    return " ".join(re.sub(r"`[^`\n]*`", " ", text).split())


def record(path: str) -> dict:
    return json.loads((REPO / path).read_text(encoding="utf-8"))


# Each source: the record (or None: the code's settings) and the figures it says the page prints.
Source = tuple[str | None, Callable[[], list[str]]]


def suite_time() -> list[str]:
    """README: the suite's time and the commit it was measured at, from its record (a whole
    run of the README's test command in a fresh clone, pytest's last line with it)."""
    text = (REPO / "experiments/suite/after.txt").read_text(encoding="utf-8")
    summary = text.splitlines()[-1]
    assert re.fullmatch(r".*\d+ passed.* in [\d.]+s \(\d+:\d\d:\d\d\)", summary), summary
    seconds = round(float(re.search(r" in ([\d.]+)s \(", summary).group(1)))
    commit = re.search(r"fresh clone of commit (\w+)", text).group(1)
    return [f"{seconds // 60} min", f"{seconds % 60} s", commit]


def influence_cost() -> list[str]:
    r = record("experiments/influence/de-en.json")
    return [
        f"{r['occlude_s'] * 1000:.1f} ms",
        f"{r['extra_share']:.0%}",
        f"{r['translate_s'] * 1000:.1f} ms",
        f"{r['src_subwords']} source subwords",
        f"{r['tgt_subwords']} output subwords",
        f"{r['passes']} decoder passes",
        f"{r['page']['bytes']['written'] / 1000:.0f} kB",
        f"{r['page']['influence_share']:.1%}",
        f"{r['threads']} threads",
        f"{r['model']['steps']:,} steps",
    ]


def page_size_tour() -> list[str]:
    r = record("experiments/influence/page_size_tour.json")
    sizes = r["page"]["bytes"]
    return [
        f"{sizes['written'] / 1000:.0f} kB",
        f"{sizes['maps_influence'] / 1000:.0f} kB",
        f"{(sizes['maps_influence'] - sizes['maps']) / 1000:.0f} kB",
        f"{r['page']['sentences']} sentences",
    ]


def cooldown() -> list[str]:
    return [f"{Config().train.cooldown:.0%}"]


def dropout_schedule() -> list[str]:
    c = Config()
    return [f"{c.train.early_dropout}", f"{c.model.dropout}"]


def decode_defaults() -> list[str]:
    d = DecodeConfig()
    return [f"{d.length_penalty:.1f}", f"{d.max_len_a}"]


def tie_threshold() -> list[str]:
    return [f"{TIE_NATS} nats"]


SOURCES: dict[str, list[Source]] = {
    "README.md": [("experiments/suite/after.txt", suite_time), (None, cooldown)],
    "docs/decoding.md": [(None, decode_defaults)],
    "docs/explorer.md": [
        ("experiments/influence/de-en.json", influence_cost),
        ("experiments/influence/page_size_tour.json", page_size_tour),
        (None, tie_threshold),
    ],
    "docs/tour.md": [
        (None, tie_threshold),
        (None, decode_defaults),
        (None, lambda: [f"{math.log2(14):.1f} bits"]),  # a row spread evenly over 14 keys
    ],
    "docs/training.md": [(None, cooldown), (None, dropout_schedule)],
    "docs/export.md": [(None, lambda: ["95%"])],  # tests/test_export.py's agreement threshold
}
NOT_MEASURED: dict[str, dict[str, str]] = {
    "docs/tour.md": {"6 ×": "the shape of the example's map (6 queries × 10 keys)"},
    "docs/training.md": {
        "8.0": "the CUDA compute capability from which GPUs compute bf16 natively",
    },
}


@pytest.mark.parametrize("page", sorted(SOURCES))
def test_every_figure_a_record_gives_stands_on_its_page(page):
    text = " ".join((REPO / page).read_text(encoding="utf-8").split())
    for path, figures in SOURCES[page]:
        if path is not None:
            assert path in text, f"{page} no longer names its record {path}"
        for figure in figures():
            assert figure in text, f"{page}: {figure!r} ({path or 'a setting'}) not on the page"


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_in_prose_comes_from_a_record_or_a_setting(page):
    given = " ".join(f for _, figures in SOURCES.get(page, []) for f in figures())
    unexplained = [
        f
        for f in FIGURE.findall(prose(page))
        if f not in NOT_MEASURED.get(page, {})
        and not re.search(rf"(?<![\d.]){re.escape(f)}", given)
    ]
    assert not unexplained, f"{page}: {unexplained} from no record or setting in SOURCES"


def test_the_guard_sees_the_figures_a_review_found_unchecked():
    """One-decimal means, × ratios, ms and % figures: each is a figure; code and rendered
    regions are not, nor are counts, versions and settings in code."""
    page = (
        "A mean of 38.6, 1.57× faster, 48 ms a step, 15% of it, 5 min 54 s and 2,048 tokens;"
        " torch 2.13.0.\n\n"
        "`--set train.lr=0.002` <!-- records:x -->\n| 40.09 |\n<!-- /records:x -->\n\n"
        "```\nloss 1.573\n```\n"
    )
    found = FIGURE.findall(prose_of(page))
    assert found == ["38.6", "1.57×", "48 ms", "15%", "5 min", "54 s"]
