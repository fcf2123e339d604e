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
A change can move fp32's numbers by less than the tolerance (the packed attention projection,
e0b2d2d, moved a quarter of the fp32 losses by at most 2e-7 relative), so each fp32 reference
is also pinned bit for bit per machine: ``tests/data/pinned/REFERENCE.MACHINE.json``, keyed
by ``machine_key()`` (the CPU, the instruction set torch dispatches to, the bf16 flags, the
torch version), checked where the key is this machine's and skipped elsewhere, saying so.
``tests/data/reference_run_bf16.json`` is the run under bf16 autocast (re-recorded at commit
df1c645, on an AMD EPYC, after e0b2d2d's packed attention projection moved bf16's numbers;
first recorded at b05ce2b, after 15bbc8d's float32 dropout scale): bf16 kernels differ by
instruction set, so it is checked on a CPU with the bf16 flags it names (and is skipped
elsewhere, saying why). A change of the numbers moves a reference or a pin, and
experiments/results/numerics.yaml takes an entry for each precision it moves.
Re-record (only for a deliberate change of the numbers) with ``python tests/test_reference_run.py
[FILE ...]`` (every file by default; a bf16 one on a CPU that computes bf16 natively), and
this machine's pins with ``python tests/test_reference_run.py --pin`` (on every machine that
has one: a pin older than the change fails there).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from helpers import child_env  # noqa: E402
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
PINNED = ("reference_run.json", "reference_run_dropout0.json")  # fp32: pinned per machine


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


def machine_key() -> str:
    """What fp32's last bits depend on here: the CPU, the instruction set torch's kernels
    dispatch to, the bf16 flags, and torch's version, as one file-name-safe key."""
    m = machine()
    flags = "-".join(m["cpu_bf16_flags"]) or "no-bf16"
    key = f"{m['cpu']} {torch.backends.cpu.get_cpu_capability()} {flags} torch {torch.__version__}"
    return re.sub(r"[^a-z0-9.]+", "-", key.lower()).strip("-")


def pin_path(reference: str) -> Path:
    return DATA / "pinned" / f"{Path(reference).stem}.{machine_key()}.json"


@functools.cache
def recorded(reference: str) -> dict:
    """The reference's run, trained here once per test session (str keys, as JSON has)."""
    with tempfile.TemporaryDirectory() as scratch:
        got = record(Path(scratch) / "run", **REFERENCES[reference])
    return json.loads(json.dumps(got))


@pytest.mark.parametrize("reference", sorted(REFERENCES))
def test_the_rewritten_trainer_reproduces_the_recorded_run(reference):
    expected = json.loads((DATA / reference).read_text())
    if "cpu_bf16_flags" in expected and machine_bf16_flags() != expected["cpu_bf16_flags"]:
        pytest.skip(
            f"{reference} is bf16 on a CPU with {expected['cpu_bf16_flags']}; this one has "
            f"{machine_bf16_flags() or 'no native bf16'}"
        )
    got = recorded(reference)
    assert got["train_loss"].keys() == expected["train_loss"].keys()
    for kind in ("train_loss", "valid_loss"):
        for step, loss in expected[kind].items():
            assert got[kind][step] == pytest.approx(loss, rel=1e-5, abs=1e-6), (kind, step)
    assert got["translations"] == expected["translations"]


@pytest.mark.parametrize("reference", PINNED)
def test_this_machine_reproduces_its_pinned_fp32_run_bit_for_bit(reference):
    path = pin_path(reference)
    if not path.is_file():
        pytest.skip(
            f"no pin of {reference} for this machine ({machine_key()}): record one with "
            "python tests/test_reference_run.py --pin"
        )
    pinned = json.loads(path.read_text())
    got = recorded(reference)
    for kind in ("train_loss", "valid_loss", "translations"):
        assert got[kind] == pinned[kind], f"{path.name}: {kind} moved"
    # a pin recorded before the last fp32 change of numerics.yaml would pin another trainer
    from experiments.records import RESULTS
    from experiments.records.compare import load_numerics

    last = [e["since"] for e in load_numerics(RESULTS) if e.get("precision", "fp32") == "fp32"]
    after = subprocess.run(
        ["git", "merge-base", "--is-ancestor", last[-1], pinned["commit"]],
        cwd=DATA,
        capture_output=True,
        env=child_env(),
    )
    assert after.returncode != 1, f"{path.name} was recorded before {last[-1][:7]}"


def pin(reference: str) -> Path:
    """This machine's bit-for-bit record of an fp32 reference, with the key and commit."""
    path = pin_path(reference)
    path.parent.mkdir(exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=DATA, capture_output=True, text=True, env=child_env()
    ).stdout.strip()
    got = {"machine": machine_key(), "commit": commit, **recorded(reference)}
    path.write_text(json.dumps(got, indent=1) + "\n")
    return path


if __name__ == "__main__":
    sys.path.insert(0, str(DATA.parents[1]))  # experiments/, for the pins' check
    if sys.argv[1:] == ["--pin"]:
        for reference in PINNED:
            print(f"wrote {pin(reference)}")
        raise SystemExit(0)
    for reference in sys.argv[1:] or REFERENCES:
        got = recorded(reference)
        (DATA / reference).write_text(json.dumps(got, indent=1) + "\n")
        print(f"wrote {DATA / reference}")
