"""The Hugging Face Hub as a source, and local folders in its layout (JSON lines, Parquet, a
dataset card), through Hugging Face ``datasets``.

A Hub id is ``owner/name``, with ``:CONFIG`` for a dataset of several configurations
(``wmt/wmt14:de-en``). Without network the Hub is probed once, briefly, and the error names
the corpora on disk to use instead, rather than waiting through ``datasets``' retries.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path

from seq2seq.data.sources import SplitReader, check_languages
from seq2seq.errors import Seq2SeqError

# Where anything a run downloads goes: data/cache/ (git-ignored) in a checkout.
_CHECKOUT_CACHE = Path(__file__).resolve().parents[2] / "data" / "cache"
_DEFAULT_CACHE = (
    _CHECKOUT_CACHE if _CHECKOUT_CACHE.parent.is_dir() else Path.home() / ".cache/seq2seq"
)
CACHE_DIR = Path(os.environ.get("SEQ2SEQ_CACHE", _DEFAULT_CACHE))

DATASETS_SUFFIXES = (".jsonl", ".json", ".parquet")  # files of a local folder in the Hub's layout
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
_DATASETS_BATCH = 10_000  # rows of an Arrow table turned into Python strings at once
_HUB_TIMEOUT_S = 3.0


def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached, or None; a quick probe instead of datasets' retries."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    proxied = any(
        os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    )
    if offline or proxied:
        return None  # cache-only or behind a proxy: datasets decides, and fails fast offline
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=_HUB_TIMEOUT_S).close()
    except OSError as e:
        return str(e) or type(e).__name__
    return None


def read_datasets(
    name: str,
    src: str,
    tgt: str,
    local: bool,
    config: str | None = None,
    local_copies: Sequence[str] = (),
) -> tuple[str, dict[str, SplitReader]]:
    """A Hub dataset (or a local folder in its layout) through Hugging Face ``datasets``.

    Languages are either columns named by code (``bentrevett/multi30k``) or keys of a
    ``translation`` column (the WMT datasets). ``config`` names one configuration of a
    dataset that has several (``wmt/wmt14`` with ``de-en``). ``local_copies``: the
    ``--data`` to suggest when the Hub fails (``--data multi30k``).
    """
    description = f"local dataset folder {name}" if local else f"Hub dataset {name}"
    description += f", configuration {config}" if config else ""
    copies = [] if local else local_copies
    alternatives = "; try a local copy: " + " or ".join(copies) if copies else ""
    if not local and (reason := hub_unreachable()):
        raise Seq2SeqError(
            f"cannot reach the Hugging Face Hub for '{name}' ({reason}){alternatives}"
        )
    import datasets  # slow to import; only this source needs it

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        loaded = datasets.load_dataset(name, config, cache_dir=str(CACHE_DIR / "huggingface"))
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "Config name is missing" in message:
            names = ", ".join(datasets.get_dataset_config_names(name))
            message += f" Name one as --data {name}:CONFIG (configurations: {names})"
        raise Seq2SeqError(f"could not load {description}: {message}{alternatives}") from None
    first = next(iter(loaded.values()))
    nested = "translation" in first.column_names
    held = list(first[0]["translation"]) if nested and len(first) else first.column_names
    check_languages(held, src, tgt, description)

    def reader(split: str) -> SplitReader:
        table = loaded[split]

        def read() -> Iterator[tuple[str, str]]:
            for batch in table.iter(batch_size=_DATASETS_BATCH):
                if nested:
                    rows = ((row[src], row[tgt]) for row in batch["translation"])
                else:
                    rows = zip(batch[src], batch[tgt], strict=True)
                yield from ((s or "", t or "") for s, t in rows)

        # The Arrow files datasets keeps the split in: they change when the data does.
        return SplitReader(read, tuple(Path(f["filename"]) for f in table.cache_files))

    return description, {split: reader(split) for split in loaded}


def split_configuration(data: str) -> tuple[str, str | None]:
    """``owner/name:config`` or ``folder:config`` -> (dataset, configuration); else (data, None)."""
    match = re.fullmatch(r"(.+):([\w.-]+)", data)
    if match is None or Path(data).expanduser().exists():
        return data, None
    name, config = match.groups()
    if HUB_ID.fullmatch(name) or Path(name).expanduser().is_dir():
        return name, config
    return data, None
