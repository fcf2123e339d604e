"""One device check that fits a lease (issue 61): what decides the GPU code next, measured in
one call of at most 6 minutes on a lent GPU, on gpu_check's stage runner (``stages.py``: a
child process per stage with its deadline, the record rewritten after every stage).

| # | stage | what it runs | deadline on a GPU (s) |
|---|---|---|---:|
| 0 | env | nvidia-smi (name, clocks, power), host CPU, MHz and load, versions, every runtime import | 10 |
| 1 | rates | a Trainer per precision ``train.precision`` accepts (tf32, bf16, fp16), one process, the same batches, blocks interleaved A B C C B A | 40 |
| 2 | profile | torch.profiler over 20 trainer steps: top 20 by GPU and CPU time, kernel ms, launches, syncs; 5 steps under sync debug mode | 30 |
| 3 | main | the README's main job, ``seq2seq train --src de --tgt en --max-time 3``, GPU utilisation sampled | 210 |
| 4 | readme | on that run: evaluate greedy and beam 5, translate --verbose, attention -o html, serve and two requests, ``seq2seq.load(...).inspect(...)`` | 45 |
| 5 | torchrun | ``torchrun --nproc_per_node=1`` training 20 steps, then one rank's NCCL calls | 25 |

The deadlines sum to 360 s (``--total``); each stage is cut at its deadline or at the time
left, whichever comes first, and the next stage goes on. A stage whose imports failed in
stage 0 is skipped with the reason. Under ``--out DIR`` come back ``benchmark.json`` (the
record, which ``python -m experiments.records render`` reads as a device-check benchmark) and
``files.tar.gz`` (the stages' logs, the main run's metrics and log, the hypotheses, the
explorer page, the GPU samples, the profile tables; no weights): two files, as a lent
machine's ``$OUT`` takes few.

The one call on a lent H200, once the dry run (below) passed here. The machine has no
internet and lacks sacremoses: fetch its wheel here into ``.whl`` (ignored by git, so it
travels only when carried); the driver unpacks every wheel there with the standard library's
zipfile into the scratch folder and puts that on every stage's PYTHONPATH, after this
checkout. ``timeout_s`` 420 leaves a minute over the 360 s of stages; with the machine's
start that is about 9 of a lease's 15 minutes, leaving one rerun of a short stage::

    echo /.whl/ >> .git/info/exclude                                   # here, once
    python3 -m pip download --no-deps sacremoses==0.2.0 -d .whl        # here, once
    # the device tool's run: timeout_s 420, carry [".whl"], command:
    python3 experiments/device_check.py --out $OUT/device-check

``--only readme`` (names separated by commas) reruns stages alone into the same record; the
scratch folder (``--scratch``) keeps the main job's run for it while the machine stays warm,
and on a fresh machine the readme stage trains a short run of its own first.

    python experiments/device_check.py --cpu --out /tmp/device-check   # the dry run, minutes here
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from experiments.device_commands import (  # noqa: E402
    FILES,
    main_child,
    nccl_child,
    pack,
    readme_child,
    torchrun_child,
    write_result,
)
from experiments.stages import Stage, dry_run, run_stages, write_json  # noqa: E402

RECORD = "benchmark.json"
# Planned on an H200 (est, from the gpu-check records: a step ~20 ms, a start-up of torch and
# the data ~6 s): env 6, rates 40 (five arms, the two captured ones capturing 12 shapes
# each), profile 20 (reading 20 steps' profiler events takes seconds), main 195 (3 minutes,
# the start-up and the finish), readme 37, torchrun 20.
DEADLINES = {"env": 10, "rates": 60, "profile": 30, "main": 210, "readme": 45, "torchrun": 25}
TOTAL_SECONDS = sum(DEADLINES.values())  # 380: a lent machine's 15 minutes hold it and a rerun
# --cpu: the dry run on this 2-core machine, each stage importing torch in seconds
CPU_DEADLINES = {
    "env": 60,
    "rates": 150,
    "profile": 90,
    "main": 240,
    "readme": 300,
    "torchrun": 240,
}
# Every stage but env trains or decodes: none runs without these. Stage 0 imports sacremoses
# too, which evaluate's literature-scale BLEU alone needs (the readme stage skips evaluate
# without it), and looks up datasets (the Hub source's; importing it takes seconds).
TRAINING = ("torch", "numpy", "sentencepiece", "sacrebleu", "matplotlib", "yaml", "tqdm")
TRAINING += ("safetensors", "filelock")
OPTIONAL = ("datasets",)
SIZES = {  # steps: on a GPU (a step ~20 ms), and in the dry run (the tests' tiny run)
    "gpu": {"rates": {"warmup": 30, "block": 30, "pairs": 3}, "profile": {"warmup": 30}},
    "cpu": {"rates": {"warmup": 2, "block": 2, "pairs": 2}, "profile": {"warmup": 2}},
}
PROFILED = {"gpu": {"steps": 20, "sync_steps": 5}, "cpu": {"steps": 3, "sync_steps": 0}}
NVIDIA_SMI = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit"
NVIDIA_SMI += ",temperature.gpu,utilization.gpu,memory.used,memory.total"


# -- the driver -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help=f"{RECORD} and {FILES} go here")
    p.add_argument("--cpu", action="store_true", help="the dry run, on the CPU, tiny sizes")
    p.add_argument("--only", help="these stages alone (names, comma-separated); the record in "
                   "--out keeps the others'")  # fmt: skip
    p.add_argument("--total", type=int, help=f"seconds for everything (default {TOTAL_SECONDS})")
    p.add_argument("--deadline", action="append", default=[], metavar="STAGE=SECONDS",
                   help="one stage's deadline (repeatable)")  # fmt: skip
    p.add_argument("--main-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the main job, as train --set takes it (repeatable): "
                   "train.cuda_graphs=true trains it captured")  # fmt: skip
    p.add_argument("--wheels", type=Path, default=REPO / ".whl", help="wheels to unpack")
    p.add_argument("--scratch", type=Path, help="runs and stage files (default: a folder in "
                   "the system's temporary one, kept for --only)")  # fmt: skip
    p.add_argument("--stage", help=argparse.SUPPRESS)  # a stage's child
    args = p.parse_args(argv)
    args.scratch = args.scratch or Path(tempfile.gettempdir()) / "seq2seq-device-check"
    deadlines = dict(CPU_DEADLINES if args.cpu else DEADLINES)
    for given in args.deadline:
        name, _, seconds = given.partition("=")
        if name not in deadlines or not seconds.isdigit():
            p.error(f"--deadline {given}: use STAGE=SECONDS, STAGE one of {', '.join(deadlines)}")
        deadlines[name] = int(seconds)
    args.deadlines = deadlines
    args.total = args.total or (sum(deadlines.values()) if args.cpu else TOTAL_SECONDS)
    only = args.only.split(",") if args.only else list(deadlines)
    unknown = [name for name in only if name not in deadlines]
    if unknown:
        p.error(f"--only: no stage {', '.join(unknown)} (stages: {', '.join(deadlines)})")
    args.only = only
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stage:
        return CHILDREN[args.stage](args)
    began = time.monotonic()
    args.scratch.mkdir(parents=True, exist_ok=True)
    record = previous_record(args.out / RECORD) if args.only != list(args.deadlines) else {}
    record.update(
        benchmark="device-check",
        dry_run_on_cpu=args.cpu,
        command=" ".join(["python3", "experiments/device_check.py", *sys.argv[1:]]),
        budget_s=args.total,
        deadlines_s=args.deadlines,
        wheels=unpack_wheels(args.wheels, args.scratch / "deps"),
    )
    if args.only != list(args.deadlines):
        record["rerun"] = args.only
    record.setdefault("stages", {})

    def save() -> None:
        record["seconds"] = round(time.monotonic() - began, 1)
        write_json(args.out / RECORD, record)
        pack(args.scratch, args.out / FILES)

    save()
    run_stages(
        [s for s in stages(args) if s.name in args.only],
        record["stages"],
        save,
        lambda: args.total - (time.monotonic() - began),
        lambda stage: blocked(stage, record["stages"].get("env", {}), args.cpu),
        tag="device_check",
    )
    print(summary(record))
    if not args.cpu and record["stages"].get("env", {}).get("cuda") is False:
        print("device_check: no GPU is present here (--cpu runs the dry run)", file=sys.stderr)
        return 2
    return 0


def previous_record(path: Path) -> dict[str, Any]:
    """The record a rerun of some stages goes on from (none yet: a new one)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def unpack_wheels(folder: Path, into: Path) -> list[str]:
    """Every wheel in ``folder`` unpacked into ``into`` (a wheel is a zip of importable
    folders: no pip is needed), ``into`` then put on PYTHONPATH for every stage; the names."""
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(into)
    if wheels:
        given = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(into), given) if p)
    return [w.name for w in wheels]


