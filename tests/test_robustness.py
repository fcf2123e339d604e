"""Faults, hostile files and bad input: never lose work, never run code, never crash
with a traceback.

Short versions of each check run here on a tiny model trained once per module; the long
versions (many kills, a 100,000-line stream) are scripts in ``experiments/robustness/``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_RUN, child_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seq2seq.commands.cli import main
from seq2seq.config import load_config
from seq2seq.decoding.load import load_run
from seq2seq.decoding.translate import Translator
from seq2seq.errors import Seq2SeqError
from seq2seq.run import checkpoint, rundir
from seq2seq.training import steps as train_module
from seq2seq.training.entry import train

REPO = Path(__file__).resolve().parents[1]
TINY = [
    *TINY_RUN,
    "model.max_positions=128",
    "data.max_len=100",
    "train.threads=1",
    "train.precision=fp32",
    "train.device=cpu",
    "train.warmup_steps=10",
]
# Several batches per epoch, so a kill can land mid-epoch as well as at a checkpoint.
KILL_RUN = [*TINY, "data.max_tokens=300", "train.max_steps=40", "train.validate_every=10"]
TIMEOUT_S = 120
LOSS_TOLERANCE = 1e-6  # relative; the resumed run is expected to be bit-identical


def env() -> dict[str, str]:
    return child_env(PYTHONPATH=str(REPO))


def cli_args(overrides: list[str]) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def seq2seq_process(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "seq2seq", *args],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def one_line_error(rc: int, stderr: str, match: str = "") -> str:
    """The CLI's contract for a user-facing failure: exit 2, one ``error:`` line, no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert rc == 2, stderr
    assert "Traceback" not in stderr
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    assert match in errors[0], errors[0]
    return errors[0]


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def digests(run: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.iterdir())
        if p.is_file()
    }


def valid_losses(run: Path) -> dict[int, float]:
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    records = [json.loads(line) for line in lines if line.endswith("}")]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "valid"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("robustness") / "run"
    train(
        load_config(None, [*TINY, "train.max_steps=30", "train.validate_every=15"]),
        run,
        progress=False,
    )
    return run


@pytest.fixture(scope="module")
def translator(run_dir) -> Translator:
    return Translator.from_run(run_dir)


@pytest.fixture
def copy_of(run_dir, tmp_path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


# ---------------------------------------------------------------------------------------
# 1. Hard kill during training; a dead trainer's lock does not stick.


# Runs ``python -m seq2seq ARGS`` and SIGKILLs it at a chosen checkpoint write: the Nth
# write of TARGET (``last`` or ``model``), either half-way through the temporary file or
# after it is whole but before the rename publishes it. Polling for the temporary file
# from outside misses the window on a busy machine; the many-kills script does both.
KILLER = r"""
import os, runpy, signal, sys
import safetensors.torch
target, moment, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.argv = ["seq2seq", *sys.argv[4:]]
seen = [0]
def hit(path):
    if os.path.basename(str(path)).startswith("." + target + "-"):
        seen[0] += 1
        return seen[0] == nth
    return False
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if moment == "mid-write":
    save = safetensors.torch.save_file
    def save_file(tensors, filename, metadata=None):
        save(tensors, filename, metadata=metadata)
        if hit(filename):
            os.truncate(filename, os.path.getsize(filename) // 2)
            die()
    safetensors.torch.save_file = save_file
else:
    replace = os.replace
    def os_replace(src, dst):
        if hit(src):
            die()
        return replace(src, dst)
    os.replace = os_replace
runpy.run_module("seq2seq", run_name="__main__")
"""


def train_killed_at(run: Path, target: str, moment: str, nth: int, *args: str) -> None:
    argv = [
        target,
        moment,
        str(nth),
        "train",
        "--out",
        str(run),
        "--no-progress",
        *args,
        *cli_args(KILL_RUN),
    ]
    done = subprocess.run(
        [sys.executable, "-c", KILLER, *argv],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]


def test_sigkill_during_checkpoint_writes_then_resume_matches_an_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    train(load_config(None, KILL_RUN), reference, progress=False)

    run = tmp_path / "killed"
    train_killed_at(run, "last", "mid-write", 3)
    assert (run / ".lock").is_file()  # left behind; its flock died with the process
    first = checkpoint.read_tensors(run / checkpoint.LAST_FILE)[1]["step"]
    train_killed_at(run, "last", "before-rename", 2, "--resume")
    second = checkpoint.read_tensors(run / checkpoint.LAST_FILE)[1]["step"]
    assert 0 < first < second < 40
    for name in (checkpoint.LAST_FILE, checkpoint.BEST_FILE):
        checkpoint.read_tensors(run / name)  # whole files, never half-written ones

    state = train(load_config(None, KILL_RUN), run, resume=True, progress=False)
    assert state["step"] == 40
    expected, got = valid_losses(reference), valid_losses(run)
    assert sorted(got) == sorted(expected) == [10, 20, 30, 40]  # each validation logged once
    for step, loss in expected.items():
        assert got[step] == pytest.approx(loss, rel=LOSS_TOLERANCE)


def test_a_live_trainer_holds_the_run_and_its_death_frees_it(copy_of, capsys):
    # Another process holds the run's flock, as a running trainer does.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            "f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.truncate(0)\n"
            "f.write('4242'); f.flush(); print('locked', flush=True); time.sleep(120)",
            str(copy_of / ".lock"),
        ],
        env=env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    before = {k: v for k, v in digests(copy_of).items() if k != ".lock"}
    try:
        assert holder.stdout.readline().strip() == "locked"
        argv = [
            "train",
            "--out",
            copy_of,
            "--resume",
            "--max-steps",
            "32",
            "--no-progress",
            *cli_args(TINY),
        ]
        rc, _, err = run_main(argv, capsys)
        one_line_error(rc, err, "in use by another training process (pid 4242)")
        assert {k: v for k, v in digests(copy_of).items() if k != ".lock"} == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    rc, _, err = run_main(argv, capsys)
    assert rc == 0, err
    assert checkpoint.read_tensors(copy_of / checkpoint.LAST_FILE)[1]["step"] == 32
    with open(copy_of / ".lock") as f:  # released at exit, not merely dead
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


