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
Re-record (only for a deliberate change of the numbers) with ``python tests/test_reference_run.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_train import read_metrics, tiny_config  # noqa: E402

from seq2seq.decoding.translate import Translator  # noqa: E402

REFERENCE = Path(__file__).parent / "data" / "reference_run.json"
SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest."]


def record(run_dir: Path) -> dict:
    from seq2seq.training.trainer import train

    config = tiny_config(
        train__max_steps=150,
        train__validate_every=50,
        train__precision="fp32",
        train__seed=7,
    )
    train(config, run_dir, progress=False)
    translator = Translator.from_run(run_dir)
    return {
        "train_loss": {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")},
        "valid_loss": {r["step"]: r["loss"] for r in read_metrics(run_dir, "valid")},
        "translations": [t[0].text for t in translator.translate(SENTENCES)],
    }


def test_the_rewritten_trainer_reproduces_the_recorded_run(tmp_path):
    expected = json.loads(REFERENCE.read_text())
    got = json.loads(json.dumps(record(tmp_path / "run")))  # the same int -> str keys
    assert got["train_loss"].keys() == expected["train_loss"].keys()
    for kind in ("train_loss", "valid_loss"):
        for step, loss in expected[kind].items():
            assert got[kind][step] == pytest.approx(loss, rel=1e-5, abs=1e-6), (kind, step)
    assert got["translations"] == expected["translations"]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        REFERENCE.write_text(json.dumps(record(Path(scratch) / "run"), indent=1) + "\n")
    print(f"wrote {REFERENCE}")