def blocked(stage: Stage, env: dict[str, Any], cpu: bool) -> str | None:
    """Why ``stage`` cannot run, from what stage 0 found: no GPU, or an import that failed."""
    if not cpu and env.get("cuda") is False:
        return "no CUDA device here"
    imports = env.get("imports", {})
    needed = () if stage.name == "env" else TRAINING
    missing = [m for m in needed if "error" in imports.get(m, {})]
    return f"needs {', '.join(missing)}, which did not import" if missing else None


def stages(args: argparse.Namespace) -> list[Stage]:
    """The stages, each this script again as a child (``--stage NAME``), reading back the
    JSON it rewrites as it goes."""

    def stage(name: str) -> Stage:
        me = [sys.executable, __file__, "--stage", name, "--scratch", str(args.scratch)]
        me += ["--out", str(args.out), *(["--cpu"] if args.cpu else [])]
        me += [x for setting in args.main_set for x in ("--main-set", setting)]
        result = args.scratch / f"{name}.json"
        result.unlink(missing_ok=True)  # a rerun's result, never the last call's
        return Stage(
            name,
            me,
            args.deadlines[name],
            read=lambda: json.loads(result.read_text()),
            read_when_cut=True,
            log=args.scratch / "logs" / f"{name}.log",
        )

    return [stage(name) for name in args.deadlines]


