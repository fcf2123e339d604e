"""What ``--data`` names, and the source that reads it.

``--data`` names one of: a registry name (``data/corpora.yaml``; ``multi30k``, the default,
ships with the repository), a folder of line-aligned ``{split}.{lang}[.gz]`` files, a TSV file
or folder of TSV files (``seq2seq.data.sources``), a local folder of JSON-lines/Parquet files with
the Hub's schema, or a Hugging Face Hub id (``owner/name``, ``seq2seq.data.hub``). Anything else is
a one-line ``Seq2SeqError`` that says what it could have been.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from seq2seq.data.hub import DATASETS_SUFFIXES, HUB_ID, read_datasets, split_configuration
from seq2seq.data.sources import SplitReader, parallel_files, read_parallel_folder, read_tsv_source
from seq2seq.errors import Seq2SeqError

REPO_ROOT = Path(__file__).resolve().parents[2]
# The folder of the registry and the corpora that ship: the checkout's data/, or, installed
# from a wheel, seq2seq/data/shipped/ (pyproject.toml puts data/ there). Registry paths are
# relative to it.
_SHIPPED = Path(__file__).resolve().parent / "shipped"
DATA_ROOT = _SHIPPED if (_SHIPPED / "corpora.yaml").is_file() else REPO_ROOT / "data"
REGISTRY = DATA_ROOT / "corpora.yaml"


def load_registry() -> dict[str, dict]:
    """``data/corpora.yaml``: name -> ``{path: folder under DATA_ROOT}`` or ``{hub_id: id}``."""
    if not REGISTRY.is_file():
        return {}
    return yaml.safe_load(REGISTRY.read_text(encoding="utf-8")) or {}


def read_source(
    data: str, src: str, tgt: str, columns: str | None, notes: list[str]
) -> tuple[str, dict[str, SplitReader]]:
    """The description of the source ``data`` names and a reader of each of its splits, by
    the source's own split names. ``columns``: a TSV corpus's columns (``seq2seq.data.tsv``);
    ``notes`` is told what the reader chose that a user should know."""
    if columns is not None:
        return read_tsv_source(_tsv_path(data), src, tgt, columns, notes)
    data, config = split_configuration(data)
    if config is not None:
        if Path(data).expanduser().is_dir():
            return read_datasets(str(Path(data).expanduser()), src, tgt, True, config)
        return _from_hub(data, src, tgt, config)
    known = load_registry()
    if data in known:
        entry = known[data]
        if "path" in entry:
            folder = DATA_ROOT / entry["path"]
            if not folder.is_dir():
                raise Seq2SeqError(
                    f"corpus '{data}' should be in {folder}, which is missing; "
                    "point --data at a copy of its folder"
                )
            data = str(folder)
        else:
            description, readers = _from_hub(entry["hub_id"], src, tgt)
            return f"{description} ('{data}' in the registry)", readers
    path = Path(data).expanduser()
    if path.is_file():
        if path.suffix != ".tsv":
            raise Seq2SeqError(f"{path}: a data file must be .tsv (a folder holds other formats)")
        return read_tsv_source(path, src, tgt, None, notes)
    if path.is_dir():
        if any(path.glob("*.tsv")):
            return read_tsv_source(path, src, tgt, None, notes)
        if parallel_files(path):
            return read_parallel_folder(path, src, tgt)
        if any(p.suffix in DATASETS_SUFFIXES or p.name == "README.md" for p in path.iterdir()):
            return read_datasets(str(path), src, tgt, local=True)
        raise Seq2SeqError(
            f"{path} holds no corpus: expected {{split}}.{{lang}}[.gz] files, *.tsv, or *.jsonl/*.parquet"
        )
    if path.parent.is_dir() and str(path.parent) != ".":
        raise Seq2SeqError(f"--data {data}: no such file or folder")
    if HUB_ID.fullmatch(data):
        return _from_hub(data, src, tgt)
    if not known:  # installed without the repository, whose data/ holds the corpora
        raise Seq2SeqError(
            f"--data '{data}': this install has no corpus registry (data/corpora.yaml ships with "
            "the repository, beside its corpora); point --data at a corpus folder, e.g. "
            "--data path/to/seq2seq/data/shipped/multi30k"
        )
    names = ", ".join(sorted(known))
    raise Seq2SeqError(
        f"--data '{data}' is not a file, a folder, a Hub id (owner/name) or a known corpus ({names})"
    )


def _from_hub(
    name: str, src: str, tgt: str, config: str | None = None
) -> tuple[str, dict[str, SplitReader]]:
    """A Hub dataset, with the registry's corpora on disk to suggest if the Hub fails."""
    return read_datasets(name, src, tgt, False, config, _local_alternatives(name))


def _local_alternatives(name: str) -> list[str]:
    """Registry corpora on disk to suggest when the Hub cannot be reached, ``name``'s own first."""
    own_first = sorted(
        load_registry().items(), key=lambda item: name not in (item[0], item[1].get("hub_id"))
    )
    return [
        f"--data {key}"
        for key, entry in own_first
        if "path" in entry and (DATA_ROOT / entry["path"]).is_dir()
    ]


def _tsv_path(data: str) -> Path:
    """The TSV file or folder ``data`` names (a path, or a registry name), for ``columns``."""
    entry = load_registry().get(data, {})
    path = DATA_ROOT / entry["path"] if "path" in entry else Path(data).expanduser()
    if path.suffix == ".tsv" and path.is_file() or path.is_dir() and any(path.glob("*.tsv")):
        return path
    raise Seq2SeqError(
        f"--columns applies to TSV corpora; --data {data} is not a .tsv file or a folder of them"
    )
