"""Training curves from ``metrics.jsonl``: ``RUN/curves.png`` and ``seq2seq plot``.

Four panels: training and validation loss against steps, validation BLEU against steps and
against wall minutes (what decides between two recipes on the same budget), and the
learning rate. Several runs share the panels, one colour per run, so two recipes compare
at a glance. Figures are drawn on a bare ``Figure`` with the Agg canvas, never through
pyplot: no display needed, and matplotlib's global state is left alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq.errors import Seq2SeqError
from seq2seq.fileio import atomic_path

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
FORMATS = ("png", "svg", "pdf")

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# (title, x label, y label) of each panel, in drawing order.
_PANELS = (
    ("loss", "step", "loss per target token"),
    ("validation BLEU", "step", "BLEU"),
    ("validation BLEU against time", "wall minutes", "BLEU"),
    ("learning rate", "step", "learning rate"),
)


_MARGINS = dict(left=0.07, right=0.985, bottom=0.07, top=0.96, wspace=0.2, hspace=0.3)


def read_metrics(run_dir: Path) -> dict[str, list[dict]]:
    """The records of ``RUN/metrics.jsonl`` by kind ("train", "valid", ...), in file order.

    A line a crash cut short is skipped: the curves are still worth drawing."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise Seq2SeqError(f"{run_dir} has no {METRICS_FILE}: not a training run, or not started")
    records: dict[str, list[dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "kind" in record and "step" in record:
            records.setdefault(record["kind"], []).append(record)
    return records


def _series(records: list[dict], x: str, y: str) -> tuple[list[float], list[float]]:
    kept = [r for r in records if isinstance(r.get(x), (int, float)) and r.get(y) is not None]
    return [r[x] for r in kept], [r[y] for r in kept]


def curves_figure(run_dirs: Sequence[Path], labels: Sequence[str] | None = None) -> Figure:
    """The four panels for one or more runs (labelled by their paths unless ``labels``)."""
    labels = list(labels) if labels is not None else [str(run) for run in run_dirs]
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # at the first drawing, not at
    from matplotlib.figure import Figure  # import: a command that draws nothing starts sooner

    fig = Figure(figsize=(11, 7.5))
    FigureCanvasAgg(fig)
    # fixed margins: matplotlib's constrained layout would measure every tick label first,
    # which doubled the cost of the figure the trainer redraws at each validation
    axes = fig.subplots(2, 2, gridspec_kw=_MARGINS).flatten()
    for (title, x_label, y_label), ax in zip(_PANELS, axes, strict=True):
        ax.set(title=title, xlabel=x_label, ylabel=y_label)
        ax.grid(alpha=0.3)
    several = len(run_dirs) > 1
    for index, (run, label) in enumerate(zip(run_dirs, labels, strict=True)):
        records = read_metrics(run)
        train, valid = records.get("train", []), records.get("valid", [])
        colour = f"C{index % 10}"
        name = f"{label}: " if several else ""
        axes[0].plot(*_series(train, "step", "loss"), color=colour, label=f"{name}train")
        axes[0].plot(
            *_series(valid, "step", "loss"), "--o", ms=3, color=colour, label=f"{name}validation"
        )
        axes[1].plot(*_series(valid, "step", "bleu"), "-o", ms=3, color=colour, label=label)
        axes[2].plot(*_series(valid, "elapsed_min", "bleu"), "-o", ms=3, color=colour, label=label)
        axes[3].plot(*_series(train, "step", "lr"), color=colour, label=label)
    axes[0].legend(fontsize="small")
    if several:
        for ax in axes[1:]:
            ax.legend(fontsize="small")
    return fig


def save_curves(run_dirs: Sequence[Path], out: Path, labels: Sequence[str] | None = None) -> Path:
    """Draw ``curves_figure`` into ``out`` (PNG, SVG or PDF, by its suffix), atomically."""
    out = Path(out)
    fmt = out.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise Seq2SeqError(f"{out}: the figure's name must end in .{', .'.join(FORMATS)}")
    fig = curves_figure(run_dirs, labels)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=fmt, dpi=100)
    return out


def update_run_curves(run_dir: Path, warn: Callable[[str], None]) -> None:
    """Redraw ``RUN/curves.png`` after a validation. Never raises: a figure that cannot be
    drawn (a full disk, a broken font cache) must not stop training; ``warn`` says why."""
    try:
        save_curves([run_dir], Path(run_dir) / CURVES_FILE, labels=[Path(run_dir).name])
    except Exception as e:  # noqa: BLE001 - any drawing failure, reported and survived
        reason = (str(e) or type(e).__name__).splitlines()[0]
        warn(f"warning: could not draw {CURVES_FILE}: {reason}")
