"""What a resumed run trains with: the recipe its ``config.yaml`` holds (model, data, seed,
optimizer, schedule, loss) and, of what is given now, the budgets alone. ``seq2seq train
--resume`` (``entry.train_run``) merges the values its command line gave, and says which
recipe values it ignored; ``entry.train(config, resume=True)`` the budgets of ``config``.
Both through ``resume_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seq2seq.config import Config, budget_rule, config_from_dict, config_to_dict
from seq2seq.run import checkpoint

# What a resumed run may take from its command line (budgets, stopping, logging, hardware);
# the recipe (model, data, seed, optimizer, schedule, loss) comes from its config.yaml.
RESUME_BUDGETS = (
    "max_epochs",
    "max_time",
    "max_steps",
    "patience",
    "max_bad_steps",
    "validate_every",
    "valid_bleu_sentences",
    "log_every",
    "attention_sentences",
    "threads",
    "device",
)


def resume_config(run_dir: Path, given: dict[str, Any]) -> tuple[Config, list[str]]:
    """The saved config of the run in ``run_dir`` with the budgets the user gave on top.

    ``given`` holds only the values the command line set (nested by section, as in YAML).
    Returns the config and the ``section.key`` names of the recipe values given, which a
    resumed run ignores.
    """
    saved = config_to_dict(checkpoint.load_config_file(run_dir))
    ignored = []
    for section, values in budget_rule(given).items():
        for key, value in (values or {}).items() if isinstance(values, dict) else ():
            if section == "train" and key in RESUME_BUDGETS:
                saved["train"][key] = value
            elif saved.get(section, {}).get(key, object()) != value:
                ignored.append(f"{section}.{key}")
    return config_from_dict(saved), ignored


def budgets_of(config: Config) -> dict[str, Any]:
    """Every budget of ``config``, nested as ``resume_config`` takes what is given."""
    return {"train": {name: getattr(config.train, name) for name in RESUME_BUDGETS}}