# ---------------------------------------------------------------------------------------
# 2. Hostile run directories: one clear line, exit status 2, and no pickle is ever run.


class Payload:
    """Unpickling this creates ``marker``: proof that a loader executed it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_the_payload_does_run_when_unpickled(tmp_path):
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize(
    "name", [checkpoint.BEST_FILE, checkpoint.LAST_FILE, "spm.model", checkpoint.CONFIG_FILE]
)
@pytest.mark.parametrize("write", ["pickle", "torch.save"])
def test_a_pickle_under_any_name_is_refused_and_never_run(copy_of, tmp_path, capsys, name, write):
    marker = tmp_path / "ran"
    if write == "pickle":
        (copy_of / name).write_bytes(pickle.dumps(Payload(marker)))
    else:
        torch.save({"model": Payload(marker)}, copy_of / name)
    rc, out, err = run_main(["translate", copy_of, "ein Hund"], capsys)
    if name == checkpoint.LAST_FILE:  # translate never reads the training state; resume does
        assert rc == 0 and out.count("\n") == 1, err
        rc, out, err = run_main(
            ["train", "--out", copy_of, "--resume", "--max-steps", "31", *cli_args(TINY)], capsys
        )
    one_line_error(rc, err, name)
    assert not marker.exists()


def test_a_pickle_in_a_fresh_cli_process_is_not_run(copy_of, tmp_path):
    marker = tmp_path / "ran"
    (copy_of / checkpoint.BEST_FILE).write_bytes(pickle.dumps(Payload(marker)))
    proc = seq2seq_process("translate", str(copy_of), "ein Hund")
    out, err = proc.communicate(timeout=TIMEOUT_S)
    one_line_error(proc.returncode, err, "not a readable safetensors file")
    assert out == "" and not marker.exists()


def edit_tensors(edit):
    def tamper(run: Path) -> None:
        tensors, metadata = checkpoint.read_tensors(run / checkpoint.BEST_FILE)
        edit(tensors, sorted(tensors)[0])
        checkpoint.write_tensors(run / checkpoint.BEST_FILE, tensors, metadata)

    return tamper


def truncate(name: str, keep: float):
    def tamper(run: Path) -> None:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: int(len(data) * keep)])

    return tamper


def edit_config(old: str, new: str):
    def tamper(run: Path) -> None:
        text = (run / checkpoint.CONFIG_FILE).read_text()
        assert old in text
        (run / checkpoint.CONFIG_FILE).write_text(text.replace(old, new, 1))

    return tamper


def replace_with_directory(name: str):
    def tamper(run: Path) -> None:
        (run / name).unlink()
        (run / name).mkdir()

    return tamper


HOSTILE = {
    "weights truncated": (truncate(checkpoint.BEST_FILE, 0.5), "not a readable safetensors file"),
    "weights empty": (truncate(checkpoint.BEST_FILE, 0.0), "not a readable safetensors file"),
    "weights header only": (
        truncate(checkpoint.BEST_FILE, 0.002),
        "not a readable safetensors file",
    ),
    "weights wrong shape": (
        edit_tensors(lambda t, k: t.__setitem__(k, torch.zeros(3, 3))),
        "the model needs",
    ),
    "weights wrong dtype": (
        edit_tensors(lambda t, k: t.__setitem__(k, t[k].double())),
        "the model needs",
    ),
    "weights extra tensor": (
        edit_tensors(lambda t, k: t.__setitem__("evil", torch.zeros(1))),
        "unexpected",
    ),
    "weights missing tensor": (edit_tensors(lambda t, k: t.pop(k)), "missing"),
    "weights NaN": (
        edit_tensors(lambda t, k: t[k].view(-1).__setitem__(0, float("nan"))),
        "NaN or Inf",
    ),
    "weights a directory": (
        replace_with_directory(checkpoint.BEST_FILE),
        "model.safetensors missing",
    ),
    "config unknown key": (
        edit_config("model:\n", "model:\n  n_experts: 8\n"),
        "unknown key 'model.n_experts'",
    ),
    "config unknown section": (
        edit_config("model:\n", "evil:\n  x: 1\nmodel:\n"),
        "unknown key 'evil'",
    ),
    "config negative size": (edit_config("d_model: 32", "d_model: -32"), "model.d_model"),
    "config zero heads": (edit_config("n_heads: 4", "n_heads: 0"), "model.d_model"),
    "config wrong type": (
        edit_config("d_ff: 64", "d_ff: sixty-four"),
        "model.d_ff: expected a whole number",
    ),
    "config huge width": (
        edit_config("d_model: 32", "d_model: 320000000000"),
        "model.d_model",
    ),
    "config python tag": (
        edit_config("ban_eos: false", "ban_eos: !!python/object/apply:os.getpid []"),
        "not valid YAML",
    ),
    "config not a mapping": (
        lambda run: (run / "config.yaml").write_text("- 1\n- 2\n"),
        "must be a mapping",
    ),
    "config binary": (
        lambda run: (run / "config.yaml").write_bytes(bytes(range(256))),
        "not valid YAML",
    ),
    "config vocab mismatch": (edit_config("src_vocab_size: ", "src_vocab_size: 1"), "vocabulary"),
    "config missing": (lambda run: (run / "config.yaml").unlink(), "not a run directory"),
    "tokenizer text": (
        lambda run: (run / "spm.model").write_text("hello"),
        "not a SentencePiece model",
    ),
    "tokenizer random bytes": (
        lambda run: (run / "spm.model").write_bytes(os.urandom(4096)),
        "not a SentencePiece model",
    ),
    "tokenizer truncated": (truncate("spm.model", 0.3), "not a SentencePiece model"),
    "tokenizer a directory": (replace_with_directory("spm.model"), "no tokenizer"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_run_directory_is_one_clear_error(copy_of, capsys, case):
    tamper, message = HOSTILE[case]
    tamper(copy_of)
    rc, out, err = run_main(["translate", copy_of, "ein Hund"], capsys)
    one_line_error(rc, err, message)
    assert out == ""
    with pytest.raises(Seq2SeqError, match=message):
        load_run(copy_of)


@pytest.mark.parametrize(
    "tamper, message",
    [
        (truncate(checkpoint.LAST_FILE, 0.5), "not a readable safetensors file"),
        (
            lambda run: shutil.copy(run / checkpoint.BEST_FILE, run / checkpoint.LAST_FILE),
            "not a training state",
        ),
        (lambda run: (run / checkpoint.LAST_FILE).unlink(), "cannot resume"),
    ],
)
def test_a_hostile_training_state_stops_resume_with_one_line(copy_of, capsys, tamper, message):
    tamper(copy_of)
    rc, _, err = run_main(
        ["train", "--out", copy_of, "--resume", "--max-steps", "31", *cli_args(TINY)], capsys
    )
    one_line_error(rc, err, message)


def test_an_absurd_layer_count_is_refused_before_building(copy_of):
    edit_config("n_enc_layers: 1", "n_enc_layers: 100000000")(copy_of)
    with pytest.raises(Seq2SeqError, match="n_enc_layers"):
        checkpoint.load_config_file(copy_of)  # where the check belongs: no model is built here


# ---------------------------------------------------------------------------------------
# 3. Bad text: any Unicode, one output line per input line, no crash.

ODD = [
    "\x00",
    "\t",
    "\x0b",
    "\x1e",
    "\u0301",
    "\u202e",
    "\u200f",
    "\u05d0\u05d1",
    "\u0627\u0644",
    "\U0001f600",
    "\U0001f468\u200d\U0001f469",
    "\ufeff",
    "\ufffd",
    "\u2028",
    "\x85",
    "\r",
    " ",
    "\u3000",
]
LINE = st.lists(
    st.one_of(st.characters(exclude_characters="\n"), st.sampled_from(ODD)), max_size=30
).map("".join)


def check_lines(results, lines) -> None:
    assert len(results) == len(lines)
    for line, hyps in zip(lines, results, strict=True):
        assert len(hyps) == 1
        assert "\n" not in hyps[0].text and "\r" not in hyps[0].text
        if not line.strip(" \t"):
            assert hyps[0].text == ""


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(LINE, min_size=1, max_size=6))
def test_fuzz_library_translate(translator, lines):
    check_lines(translator.translate(lines), lines)


@pytest.mark.parametrize(
    "line",
    ["Hund " * 4000, "\u0301" * 20000, "\U0001f600" * 5000, " " * 100000, "\x00" * 1000],
    ids=["words", "combining marks", "emoji", "spaces", "NUL"],
)
def test_very_long_lines_are_cut_not_fatal(translator, capsys, line):
    check_lines(translator.translate([line, "ein Hund"]), [line, "ein Hund"])


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(
        st.one_of(LINE, st.sampled_from(["\ud800", "a\udfffb", "\udcff" * 3])),
        min_size=1,
        max_size=5,
    )
)
def test_fuzz_cli_file_in_file_out(run_dir, tmp_path, capsys, lines):
    # A file cannot hold a lone surrogate as UTF-8: "surrogatepass" writes the invalid bytes
    # a broken producer would, which the CLI documents as decoded with replacement characters.
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass"))
    rc, _, err = run_main(["translate", run_dir, "-i", src, "-o", out], capsys)
    assert rc == 0 and "Traceback" not in err
    assert out.read_text(encoding="utf-8").count("\n") == len(lines)
    assert out.read_text(encoding="utf-8").split("\n")[-1] == ""


@pytest.mark.parametrize("text", ["ab\udcffc", "\ud800"])
def test_cli_argument_that_is_not_utf8(run_dir, capsys, text):
    rc, out, err = run_main(["translate", run_dir, text, "ein Hund"], capsys)
    assert rc == 0 and out.count("\n") == 2, err


# ---------------------------------------------------------------------------------------
# 4. Bad numbers: NaN/Inf steps are skipped, then the run stops; no broken checkpoint.


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_losses_are_skipped_then_stop_the_run(copy_of, monkeypatch, capsys, bad):
    clean = train_module.sequence_loss

    def poisoned(logits, tgt_out, label_smoothing):
        loss = clean(logits, tgt_out, label_smoothing)
        return loss * bad if torch.is_grad_enabled() else loss  # training steps only

    best = (copy_of / checkpoint.BEST_FILE).read_bytes()
    before, _ = checkpoint.read_tensors(copy_of / checkpoint.LAST_FILE)
    monkeypatch.setattr(train_module, "sequence_loss", poisoned)
    config = load_config(
        None, [*TINY, "train.max_steps=60", "train.validate_every=15", "train.max_bad_steps=3"]
    )
    with pytest.raises(Seq2SeqError, match="4 steps with a NaN/Inf loss \\(max 3\\)"):
        train(config, copy_of, resume=True, progress=False)
    assert capsys.readouterr().err.count("non-finite loss at step 31; step skipped") == 4
    assert (copy_of / checkpoint.BEST_FILE).read_bytes() == best
    after, counters = checkpoint.read_tensors(copy_of / checkpoint.LAST_FILE)
    assert counters["step"] == 30 and counters["bad_steps"] == 3
    for name, tensor in before.items():
        if name.startswith("model."):
            assert torch.equal(after[name], tensor)


def test_an_absurd_learning_rate_is_one_line_and_touches_nothing(copy_of, capsys):
    """lr 1e30 once trained into NaN (caught by the bad-step check); the config now refuses it
    before anything is written, so the existing run stays as it was."""
    before = (copy_of / checkpoint.LAST_FILE).read_bytes()
    argv = [
        "train",
        "--out",
        copy_of,
        "--overwrite",
        "--no-progress",
        "--max-steps",
        "30",
        *cli_args([*TINY, "train.lr=1.0e+30", "train.warmup_steps=0", "train.max_bad_steps=2"]),
    ]
    rc, _, err = run_main(argv, capsys)
    one_line_error(rc, err, "train.lr must be in")
    assert (copy_of / checkpoint.LAST_FILE).read_bytes() == before


def test_a_non_finite_gradient_is_a_bad_step_too(copy_of, monkeypatch, capsys):
    clean = train_module.sequence_loss
    calls = {"n": 0}

    def nan_gradient(logits, tgt_out, label_smoothing):
        loss = clean(logits, tgt_out, label_smoothing)
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 2:  # value 0, gradient 0 * d sqrt(x)/dx at 0 = 0 * inf = NaN
                return loss + 0.0 * torch.sqrt(logits.sum() * 0.0)
        return loss

    monkeypatch.setattr(train_module, "sequence_loss", nan_gradient)
    config = load_config(None, [*TINY, "train.max_steps=35", "train.validate_every=15"])
    train(config, copy_of, resume=True, progress=False)
    tensors, counters = checkpoint.read_tensors(copy_of / checkpoint.LAST_FILE)
    assert all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point())
    assert counters["bad_steps"] == 1


# ---------------------------------------------------------------------------------------
# 5. A crash half-way through a translation keeps the lines already written.


def test_sigkill_mid_translation_keeps_the_written_lines(run_dir, translator, tmp_path):
    # The CLI writes 1000 lines at a time: the kill lands after the first chunk at the latest.
    lines = [f"Hund {i}" if i % 7 else "" for i in range(2500)]
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    proc = seq2seq_process("translate", str(run_dir), "-i", str(src), "-o", str(out))
    deadline = time.time() + TIMEOUT_S
    while (
        time.time() < deadline
        and proc.poll() is None
        and not (out.is_file() and out.stat().st_size)
    ):
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = out.read_text(encoding="utf-8")
    assert written.endswith("\n")  # whole lines only
    written = written.split("\n")[:-1]
    assert 0 < len(written) < len(lines)
    expected = [hyps[0].text for hyps in translator.translate(lines[: len(written)])]
    assert written == expected


# ---------------------------------------------------------------------------------------
# 6. Unwritable or full output locations; an existing run is never overwritten.


@pytest.mark.parametrize("where", ["under a file", "proc"])
def test_an_unwritable_run_directory_fails_at_start(tmp_path, capsys, where):
    (tmp_path / "file.txt").write_text("not a directory")
    out = tmp_path / "file.txt" / "run" if where == "under a file" else Path("/proc/seq2seq-run")
    argv = ["train", "--out", out, "--no-progress", *cli_args([*TINY, "train.max_steps=2"])]
    rc, _, err = run_main(argv, capsys)
    one_line_error(rc, err, "cannot write to")
    assert "data/sample" not in err  # failed before loading any data


def test_an_existing_run_is_never_overwritten_without_a_flag(copy_of, capsys):
    before = digests(copy_of)
    rc, _, err = run_main(
        ["train", "--out", copy_of, "--no-progress", *cli_args([*TINY, "train.max_steps=2"])],
        capsys,
    )
    one_line_error(rc, err, "already holds a run; use --resume")
    assert digests(copy_of) == before


@pytest.fixture
def tiny_disk(tmp_path):
    """A tmpfs of a given size (needs root); unmounted afterwards."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk-{size}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            env=env(),
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False, env=env())


