"""Many hard kills of one training run; every time ``--resume`` carries on from the last
good state, and the finished run's validation losses equal an uninterrupted run's.

Kills alternate between random moments (a uniform delay after the process starts) and
injected ones at a checkpoint write: half-way through the temporary file, or with the file
whole but before the rename publishes it (see ``KILLER`` in tests/test_robustness.py).
After each kill every file a loader reads must load; a kill before the first training
state means starting again with ``--overwrite``. The flock in ``.lock`` must never block.

    OMP_NUM_THREADS=1 python experiments/robustness/kill_resume.py --kills 12 --steps 200
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from test_robustness import KILL_RUN, KILLER, cli_args, env, valid_losses  # noqa: E402

from seq2seq.data.tokenizer import Tokenizer  # noqa: E402
from seq2seq.run import checkpoint  # noqa: E402


def start(
    run: Path, resume: bool, inject: tuple[str, str, int] | None, steps: int
) -> subprocess.Popen:
    flags = ["--resume"] if resume else ["--overwrite"]
    overrides = [*KILL_RUN, f"train.max_steps={steps}"]
    args = ["train", "--out", str(run), "--no-progress", *flags, *cli_args(overrides)]
    if inject is None:
        command = [sys.executable, "-m", "seq2seq", *args]
    else:
        command = [sys.executable, "-c", KILLER, inject[0], inject[1], str(inject[2]), *args]
    return subprocess.Popen(
        command, cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def check_whole(run: Path) -> dict:
    """Every file a loader would read loads; returns what the directory holds."""
    found = {"temps": sorted(p.name for p in run.glob(".*-*.*"))}
    for name in (checkpoint.LAST_FILE, checkpoint.BEST_FILE):
        if (run / name).is_file():
            found[name] = checkpoint.read_tensors(run / name)[1].get("step")
    if (run / checkpoint.CONFIG_FILE).is_file():
        checkpoint.load_config_file(run)
    if (run / "spm.model").is_file() and (run / checkpoint.CONFIG_FILE).is_file():
        Tokenizer.load(run)  # the tokenizer is written before config.yaml
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200, help="training steps of the run")
    parser.add_argument("--out", type=Path, default=Path("/tmp/seq2seq-kill-resume"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)

    began = time.time()
    reference = start(args.out / "reference", False, None, args.steps)
    assert reference.wait() == 0, reference.stderr.read()
    wall = time.time() - began

    run = args.out / "killed"
    log = []
    kills = 0
    while kills < args.kills:
        resume = (run / checkpoint.LAST_FILE).is_file()
        kind = ["random", "mid-write", "before-rename"][kills % 3]
        inject = None if kind == "random" else ("last", kind, rng.randint(1, 4))
        proc = start(run, resume, inject, args.steps)
        if kind == "random":
            delay = rng.uniform(0.1, 0.6) * wall
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        code = proc.wait()
        stderr = proc.stderr.read()
        if code == 0:
            log.append({"kind": kind, "resume": resume, "outcome": "finished before the kill"})
            break
        assert code == -signal.SIGKILL, stderr[-2000:]
        kills += 1
        entry = {
            "kind": kind,
            "nth_write": inject and inject[2],
            "resume": resume,
            **check_whole(run),
        }
        log.append(entry)
        print(json.dumps(entry), flush=True)

    final = start(run, (run / checkpoint.LAST_FILE).is_file(), None, args.steps)
    assert final.wait() == 0, final.stderr.read()
    expected, got = valid_losses(args.out / "reference"), valid_losses(run)
    worst = max(abs(got[s] - loss) / abs(loss) for s, loss in expected.items())
    summary = {
        "kills": kills,
        "validations": sorted(got),
        "same_steps": sorted(got) == sorted(expected),
        "max_relative_loss_difference": worst,
        "leftover_temp_files": sorted(p.name for p in run.glob(".*-*.*")),
        "reference_wall_s": round(wall, 1),
    }
    print(json.dumps(summary, indent=2))
    (args.out / "summary.json").write_text(json.dumps({"kills": log, **summary}, indent=2))
    assert summary["same_steps"] and worst <= 1e-6


if __name__ == "__main__":
    main()
