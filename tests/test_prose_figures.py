"""Every measured figure a hand-written page prints comes from a committed record or from the
code's own settings, and stands on the page as they give it.

A figure here is a number with a unit of time, size, speed or share (``5 min``, ``48.6 ms``,
``223 kB``, ``1.20×``, ``84%``) or any decimal (``0.93``, ``18.0``, ``9.92e-05``), in prose:
fenced blocks (``tests/test_docs.py`` runs them and compares their output), inline code and the
regions the records render (``<!-- records:… -->``, checked by ``tests/test_records.py``) are
left out. The pages: the README, docs/ but the rendered results.md, data/README.md and the
experiments' READMEs; of a README an experiment renders from its template, the text typed into
the template and its conclusion (what their ``{fields}`` bring in comes from its results, and
``tests/test_experiments.py`` keeps the README equal to that render). ``SOURCES`` gives, per
page, what each record or setting says the page prints, matched as whole numbers ("1.1" is not
"1.14×"); ``NOT_MEASURED`` names the few figures that are neither (a fact about another program,
a goal, a setting of a command), each with what it is. A figure in neither fails: a new
measurement in prose comes with its record, and a re-measured record with its page.
"""

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from seq2seq.config import Config, DecodeConfig
from seq2seq.inspect.influence import TIE_NATS
from seq2seq.model.transformer import build_model, count_parameters
from seq2seq.training.optim import MUON_TORCH

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")) if p.name != "results.md"),
    "data/README.md",
    *(p.relative_to(REPO).as_posix() for p in sorted(REPO.glob("experiments/*/README.md"))),
]
_NUMBER = r"\d[\d,]*"
_UNIT = r"\s?(?:×|ms|s|min|kB|MB|GB|%)(?![\w])"
FIGURE = re.compile(
    rf"(?<![\w.\-/]){_NUMBER}(?:\.\d+(?:[eE][-+]?\d+)?(?!\d|\.\d)(?:{_UNIT})?|{_UNIT})"
)
RENDERED = re.compile(r"<!-- (records:[\w-]+) -->.*?<!-- /\1 -->", re.S)


def prose(page: str) -> str:
    return prose_of(typed(page))


def prose_of(text: str) -> str:
    """``text``'s prose on one line: no fenced blocks, inline code or rendered regions."""
    text = RENDERED.sub(" ", text)
    text = re.sub(r"^\s*```.*?^\s*```", " ", text, flags=re.S | re.M)
    return " ".join(re.sub(r"`[^`\n]*`", " ", text).split())


def within(figure: str, text: str) -> bool:
    """Whether ``figure`` stands in ``text`` as a whole number: "1.1" is not in "1.14×", nor
    "5 min" in "15 min", nor "2.5" in "2.53"."""
    return re.search(rf"(?<![\d.,]){re.escape(figure)}(?!\w|[.,]\d)", text) is not None


def typed(page: str) -> str:
    """The text of a page a person typed. An experiment's README is its template filled from
    the experiment's results (tests/test_experiments.py keeps it so): there, the template and
    its conclusion without their ``{fields}``, which bring the results' figures in."""
    here = (REPO / page).parent
    template = here / "README.template.md"
    if page.split("/")[0] != "experiments" or not template.is_file():
        return (REPO / page).read_text(encoding="utf-8")
    texts = [template, *([here / "conclusion.md"] if (here / "conclusion.md").is_file() else [])]
    return "\n\n".join(re.sub(r"\{[^{}\n]*\}", " ", t.read_text(encoding="utf-8")) for t in texts)


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
    # the versions a fresh install picked, which the suite passed with
    assert re.search(r"^# versions: pytest \S+, pytest-xdist \S+, torch \S+$", text, re.M), text
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


