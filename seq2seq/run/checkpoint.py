"""The run directory's files: what it holds, and saving and loading them safely.

A run directory holds ``config.yaml`` (the resolved config), the SentencePiece model(s),
``model.safetensors`` (best weights by validation BLEU), ``last.safetensors`` (the whole
training state for ``--resume``: weights, optimizer moments, RNG states, and the loop's
counters as JSON in the safetensors metadata) and, with ``train.keep_last``, the weights of
the last validated states under ``checkpoints/``. Each file is written to a temporary file
and renamed, so a kill at any moment leaves the previous good file in place, and one file
per state means the parts of a state can never come from two different steps. Nothing is
ever unpickled. Whose a directory is, and what a run may remove from it: ``rundir``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from seq2seq.config import Config, config_from_dict, config_to_dict
from seq2seq.errors import Seq2SeqError
from seq2seq.fileio import atomic_path, atomic_write_text
from seq2seq.run.old_weights import packed_state

CONFIG_FILE = "config.yaml"
BEST_FILE = "model.safetensors"
LAST_FILE = "last.safetensors"
AVERAGED_FILE = "averaged.safetensors"  # what `seq2seq average` writes by default
KEPT_DIR = "checkpoints"  # the last validated states' weights, step_N.safetensors

# ---------------------------------------------------------------------------------------
# Tensors in safetensors files.


def unique_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's tensors with tied ones (shared embeddings, tied output) named once."""
    seen: set[int] = set()
    state = {}
    for name, tensor in model.state_dict().items():
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        state[name] = tensor
    return state


def write_tensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, Any]) -> None:
    """Atomically write safetensors with ``metadata`` stored as one JSON string."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        try:
            save_file(tensors, str(tmp), metadata={"seq2seq": json.dumps(metadata)})
        except SafetensorError as e:  # e.g. the disk filled up: the old file stays
            raise Seq2SeqError(f"cannot write {path}: {e}") from None


def read_tensors(path: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read a safetensors file; anything that is not one (a pickle, a truncated file) is refused."""
    if not path.is_file():
        raise Seq2SeqError(f"{path}: file not found")
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
            raw = (f.metadata() or {}).get("seq2seq", "{}")
        metadata = json.loads(raw)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise Seq2SeqError(f"{path}: not a readable safetensors file ({reason})") from None
    if not isinstance(metadata, dict):
        raise Seq2SeqError(f"{path}: its seq2seq metadata is not a JSON object")
    return tensors, metadata


def load_weights_into(model: nn.Module, tensors: dict[str, Tensor], source: Path) -> None:
    """Copy ``tensors`` into ``model`` after checking names, shapes and dtypes exactly.
    Weights saved before attention packed Q, K and V into one projection load as well."""
    tensors = packed_state(tensors)
    expected = unique_state(model)
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        parts = [
            f"missing {missing[:3]}" if missing else "",
            f"unexpected {extra[:3]}" if extra else "",
        ]
        raise Seq2SeqError(
            f"{source}: tensors do not match the model ({'; '.join(p for p in parts if p)})"
        )
    for name, tensor in tensors.items():
        want = expected[name]
        if tensor.shape != want.shape or tensor.dtype != want.dtype:
            raise Seq2SeqError(
                f"{source}: tensor '{name}' is {tensor.dtype} {list(tensor.shape)}, "
                f"the model needs {want.dtype} {list(want.shape)}"
            )
        if not torch.isfinite(tensor).all():
            raise Seq2SeqError(f"{source}: tensor '{name}' holds NaN or Inf")
    with torch.no_grad():
        for name, tensor in tensors.items():
            expected[name].copy_(tensor)


def save_config(run_dir: Path, config: Config) -> None:
    atomic_write_text(
        run_dir / CONFIG_FILE, yaml.safe_dump(config_to_dict(config), sort_keys=False)
    )


def load_config_file(run_dir: Path) -> Config:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise Seq2SeqError(f"{run_dir}: not a run directory ({CONFIG_FILE} missing)")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise Seq2SeqError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return config_from_dict(values or {})


def save_model(model: nn.Module, path: Path, metadata: dict[str, Any]) -> None:
    write_tensors(path, unique_state(model), metadata)