def summary(record: dict[str, Any]) -> str:
    lines = [f"device_check ({'dry run on the CPU' if record['dry_run_on_cpu'] else 'GPU'})"]
    for name, result in record["stages"].items():
        why = f"  ({result['why']})" if "why" in result else ""
        lines.append(f"  {name:10} {result['status']:10} {result.get('seconds', 0):6.1f} s{why}")
    lines.append(f"{record['seconds']:.0f} s in all; the record: {RECORD}, the files: {FILES}")
    return "\n".join(lines)


# -- the stages' children -------------------------------------------------------------------


def env_child(args: argparse.Namespace) -> int:
    """Stage 0: the imports first (a failed one is recorded, not raised), then the GPU as
    nvidia-smi and torch see it, the host and the versions."""
    found: dict[str, Any] = {"imports": imports_found(), "nvidia_smi": nvidia_smi(NVIDIA_SMI)}
    found["host"] = host()
    write_result(args, found)
    if "error" in found["imports"]["torch"]:
        return 1
    import torch

    found["cuda"] = torch.cuda.is_available()
    if all("error" not in found["imports"][m] for m in TRAINING):
        from seq2seq.run.runlog import accelerator, machine

        device = torch.device("cuda", 0) if found["cuda"] and not args.cpu else None
        found["environment"] = {**machine(), **(accelerator(device) if device else {})}
    write_result(args, found)
    return 0