def attention_not_explanation() -> list[str]:
    """Its conclusion, from its results and kv_heads' (the MHA seeds' spread)."""
    r = record("experiments/attention_not_explanation/results.json")
    rows = record("experiments/kv_heads/results.json")["rows"]
    mha = [row["test_bleu"] for row in rows if row["variant"].startswith("mha")]
    low, high = sorted(r["test_bleu"].values())
    layers = [m for m in r["maps"] if m["layer"] != "mean"]
    uniform = [u for m in layers for u in (m["jsd_a_uniform"], m["jsd_b_uniform"])]
    runs = [c for seed in r["counterfactual"].values() for c in seed if c["mode"] != "kept"]
    one = [c for c in runs if c["layers"] != "all"]
    every = [c for c in runs if c["layers"] == "all"]
    return [
        f"{high - low:.2f}",
        f"{low:.2f}",
        f"{high:.2f}",
        f"{min(mha):.2f}",
        f"{max(mha):.2f}",
        f"{min(m['jsd'] for m in layers):.2f}",
        f"{max(m['jsd'] for m in layers):.2f}",
        f"{min(uniform):.2f}",
        f"{max(uniform):.2f}",
        *(f"{m['argmax_agree']:.0%}" for m in r["maps"]),
        f"{layers[0]['chance']:.1%}",
        f"{max(c['changed'] for c in one):.0%}",
        f"{min(c['bleu_drop'] for c in one):.1f}",
        f"{max(c['bleu_drop'] for c in one):.1f}",
        f"{100 * min(c['changed'] for c in every):.1f}",
        f"{max(c['changed'] for c in every):.0%}",
        f"{min(c['bleu'] for c in every):.1f}",
        f"{max(c['bleu'] for c in every):.1f}",
    ]


def kv_heads_t_factor() -> list[str]:
    """The t factor its verdict takes for three MHA seeds (``T_95`` in its run.py)."""
    text = (REPO / "experiments/kv_heads/run.py").read_text(encoding="utf-8")
    t = float(re.search(r"T_95 = \{2: ([\d.]+)", text).group(1))
    return [f"{t:.1f}"]


def scale() -> list[str]:
    """Its conclusion, from its results, plateau and ranks records."""
    r = record("experiments/scale/results.json")
    by = {s["pairs"]: s for s in r["sizes"]}
    m1, m5 = by[1_000_000], by[5_000_000]
    ready = [s[k]["ready_rss_mb"] for s in (m1, m5) for k in ("fresh", "resume")]
    curves = [
        dict(map(tuple, size["peak_rss_mb_by_step"]))
        for size in record("experiments/scale/plateau.json")["sizes"].values()
    ]
    plateau = record("experiments/scale/plateau.json")
    after20 = plateau["sizes"]["1000000"]["from_step"] + 20
    apart = sorted(abs(curves[0][s] - curves[1][s]) for s in curves[0] if s in curves[1])
    access = r["access"]
    figures = [
        f"{m1['resume']['first_step_s']:.1f} s",
        f"{m1['prepare_s']:.0f} s",
        f"{m1['prepare_cpu_s']:.0f} s",
        f"{m5['fresh']['peak_rss_mb']:,.0f} MB",
        f"{m5['resume']['peak_rss_mb']:,.0f} MB",
        f"{m5['fresh']['peak_rss_mb'] / m1['fresh']['peak_rss_mb'] - 1:.0%}",
        f"{m5['resume']['peak_rss_mb'] / m1['resume']['peak_rss_mb'] - 1:.0%}",
        f"{m1['resume']['ready_rss_mb']:,.0f} MB",
        f"{m5['resume']['ready_rss_mb']:,.0f} MB",
        f"{m5['resume']['ready_rss_mb'] / m1['resume']['ready_rss_mb'] - 1:.0%}",
        f"{m5['fresh']['ready_rss_mb']:,.0f} MB",
        f"{curves[0][after20]:,.0f} MB",  # "from 1,491 MB after 20 steps …, and from 1,503"
        f"{curves[1][after20]:,.0f}",
        *(f"{c[max(c)]:,.0f} MB" for c in curves),
        f"{apart[(len(apart) - 1) // 2]:.0f} MB",
        f"{apart[-1]:.0f} MB",
        f"{int(min(c[max(c)] for c in curves) // 1000)} GB",
        f"{access['arrow_ms']:.2f} ms",
        f"{access['store_ms']:.2f} ms",
        f"{access['store_ms'] - access['arrow_ms']:.1f} ms",
        f"~{round(1000 / m1['resume']['steps_per_s'], -2):.0f} ms",
        f"{round(max(ready), -1 if max(ready) % 50 else 0):.0f} MB",
    ]
    ranks = record("experiments/scale/ranks.json")["corpora"]
    at_1m = next(c for name, c in ranks.items() if "1000000" in name)
    for result in at_1m["results"].values():
        figures += [f"{result['peak_rss_mb']:,.0f} MB", f"{result['peak_pss_mb']:,.0f} MB"]
    for ratio in at_1m["ratio"].values():
        figures += [f"{ratio['peak_rss_mb']:.2f}×", f"{ratio['peak_pss_mb']:.2f}×"]
    same = next(r for k, r in ranks["multi30k"]["results"].items() if "the same batch" in k)
    figures += [f"{same['peak_rss_mb']:,.0f} MB", f"{same['peak_pss_mb']:,.0f} MB"]
    return figures


