"""The trainer and search give the numbers they gave before the trainer was rewritten.

``tests/data/reference_run.json`` was recorded with the code before the rewrite (commit
5a762d2, the single ``_train`` function): the per-step training losses, validation losses
and greedy translations of a tiny model on the sample corpus, dropout on, fp32, one thread.
On the machine that recorded them the rewrite reproduced them bit for bit; since then the
trainer uses Adam's fused kernel, the same update up to the last bits (2e-7 relative on these
losses there). The tolerance admits that and another CPU's kernels, nothing more.
Re-recorded once, when dropout's masks changed from ``F.dropout``'s to ``layers.Dropout``'s
(16 random bits per element): the same trainer drawing other masks (validation loss at step
150: 2.306, where the old masks gave 2.290).
``tests/data/reference_run_dropout0.json`` is the same run with every dropout 0 (recorded
from commit da4beab): no mask is drawn, so any dropout-mask implementation must give these
numbers, and a change of masks that moves them changed more than the masks.
``tests/data/reference_run_bf16.json`` is the run under bf16 autocast (recorded at commit
b05ce2b, on an AMD EPYC, after 15bbc8d whose float32 dropout scale moved only bf16's numbers, and
no other change since has moved them): bf16 kernels
differ by instruction set, so it is checked on a CPU with the bf16 flags it names (and is
skipped elsewhere, saying why); a bf16-only change of the numbers moves it, and
experiments/results/numerics.yaml takes an entry for that precision.
Re-record (only for a deliberate change of the numbers) with ``python tests/test_reference_run.py
[FILE ...]`` (every file by default; a bf16 one on a CPU that computes bf16 natively).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_train import read_metrics, tiny_config  # noqa: E402

from seq2seq.decoding.translate import Translator  # noqa: E402
from seq2seq.run.precision import autocast_dtype  # noqa: E402
from seq2seq.run.runlog import machine  # noqa: E402

DATA = Path(__file__).parent / "data"
SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest."]
# The reference files, each with the settings it adds to the tiny run.
NO_DROPOUT = dict(
    model__dropout=0.0,
    model__attn_dropout=0.0,
    model__activation_dropout=0.0,
    train__early_dropout=None,
)
BF16 = dict(train__precision="bf16")
REFERENCES = {
    "reference_run.json": {},
    "reference_run_dropout0.json": NO_DROPOUT,
    "reference_run_bf16.json": BF16,
}


def record(run_dir: Path, **changes: object) -> dict:
    from seq2seq.training.entry import train

    settings = dict(
        train__max_steps=150, train__validate_every=50, train__precision="fp32", train__seed=7
    )
    config = tiny_config(**{**settings, **changes})
    train(config, run_dir, progress=False)
    translator = Translator.from_run(run_dir)
    got = {
        "train_loss": {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")},
        "valid_loss": {r["step"]: r["loss"] for r in read_metrics(run_dir, "valid")},
        "translations": [t[0].text for t in translator.translate(SENTENCES)],
    }
    if config.train.precision == "bf16":
        segment = json.loads((run_dir / "environment.json").read_text())["segments"][0]
        assert segment["precision"] == "bf16 autocast", "bf16 is not native here"
        got["cpu_bf16_flags"] = segment["cpu_bf16_flags"]
    return got


def machine_bf16_flags() -> list[str] | None:
    """This CPU's bf16 flags as a run's environment.json records them, or None where bf16
    is not native (a run asking for it trains in fp32)."""
    if autocast_dtype("bf16", torch.device("cpu")) is None:
        return None
    return machine()["cpu_bf16_flags"]


@pytest.mark.parametrize("reference", sorted(REFERENCES))
def test_the_rewritten_trainer_reproduces_the_recorded_run(tmp_path, reference):
    expected = json.loads((DATA / reference).read_text())
    if "cpu_bf16_flags" in expected and machine_bf16_flags() != expected["cpu_bf16_flags"]:
        pytest.skip(
            f"{reference} is bf16 on a CPU with {expected['cpu_bf16_flags']}; this one has "
            f"{machine_bf16_flags() or 'no native bf16'}"
        )
    got = json.loads(json.dumps(record(tmp_path / "run", **REFERENCES[reference])))  # str keys
    assert got["train_loss"].keys() == expected["train_loss"].keys()
    for kind in ("train_loss", "valid_loss"):
        for step, loss in expected[kind].items():
            assert got[kind][step] == pytest.approx(loss, rel=1e-5, abs=1e-6), (kind, step)
    assert got["translations"] == expected["translations"]


if __name__ == "__main__":
    import tempfile

    for reference in sys.argv[1:] or REFERENCES:
        changes = REFERENCES[reference]
        with tempfile.TemporaryDirectory() as scratch:
            got = record(Path(scratch) / "run", **changes)
        (DATA / reference).write_text(json.dumps(got, indent=1) + "\n")
        print(f"wrote {DATA / reference}")
