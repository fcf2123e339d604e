"""Training curves: RUN/curves.png after each validation, and ``seq2seq plot`` overlaying runs."""

import json

import matplotlib.image
import pytest
from helpers import tiny_run_dir

from seq2seq.commands.cli import main
from seq2seq.training.curves import curves_figure, save_curves, update_run_curves

N_PANELS = 4  # loss, BLEU by step, BLEU by wall minutes, learning rate


def write_metrics(run, bleu_gain=1.0, broken_tail=False):
    """A metrics.jsonl as the trainer writes it: train records every 10 steps, valid every 50."""
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(10, 201, 10):
        train = {"kind": "train", "step": step, "loss": 8 - step / 40, "lr": step * 1e-5}
        lines.append(json.dumps({**train, "tokens_per_s": 900.0, "epoch": 0}))
        if step % 50 == 0:
            valid = {"loss": 7 - step / 50, "ppl": 100.0, "bleu": bleu_gain * step / 20}
            lines.append(
                json.dumps({"kind": "valid", "step": step, **valid, "elapsed_min": step / 60})
            )
    text = "\n".join(lines) + "\n" + ('{"kind": "train", "st' if broken_tail else "")
    (run / "metrics.jsonl").write_text(text)
    return run


def test_one_run_has_four_panels_with_train_and_validation_loss(tmp_path):
    fig = curves_figure([write_metrics(tmp_path / "run", broken_tail=True)])
    axes = fig.get_axes()
    assert len(axes) == N_PANELS
    loss, bleu_steps, bleu_minutes, lr = axes
    assert [len(line.get_xdata()) for line in loss.get_lines()] == [20, 4]  # train, validation
    assert list(bleu_steps.get_lines()[0].get_xdata()) == [50, 100, 150, 200]
    assert list(bleu_minutes.get_lines()[0].get_xdata()) == pytest.approx(
        [50 / 60, 100 / 60, 2.5, 200 / 60]
    )
    assert lr.get_lines()[0].get_ydata()[-1] == pytest.approx(200e-5)


def test_two_runs_overlay_one_line_each_per_panel(tmp_path):
    runs = [write_metrics(tmp_path / "a"), write_metrics(tmp_path / "b", bleu_gain=2.0)]
    axes = curves_figure(runs).get_axes()
    assert len(axes[0].get_lines()) == 4  # train and validation loss of each run
    for ax in axes[1:]:
        assert len(ax.get_lines()) == 2
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [str(r) for r in runs]
    colours = {line.get_color() for line in axes[1].get_lines()}
    assert len(colours) == 2


def test_plot_command_writes_a_readable_png(tmp_path, capsys):
    runs = [str(write_metrics(tmp_path / name)) for name in ("a", "b")]
    out = tmp_path / "figs" / "compare.png"
    assert main(["plot", *runs, "-o", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300


@pytest.mark.parametrize(
    ("make", "output", "message"),
    [
        (lambda tmp: tmp / "missing", "c.png", "has no metrics.jsonl"),
        (write_metrics, "c.gif", "must end in .png, .svg, .pdf"),
    ],
)
def test_plot_command_errors_are_one_line(tmp_path, capsys, make, output, message):
    run = make(tmp_path / "run")
    assert main(["plot", str(run), "-o", str(tmp_path / output)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_drawing_failure_is_a_warning_not_an_exception(tmp_path):
    run = write_metrics(tmp_path / "run")
    (run / "curves.png").mkdir()  # cannot be replaced by a file
    said = []
    update_run_curves(run, said.append)
    assert len(said) == 1 and said[0].startswith("warning: could not draw curves.png")


def test_training_writes_curves_at_validation(tmp_path_factory):
    run = tiny_run_dir(tmp_path_factory)
    image = matplotlib.image.imread(run / "curves.png")
    assert image.shape[0] > 300
    assert len(curves_figure([run]).get_axes()) == N_PANELS
    assert (
        save_curves([run], tmp_path_factory.mktemp("svg") / "c.svg").read_text().startswith("<?xml")
    )