def stream_memory() -> list[str]:
    r = record("experiments/robustness/stream_memory.json")
    small, large = (r["sizes"][n] for n in sorted(r["sizes"], key=int))
    return [
        *(f"{size['peak_rss_mb']:.1f} MB" for size in (small, large)),
        *(f"{size['wall_s']:.1f} s" for size in (small, large)),
        f"{large['peak_rss_mb'] - small['peak_rss_mb']:.1f} MB",
        f"{max(map(int, r['sizes'])) // min(map(int, r['sizes']))}×",
        r["environment"]["git_commit"][:7],
    ]


def cooldown() -> list[str]:
    return [f"{Config().train.cooldown:.0%}"]


def dropout_schedule() -> list[str]:
    c = Config()
    return [f"{c.train.early_dropout}", f"{c.model.dropout}"]


def muon_and_ema() -> list[str]:
    """The torch Muon needs, its default momentum, and the moving average's warmed-up decay
    after 1,200 steps, which the page gives for a decay of 0.999."""
    return [MUON_TORCH, f"{Config().train.muon_momentum:g}", f"{min(0.999, 1201 / 1210):.3f}"]


def decode_defaults() -> list[str]:
    d = DecodeConfig()
    return [f"{d.length_penalty:.1f}", f"{d.max_len_a}"]


def tie_threshold() -> list[str]:
    return [f"{TIE_NATS} nats"]


def paper_departures() -> list[str]:
    """docs/transformer.md: the defaults it compares with the paper's, the default model's
    parameter count, and the peak of the paper's learning-rate formula, d_model^-0.5 ·
    warmup^-0.5, at the paper's base size and at ours."""
    c = Config()
    n_parameters = count_parameters(build_model(c.model))
    paper_peak = 512**-0.5 * 4000**-0.5  # the base model's d_model and warmup steps
    our_peak = c.model.d_model**-0.5 * c.train.warmup_steps**-0.5
    t = c.train
    return [
        *(f"{beta}" for beta in t.betas),
        f"{t.label_smoothing}",
        f"{t.early_dropout}",
        f"{c.model.dropout}",
        f"{t.cooldown:.0%}",
        f"{c.decode.length_penalty:.1f}",
        f"{c.decode.max_len_a}",
        f"{n_parameters / 1e6:.1f} million",
        f"{paper_peak:.4f}",
        f"{our_peak:.4f}",
        MUON_TORCH,
    ]


def gpu_recipe() -> list[str]:
    """The GPU recipe's learning rate, from its config file."""
    config = yaml.safe_load((REPO / "experiments/configs/gpu.yaml").read_text("utf-8"))
    return [f"{config['train']['lr']:g}"]