def imports_found() -> dict[str, dict[str, str]]:
    """Each runtime dependency imported: its version, or the error that stopped it."""
    import importlib
    import importlib.metadata
    import importlib.util

    found = {}
    for name in (*TRAINING, "sacremoses"):
        try:
            module = importlib.import_module(name)
            found[name] = {  # from where: a carried wheel's copy, or the machine's
                "version": str(getattr(module, "__version__", "?")),
                "from": str(Path(module.__file__).parent.parent),
            }
        except Exception as e:  # noqa: BLE001 -- any failure to import is the finding
            found[name] = {"error": f"{type(e).__name__}: {e}"}
    for name in OPTIONAL:
        there = importlib.util.find_spec(name) is not None
        found[name] = (
            {"version": importlib.metadata.version(name), "imported": False}
            if there
            else {"error": "not installed"}
        )
    return found


def nvidia_smi(fields: str) -> dict[str, str] | str:
    """``nvidia-smi --query-gpu=FIELDS`` of GPU 0, by field; what stopped it, in words."""
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"not read: {e}"
    if done.returncode != 0:
        return f"not read: {(done.stdout + done.stderr).strip()[-200:]}"
    values = [v.strip() for v in done.stdout.splitlines()[0].split(",")]
    return dict(zip(fields.split(","), values, strict=False))


def host() -> dict[str, Any]:
    """The host's CPU: model, cores, the MHz each core runs at now, the load and memory."""
    info: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_average": os.getloadavg()}
    if hasattr(os, "sched_getaffinity"):
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    try:
        text = Path("/proc/cpuinfo").read_text()
        mhz = sorted(float(v) for v in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M))
        model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        info["cpu"] = model.group(1) if model else None
        if mhz:
            info["mhz_now"] = {"min": mhz[0], "median": mhz[len(mhz) // 2], "max": mhz[-1]}
        memory = Path("/proc/meminfo").read_text()
        for key in ("MemTotal", "MemAvailable"):
            found = re.search(rf"^{key}:\s*(\d+) kB", memory, re.M)
            info[f"{key}_gb"] = round(int(found.group(1)) / 2**20, 1) if found else None
    except OSError as e:
        info["proc"] = f"not read: {e}"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for key in ("CPU max MHz", "CPU min MHz", "Model name", "Thread(s) per core"):
            found = re.search(rf"^{re.escape(key)}:\s*(.+)$", lscpu, re.M)
            if found:
                info[f"lscpu {key}"] = found.group(1).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        info["lscpu"] = f"not read: {e}"
    return info


def trainer_overrides(args: argparse.Namespace) -> list[str]:
    """The trainer stages' ``--set`` strings: the README's defaults on a GPU (device auto
    finds it), the tiny run on the CPU."""
    return [*dry_run(), "train.device=cpu"] if args.cpu else []


def kind(args: argparse.Namespace) -> str:
    return "cpu" if args.cpu else "gpu"


def rates_child(args: argparse.Namespace) -> int:
    """Stage 1 (``device_measure.rates_stage``)."""
    from experiments.device_measure import rates_stage, stage_config
    from seq2seq.run.runtime import setup_runtime

    overrides = trainer_overrides(args)
    t = stage_config(overrides).train
    runtime = setup_runtime(t.device, t.threads, t.attention_kernels)
    sizes = SIZES[kind(args)]["rates"]
    rates_stage(overrides, args.scratch, runtime, sizes, lambda found: write_result(args, found))
    return 0


def profile_child(args: argparse.Namespace) -> int:
    """Stage 2 (``device_measure.profile_stage``), at the default precision."""
    from experiments.device_measure import profile_stage, stage_config
    from seq2seq.run.runtime import setup_runtime

    config = stage_config(trainer_overrides(args))
    t = config.train
    runtime = setup_runtime(t.device, t.threads, t.attention_kernels)
    sizes = {**SIZES[kind(args)]["profile"], **PROFILED[kind(args)]}
    tables = args.scratch / "profile-tables"
    profile_stage(config, args.scratch, runtime, sizes, tables, lambda f: write_result(args, f))
    return 0


CHILDREN = {
    "env": env_child,
    "rates": rates_child,
    "profile": profile_child,
    "main": main_child,
    "readme": readme_child,
    "torchrun": torchrun_child,
    "nccl": nccl_child,
}

if __name__ == "__main__":
    sys.exit(main())