def _is_training_state(names: Iterable[str], metadata: dict[str, Any]) -> bool:
    return "rng.torch" in names and "optim_param_groups" in metadata


def holds_training_state(path: Path) -> bool:
    """Whether ``path`` is a training state this package wrote (read from its header alone)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            metadata = json.loads((f.metadata() or {}).get("seq2seq", "{}"))
    except (SafetensorError, OSError, ValueError, RuntimeError):
        return False
    return isinstance(metadata, dict) and _is_training_state(names, metadata)


def load_model(model: nn.Module, path: Path) -> dict[str, Any]:
    tensors, metadata = read_tensors(path)
    if _is_training_state(tensors, metadata):
        raise Seq2SeqError(
            f"{path} is a training state (what train --resume reads), not model weights: pass "
            f"the run directory {path.parent} for its best weights, or a weights file such as "
            f"{AVERAGED_FILE} or {KEPT_DIR}/step_N.safetensors in it"
        )
    load_weights_into(model, tensors, path)
    return metadata


def rng_state() -> dict[str, Tensor]:
    """This process's random number generator states: CPU, and CUDA when in use."""
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _rng_key(kind: str, rank: int) -> str:
    # Rank 0 keeps the single-process names, so one file format serves both.
    return f"rng.{kind}" if rank == 0 else f"rng.{kind}.{rank}"


def save_training_state(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    counters: dict[str, Any],
    rng: list[dict[str, Tensor]] | None = None,
    extra: dict[str, Tensor] | None = None,
) -> None:
    """Weights, optimizer moments and RNG states as tensors; everything else as JSON metadata.

    ``rng`` holds every rank's ``rng_state()`` in rank order; by default this process's.
    ``extra``: more of the state (the weights' moving average), named apart from the rest.
    """
    tensors = {f"model.{k}": v for k, v in unique_state(model).items()} | (extra or {})
    optim_state = optimizer.state_dict()
    for index, entry in optim_state["state"].items():
        for key, value in entry.items():
            tensors[f"optim.{index}.{key}"] = torch.as_tensor(value)
    for rank, states in enumerate(rng if rng is not None else [rng_state()]):
        for kind, value in states.items():
            tensors[_rng_key(kind, rank)] = value
    counters = {**counters, "optim_param_groups": optim_state["param_groups"]}
    write_tensors(path, tensors, counters)


def load_training_state(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0
) -> dict[str, Any]:
    """Restore ``model``, ``optimizer`` and ``rank``'s RNG from ``path``; return the counters.

    A rank the saved run did not have (more processes now) takes rank 0's RNG.
    """
    tensors, counters = read_tensors(path)
    if not _is_training_state(tensors, counters):
        raise Seq2SeqError(f"{path}: not a training state (no optimizer or RNG state)")
    weights = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    if packed_state(weights).keys() != weights.keys():  # Adam's moments are per parameter
        raise Seq2SeqError(
            f"{path}: saved before attention packed Q, K and V into one projection; its "
            "weights still translate and evaluate, but its training cannot resume here"
        )
    load_weights_into(model, weights, path)
    state: dict[int, dict[str, Tensor]] = {}
    try:
        for name, value in tensors.items():
            if name.startswith("optim."):
                _, index, key = name.split(".", 2)
                state.setdefault(int(index), {})[key] = value
        optimizer.load_state_dict(
            {"state": state, "param_groups": counters.pop("optim_param_groups")}
        )
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise Seq2SeqError(f"{path}: optimizer state does not fit ({e})") from None
    own = rank if _rng_key("torch", rank) in tensors else 0
    try:
        torch.set_rng_state(tensors[_rng_key("torch", own)])
        if _rng_key("cuda", own) in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors[_rng_key("cuda", own)])
    except (RuntimeError, TypeError) as e:
        raise Seq2SeqError(f"{path}: RNG state does not fit ({e})") from None
    return counters


def keep_weights(model: nn.Module, run_dir: Path, step: int, keep_last: int, bleu: float) -> None:
    """The weights of a validated state as ``checkpoints/step_N.safetensors``; only the newest
    ``keep_last`` stay (what ``seq2seq average`` and ``train.average_last`` average)."""
    if keep_last < 1:
        return
    (run_dir / KEPT_DIR).mkdir(exist_ok=True)
    save_model(model, run_dir / KEPT_DIR / f"step_{step}.safetensors", {"step": step, "bleu": bleu})
    for old in kept_checkpoints(run_dir)[:-keep_last]:
        old.unlink(missing_ok=True)