def cooldown_arm() -> list[str]:
    """The cool-down of the arm docs/transformer.md compares, from its record's config."""
    config = yaml.safe_load(
        (REPO / "experiments/results/ladder-deen-cool50-1200/config.yaml").read_text("utf-8")
    )
    return [f"{config['train']['cooldown']:.0%}"]


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
    "docs/training.md": [
        (None, cooldown),
        (None, dropout_schedule),
        (None, muon_and_ema),
        (None, gpu_recipe),
    ],
    "docs/transformer.md": [(None, paper_departures), (None, cooldown_arm)],
    "docs/export.md": [(None, lambda: ["95%"])],  # tests/test_export.py's agreement threshold
    "experiments/alignment/README.md": [  # the default cool-down's start, its last 30%
        (None, lambda: [f"{1 - Config().train.cooldown:.0%}"])
    ],
    "experiments/attention_not_explanation/README.md": [
        ("experiments/attention_not_explanation/results.json", attention_not_explanation)
    ],
    "experiments/kv_heads/README.md": [(None, kv_heads_t_factor)],
    "experiments/robustness/README.md": [
        ("experiments/robustness/stream_memory.json", stream_memory)
    ],
    "experiments/scale/README.md": [("experiments/scale/results.json", scale)],
}
NOT_MEASURED: dict[str, dict[str, str]] = {
    "experiments/kv_heads/README.md": {"95%": "the confidence its prediction interval is set at"},
    "experiments/robustness/README.md": {
        "10 s": "the --server-deadline the serve_load.py command above sets",
        "1 s": "the deadline tests/test_serve.py sets",
        "30 s": "how long bug 4's reproduction was left to run before it was stopped",
    },
    "experiments/scale/README.md": {
        "10 s": "the large-corpus goal for a resume's first step",
        "1.3×": "the goal for two ranks against one process",
        "2.3": "arithmetic on that goal: 2B + A < 1.3 (B + A) when A > 0.7 B / 0.3",
    },
    "docs/tour.md": {"6 ×": "the shape of the example's map (6 queries × 10 keys)"},
    "docs/training.md": {
        "8.0": "the CUDA compute capability from which GPUs compute bf16 natively",
    },
    "docs/transformer.md": {
        "0.6": "the paper's length penalty (Vaswani et al. 2017, section 6.1)",
        "4.5": "the paper's million training pairs of WMT 2014 en-de (its section 5.1)",
        **{
            section: "a section of Vaswani et al. (2017)"
            for section in ("3.1", "3.3", "3.4", "3.5", "5.1", "5.2", "5.3", "5.4", "6.1")
        },
    },
}


@pytest.mark.parametrize("page", sorted(SOURCES))
def test_every_figure_a_record_gives_stands_on_its_page(page):
    text = " ".join((REPO / page).read_text(encoding="utf-8").split())
    for path, figures in SOURCES[page]:
        if path is not None:  # by its path, or by its name in the page's own folder
            own = Path(path).parent == Path(page).parent and Path(path).name in text
            assert path in text or own, f"{page} no longer names its record {path}"
        for figure in figures():
            assert within(figure, text), (
                f"{page}: {figure!r} ({path or 'a setting'}) not on the page"
            )


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_in_prose_comes_from_a_record_or_a_setting(page):
    given = " ".join(f for _, figures in SOURCES.get(page, []) for f in figures())
    unexplained = [
        f
        for f in FIGURE.findall(prose(page))
        if f not in NOT_MEASURED.get(page, {}) and not within(f, given)
    ]
    assert not unexplained, f"{page}: {unexplained} from no record or setting in SOURCES"


def test_a_figure_is_matched_whole():
    """A review found "1.1" passing as "1.14×": a figure matches a whole number only."""
    assert within("1.14×", "1.14× faster") and within("1.14", "at 1.14×")
    assert not within("1.1", "1.14×") and not within("5 min", "15 min")
    assert not within("2.5", "2.53 GB") and not within("1,4", "1,489 MB")
    assert not within("48 ms", "48 msgs")  # not a unit there, but no figure either


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
