"""``collect``: a finished run directory's evidence, copied into a record folder."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import tempfile
from pathlib import Path

from experiments.common import budget, model_used
from experiments.records import GZIP_OVER, RECORD, RESULTS, RecordError
from experiments.records.compare import load_numerics, trainer_of_run
from experiments.records.load import plain, read_json
from seq2seq.config import Config
from seq2seq.run import checkpoint

RUN_TEXT = ("config.yaml", "metrics.jsonl", "environment.json", "data_summary.json")
SPLITS = ("test", "validation")
# Search settings that, when they differ from the run's decode section, name the scores
# apart: a "beam 5" row must mean the run's own decoding rule at beam 5.
SEARCH_KEYS = ("length_penalty", "max_len_a", "max_len_b", "ban_eos")


def collect(
    run_dir: Path,
    name: str,
    results: Path,
    recipe: str | None = None,
    seed: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Copy ``run_dir``'s record into ``results/name`` and return that folder. The recipe
    label defaults to ``name`` without a ``-seedN`` or ``-sN`` suffix; ``seed``, if given,
    must be the run's ``train.seed``."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise RecordError(f"record name {name!r}: use letters, digits, '.', '_' and '-'")
    out = results / name
    if out.exists() and not overwrite:
        raise RecordError(f"{out} exists (--overwrite replaces it)")
    record = describe(run_dir, name, recipe, seed)
    results.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=results))
    staging.chmod(0o755)  # mkdtemp's is 0o700: a record is for everyone to read
    try:
        for f in RUN_TEXT:
            _copy_text(run_dir / f, staging)
        for f in sorted(run_dir.glob("hyps.*.json")):
            shutil.copyfile(f, staging / f.name)
            _copy_text(f.with_suffix(".txt"), staging)
        (staging / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def describe(run_dir: Path, name: str, recipe: str | None, seed: int | None) -> dict:
    """``record.json`` for a finished run: what it is, how far it trained, which weights
    its scores are of, and which scores it has."""
    config = checkpoint.load_config_file(run_dir)
    if seed is not None and seed != config.train.seed:
        raise RecordError(f"--seed {seed}, but {run_dir} has train.seed {config.train.seed}")
    missing = [f for f in RUN_TEXT if not (run_dir / f).is_file()]
    if missing:
        raise RecordError(f"{run_dir}: no {', '.join(missing)}")
    used = model_used(run_dir)
    if not used["finished"]:
        raise RecordError(f"{run_dir}: training has not finished (--resume finishes it)")
    corpus = read_json(run_dir / "data_summary.json").get("source")
    if not corpus:
        raise RecordError(f"{run_dir}/data_summary.json: no 'source' (the corpus it describes)")
    scores, other = _scores(run_dir, corpus, config)
    environment = read_json(run_dir / "environment.json")
    return {
        "name": name,
        "recipe": recipe or re.sub(r"-(seed|s)\d+$", "", name),
        "seed": config.train.seed,
        "direction": f"{config.data.src}-{config.data.tgt}",
        "data": plain(corpus),
        "budget": budget(config.train),
        "trainer": trainer_of_run(environment, load_numerics(RESULTS)),
        **used,
        "scores": scores,
        "other_scores": other,
    }


def _scores(run_dir: Path, corpus: str, config: Config) -> tuple[dict, list[str]]:
    """The scores files of the run's best weights on its own corpus, by split and search
    ("greedy", "beam 5"); the names of any others (other weights, corpora or splits). Each
    must be of the weights file it names as the run holds it now."""
    keyed: dict[str, dict[str, str]] = {split: {} for split in SPLITS}
    other = []
    digests: dict[str, str | None] = {}  # by weights file: hashed once
    for path in sorted(run_dir.glob("hyps.*.json")):
        if not path.with_suffix(".txt").is_file():
            raise RecordError(f"{path}: no hypotheses {path.with_suffix('.txt').name} beside it")
        report = read_json(path)
        missing = [k for k in ("run", "data", "split", "search") if k not in report]
        if missing:
            raise RecordError(f"{path}: not a seq2seq evaluate scores file (no {missing[0]})")
        _check_weights(path, report, run_dir, digests)
        own = (
            plain(report["data"]) == plain(corpus)
            and report["weights_file"] == checkpoint.BEST_FILE
        )
        if not own or report["split"] not in keyed:
            other.append(path.name)
            continue
        found = keyed[report["split"]]
        label = search_label(report["search"], config)
        if label in found:
            raise RecordError(
                f"{run_dir}: two {report['split']} scores for {label}: {found[label]}, {path.name}"
            )
        found[label] = path.name
    return keyed, other


def _check_weights(path: Path, report: dict, run_dir: Path, digests: dict) -> None:
    """Refuse scores of weights the run no longer holds: trained further or averaged again
    since they were scored, or written before scores named their weights."""
    if any(not isinstance(report.get(k), str) for k in ("weights_file", "weights", "sha256")):
        raise RecordError(f"{path}: names no weights it scored (an older seq2seq); evaluate again")
    name = report["weights_file"]
    if name not in digests:
        weights = run_dir / name
        digests[name] = checkpoint.sha256_of(weights) if weights.is_file() else None
    if digests[name] != report["sha256"]:
        raise RecordError(
            f"{path}: scores of {name} at {report['weights']} (sha256 {report['sha256'][:12]}), "
            f"which {run_dir} no longer holds; evaluate again"
        )


def search_label(search: dict, config: Config) -> str:
    """'greedy' or 'beam K', with any setting that differs from the run's decode section."""
    label = "greedy" if search["beam"] == 1 else f"beam {search['beam']}"
    own = vars(config.decode)
    changed = [f"{k} {search[k]}" for k in SEARCH_KEYS if search.get(k, own[k]) != own[k]]
    return ", ".join([label, *changed])


def _copy_text(path: Path, folder: Path) -> None:
    """A text file into ``folder``, gzipped (``NAME.gz``, reproducible bytes) when large."""
    data = path.read_bytes()
    if len(data) <= GZIP_OVER:
        (folder / path.name).write_bytes(data)
        return
    (folder / f"{path.name}.gz").write_bytes(gzip.compress(data, mtime=0))