def kept_checkpoints(run_dir: Path) -> list[Path]:
    """``checkpoints/step_N.safetensors`` of ``run_dir``, oldest first."""
    found = []
    for path in (run_dir / KEPT_DIR).glob("step_*.safetensors"):
        match = re.fullmatch(r"step_(\d+)\.safetensors", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def average_checkpoints(paths: list[Path]) -> dict[str, Tensor]:
    """The element-wise mean of the weights in ``paths`` (same names and shapes in each),
    summed in float64 so that averaging copies of one checkpoint gives it back exactly."""
    if not paths:
        raise Seq2SeqError("no checkpoints to average")
    total: dict[str, Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}  # the first file's: the average is stored as it was
    for path in paths:
        tensors, _ = read_tensors(path)
        dtypes = dtypes or {name: tensor.dtype for name, tensor in tensors.items()}
        if total and tensors.keys() != total.keys():
            raise Seq2SeqError(f"{path}: its tensors differ from those of {paths[0]}")
        for name, tensor in tensors.items():
            if name in total and tensor.shape != total[name].shape:
                raise Seq2SeqError(
                    f"{path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(total[name].shape)}"
                )
            total[name] = total.get(name, 0) + tensor.double()
    return {name: (value / len(paths)).to(dtypes[name]) for name, value in total.items()}


def average_run(run_dir: Path, last: int, out: Path | None = None) -> tuple[Path, list[Path]]:
    """Average the newest ``last`` kept checkpoints of ``run_dir`` into ``out`` (default
    ``run_dir/averaged.safetensors``), a weights file every command loads.

    ``out`` must be a ``.safetensors`` file in ``run_dir`` itself: a weights file loads with
    the config and tokenizer of the run that holds it, and goes with it on ``--overwrite``.
    """
    kept = kept_checkpoints(run_dir)
    if not kept:
        raise Seq2SeqError(
            f"{run_dir}: no checkpoints to average in {KEPT_DIR}/ (train with train.keep_last >= 2)"
        )
    if last < 1:
        raise Seq2SeqError(f"--last must be >= 1, got {last}")
    chosen = kept[-last:]
    out = _average_path(run_dir, out)
    steps = [int(p.stem.removeprefix("step_")) for p in chosen]
    write_tensors(out, average_checkpoints(chosen), {"averaged_steps": steps})
    return out, chosen


def _average_path(run_dir: Path, out: Path | None) -> Path:
    if out is None:
        return run_dir / AVERAGED_FILE
    if out.suffix != ".safetensors" or out.resolve().parent != run_dir.resolve():
        raise Seq2SeqError(
            f"-o {out}: the average must be a .safetensors file in {run_dir} itself, "
            "which holds the config and tokenizer it loads with"
        )
    if out.name in (BEST_FILE, LAST_FILE):
        raise Seq2SeqError(f"-o {out}: that is the run's own {out.name}; name another file")
    return out


def describe_weights(metadata: dict[str, Any]) -> str:
    """What a weights file's metadata says it holds: 'step 1666', 'average of steps 714–1666'."""
    averaged = metadata.get("averaged_steps")
    if averaged:
        return f"average of steps {averaged[0]}–{averaged[-1]}"
    return f"step {metadata['step']}" if "step" in metadata else "no step recorded"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_identity(run_dir: Path, weights: Path) -> dict[str, str]:
    """Which weights a score is of: the file (relative to its run), what it holds and its
    sha256, which tells weights trained further since, or averaged again, from these."""
    return {
        "weights_file": weights.relative_to(run_dir).as_posix(),
        "weights": describe_weights(read_tensors(weights)[1]),
        "sha256": sha256_of(weights),
    }


def split_run_path(path: str | Path) -> tuple[Path, Path | None]:
    """``(run directory, weights file or None)`` for what a command was given in place of a
    run: the run directory itself, or a weights file inside it (``RUN/averaged.safetensors``,
    ``RUN/checkpoints/step_N.safetensors``)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        run_dir = next((p for p in path.parents if (p / CONFIG_FILE).is_file()), path.parent)
        return run_dir, path
    return path, None
