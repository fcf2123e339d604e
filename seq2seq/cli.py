"""``seq2seq`` command line: parse, load config, call a library function; nothing else.

Every user-facing failure is a ``Seq2SeqError``, printed here as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seq2seq import __version__
from seq2seq.errors import Seq2SeqError


def _add_data(sub: argparse._SubParsersAction) -> None:
    from seq2seq.data import add_data_args, run_data_command

    p = sub.add_parser("data", help="summarise a parallel corpus: pairs, subword lengths, padding",
                       description="Load a corpus, (train and) apply a tokenizer, print its summary.")
    add_data_args(p)
    p.add_argument("--tokenizer", type=Path, help="reuse this tokenizer (run directory or .model file)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-len", type=int, default=100, help="subwords per side for training pairs")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch, per side")
    p.add_argument("--out", type=Path, help="also write the summary as JSON here")
    p.set_defaults(run=run_data_command)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a translation model into a run directory",
                       description="Train with the default recipe, a YAML config, and --set overrides.")
    p.add_argument("--data", help="Hub id, local folder, TSV file or registry name (default bentrevett/multi30k)")
    p.add_argument("--src", help="source language code (default de)")
    p.add_argument("--tgt", help="target language code (default en)")
    p.add_argument("--test-split", help="which test* split is the test set")
    p.add_argument("--out", type=Path, required=True, help="run directory, e.g. runs/de-en")
    p.add_argument("--config", type=Path, help="YAML file with model/data/train/decode sections")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable), e.g. --set train.lr=5e-4")
    p.add_argument("--max-epochs", type=int)
    p.add_argument("--max-time", type=float, metavar="MINUTES", help="wall-time budget in minutes")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last state")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from seq2seq.config import load_config
    from seq2seq.train import train

    flags = {"data.data": args.data, "data.src": args.src, "data.tgt": args.tgt,
             "data.test_split": args.test_split, "train.max_epochs": args.max_epochs,
             "train.max_time": args.max_time, "train.max_steps": args.max_steps, "train.seed": args.seed,
             "train.precision": "fp32" if args.fp32 else None}
    overrides = [f"{k}={v}" for k, v in flags.items() if v is not None] + args.overrides
    config = load_config(args.config, overrides)
    state = train(config, args.out, resume=args.resume, overwrite=args.overwrite,
                  tensorboard=args.tensorboard, progress=not args.no_progress)
    return 0 if state["best_bleu"] >= 0 or state["stop_reason"].startswith("signal") else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seq2seq",
        description="Train an encoder-decoder Transformer translator, translate, and inspect cross-attention.",
    )
    parser.add_argument("--version", action="version", version=f"seq2seq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_data, _add_train):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except Seq2SeqError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