@pytest.mark.parametrize("size", ["64k", "300k"])  # full at the tokenizer / at the first checkpoint
def test_a_full_disk_is_one_clear_error_and_keeps_no_partial_file(tiny_disk, capsys, size):
    out = tiny_disk(size) / "run"
    argv = [
        "train",
        "--out",
        out,
        "--no-progress",
        *cli_args([*TINY, "train.max_steps=20", "train.validate_every=5"]),
    ]
    try:
        rc, _, err = run_main(argv, capsys)
    finally:
        names = sorted(os.listdir(out)) if out.is_dir() else []
        for name in names:  # whatever is there is whole: no temp, no half-written file
            assert not name.startswith(".") or name in (".lock", rundir.MARKER), names
            if name.endswith(".safetensors"):
                checkpoint.read_tensors(out / name)
    one_line_error(rc, err, "No space left on device")


# ---------------------------------------------------------------------------------------
# 7. Concurrent use of one run directory.


def test_two_translations_of_one_run_at_once(run_dir, translator, tmp_path):
    lines = [f"{i} Hunde spielen im Park" for i in range(200)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    procs = [seq2seq_process("translate", str(run_dir), "-i", str(src)) for _ in range(2)]
    results = [proc.communicate(timeout=TIMEOUT_S) for proc in procs]
    expected = "".join(hyps[0].text + "\n" for hyps in translator.translate(lines))
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert out == expected
