"""``seq2seq`` command line: parse, load config, call a library function; nothing else.

Here: the parser, ``main`` and the commands that make and inspect runs (``data``, ``train``,
``average``, ``plot``); the commands that use a trained run (``translate``, ``evaluate``,
``attention``, ``serve``, ``export``) are in ``decode``, ``align`` in ``align``, the options
several share in ``options``. Every user-facing failure is a ``Seq2SeqError``, printed here as
one line with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from seq2seq.commands import align, decode
from seq2seq.commands.options import (
    add_columns_option,
    add_device_option,
    add_renamed_option,
    finite_number_arg,
    whole_number_arg,
)
from seq2seq.config import DataConfig
from seq2seq.errors import Seq2SeqError
from seq2seq.version import __version__


def _add_data(sub: argparse._SubParsersAction) -> None:
    defaults = DataConfig()
    p = sub.add_parser(
        "data",
        help="summarise a parallel corpus: pairs, subword lengths, padding",
        description="Prepare a corpus as a training run with the same data settings would "
        "(the tokenizer trained on its training pairs, the pairs encoded into a store), in a "
        "scratch directory, and print what the run would train on.",
    )
    p.add_argument(
        "--data",
        help="registry name (data/corpora.yaml), Hub id, folder of {split}.{lang}[.gz] files, "
        f"TSV file or folder (default: {defaults.data}, the Multi30k copy that ships with seq2seq)",
    )
    p.add_argument("--src", help=f"source language (default: {defaults.src})")
    p.add_argument("--tgt", help=f"target language (default: {defaults.tgt})")
    p.add_argument("--test-split", help="the split to use as test (default: the one named test*)")
    add_columns_option(p)
    p.add_argument(
        "--tokenizer", type=Path, help="reuse this tokenizer (run directory or .model file)"
    )
    p.add_argument(
        "--vocab-size",
        type=whole_number_arg,
        help=f"default: sized to the corpus, at most {defaults.vocab_size} (data.vocab_size)",
    )
    add_renamed_option(
        p,
        "--max-train-len",
        "--max-len",  # which now means an output's length cap alone (attention, serve)
        type=whole_number_arg,
        metavar="N",
        help="drop training pairs longer than this many subwords a side (default: "
        f"{defaults.max_len}, data.max_len)",
    )
    p.add_argument(
        "--max-tokens",
        type=whole_number_arg,
        help=f"tokens per batch, per side (default: {defaults.max_tokens}, data.max_tokens)",
    )
    _add_config_options(p)
    p.add_argument("--out", type=Path, help="also write the summary as JSON here")
    p.set_defaults(run=_run_data)


def _add_config_options(p: argparse.ArgumentParser) -> None:
    """--config and --set, as ``train`` and ``data`` take them."""
    p.add_argument("--config", type=Path, help="YAML file with model/data/train/decode sections")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set train.lr=5e-4",
    )


def config_flags(args: argparse.Namespace) -> dict[str, object]:
    """The config values the flags of ``train`` or ``data`` give, by dotted key (None = not
    given): the values themselves, never ``--set`` text, so ``--src no`` is Norwegian and
    ``--data 2016`` a folder."""
    flags = {
        "data.data": args.data,
        "data.src": args.src,
        "data.tgt": args.tgt,
        "data.test_split": args.test_split,
        "data.columns": args.columns,
    }
    if args.command == "data":
        return {
            **flags,
            "data.vocab_size": args.vocab_size,
            "data.max_len": args.max_train_len,
            "data.max_tokens": args.max_tokens,
        }
    return {
        **flags,
        "train.max_epochs": args.max_epochs,
        "train.max_time": args.max_time,
        "train.max_steps": args.max_steps,
        "train.seed": args.seed,
        "train.device": args.device,
        "train.threads": args.threads,
        "train.precision": "fp32" if args.fp32 else None,
    }


def _run_data(args: argparse.Namespace) -> int:
    """``seq2seq data``: prepare the corpus as a run would, in a scratch directory; print (and
    optionally save) the report of what the run would train on."""
    from seq2seq.config import load_config
    from seq2seq.data.prepare import prepare_store
    from seq2seq.data.report import data_report
    from seq2seq.data.tokenizer import Tokenizer
    from seq2seq.fileio import atomic_write_text

    config = load_config(args.config, args.overrides, config_flags(args))
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch)
        reuse = args.tokenizer is not None
        if reuse:  # prepared as a resumed run is: with the tokenizer it has
            Tokenizer.load(args.tokenizer).save(run_dir)
        prepare_store(config, run_dir, reuse, lambda text: print(text, file=sys.stderr))
        report = data_report(config, run_dir)
    print(format_data_report(report))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
        print(f"saved {args.out}")
    return 0


def format_data_report(report: dict) -> str:
    vocab = report["vocab"]
    vocab_text = (
        f"joint {vocab['src']}" if vocab["joint"] else f"src {vocab['src']}, tgt {vocab['tgt']}"
    )
    lines = [f"corpus: {report['source']}", f"subwords: {vocab_text}"]
    lines += [f"note: {note}" for note in report["notes"]]
    lines.append(
        f"{'split':<11}{'pairs':>8}{'src tokens':>12}{'tgt tokens':>12}"
        f"   src len p50/p90/p99/max   tgt len p50/p90/p99/max"
    )
    for split, s in report["splits"].items():
        src_len = "/".join(str(v) for v in s["src_lengths"].values())
        tgt_len = "/".join(str(v) for v in s["tgt_lengths"].values())
        lines.append(
            f"{split:<11}{s['pairs']:>8,}{s['src_tokens']:>12,}{s['tgt_tokens']:>12,}   {src_len:<26}{tgt_len}"
        )
    dropped = [
        f"{split}: {n:,} {reason}"
        for split, reasons in report["dropped"].items()
        for reason, n in reasons.items()
    ]
    limit = (
        f" (limit {report['max_len']} subwords a side, training only)" if report["max_len"] else ""
    )
    lines.append(f"dropped: {'; '.join(dropped) or 'none'}{limit}")
    b = report["batches"]
    lines.append(
        f"train batches: {b['train_batches']:,} of <= {b['max_tokens_per_side']:,} tokens per side, "
        f"{b['mean_pairs_per_batch']} pairs on average, padding {b['padding_fraction']:.1%}"
    )
    return "\n".join(lines)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a translation model into a run directory",
        description="Train with the default recipe, a YAML config, and --set overrides.",
    )
    p.add_argument(
        "--data",
        help="registry name, Hub id, local folder or TSV file (default multi30k, shipped)",
    )
    p.add_argument("--src", help="source language code (default de)")
    p.add_argument("--tgt", help="target language code (default en)")
    p.add_argument("--test-split", help="which test* split is the test set")
    add_columns_option(p)
    p.add_argument("--out", type=Path, required=True, help="run directory, e.g. runs/de-en")
    _add_config_options(p)
    p.add_argument(
        "--max-time",
        type=finite_number_arg,
        metavar="MINUTES",
        help="training-time budget in minutes (default 30; 0 = none, stop by patience or "
        "epochs); the learning rate cools down over its last 30%% (train.cooldown)",
    )
    p.add_argument(
        "--max-steps",
        type=whole_number_arg,
        help="step budget; without --max-time it is the only budget (no 30-minute limit) and "
        "the cool-down follows it",
    )
    p.add_argument(
        "--max-epochs",
        type=whole_number_arg,
        help="epoch budget (default 100); without --max-time there is no time limit",
    )
    p.add_argument("--seed", type=whole_number_arg)
    add_device_option(p, default=None)  # train.device
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last state; only budgets (time, steps, epochs, "
        "patience, validation and logging intervals, threads, device) may change",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from seq2seq.run.rundir import FLAGS
    from seq2seq.run.runtime import exit_rank, leave_process_group
    from seq2seq.training.entry import train_run

    state = train_run(
        args.out,
        args.config,
        args.overrides,
        flags=config_flags(args),
        resume=args.resume,
        overwrite=args.overwrite,
        tensorboard=args.tensorboard,
        progress=not args.no_progress,
        words=FLAGS,
    )
    stopped_by = state["stop_reason"].removeprefix("signal ")
    if stopped_by != state["stop_reason"]:  # saved, not finished: the shell's 128 + signal
        code = 128 + signal.Signals[stopped_by].value
    else:
        code = 0 if state["best_bleu"] >= 0 else 1
    if leave_process_group():  # under torchrun: every rank leaves together, then exits
        exit_rank(code)
    return code


class _IntermixedParser(argparse.ArgumentParser):
    """Options may sit between the positionals (``translate RUN --beam 5 TEXT ...``): plain
    argparse gives ``nargs="*"`` its match before the first option, then rejects the rest."""

    def parse_known_args(self, args=None, namespace=None):
        if getattr(self, "_intermixing", False):  # parse_known_intermixed_args calls back here
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "average",
        help="average the last kept checkpoints of a run into one weights file",
        description="Average the weights of the last N validated states a run kept in "
        "RUN/checkpoints/ (train.keep_last) into one file that every command loads in place "
        "of a run directory, e.g. seq2seq translate RUN/averaged.safetensors TEXT.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--last", type=whole_number_arg, default=5, help="how many (default: %(default)s)"
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        help="a .safetensors file in RUN_DIR itself, whose config and tokenizer it loads with "
        "(default: RUN_DIR/averaged.safetensors)",
    )
    p.set_defaults(run=_run_average)


def _run_average(args: argparse.Namespace) -> int:
    from seq2seq.run.checkpoint import average_run

    out, chosen = average_run(args.run_dir, args.last, args.output)
    steps = ", ".join(p.stem.removeprefix("step_") for p in chosen)
    noun = "checkpoint" if len(chosen) == 1 else "checkpoints"
    print(f"averaged {len(chosen)} {noun} (steps {steps}) into {out}")
    return 0


def _add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw the training curves of one or more runs into one figure",
        description="Loss, validation BLEU (against steps and wall minutes) and learning rate "
        "from each RUN_DIR/metrics.jsonl; several runs are overlaid, one colour each.",
    )
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("curves.png"),
        help="PNG, SVG or PDF file (default: %(default)s)",
    )
    p.set_defaults(run=_run_plot)


def _run_plot(args: argparse.Namespace) -> int:
    from seq2seq.training.curves import save_curves

    print(f"saved {save_curves(args.run_dirs, args.output)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seq2seq",
        description="Train an encoder-decoder Transformer translator, translate, and inspect cross-attention.",
    )
    parser.add_argument("--version", action="version", version=f"seq2seq {__version__}")
    # Options may sit between positionals in every subcommand (translate RUN --beam 5 TEXT).
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_IntermixedParser)
    for add in (_add_data, _add_train, _add_average, _add_plot, *decode.COMMANDS, *align.COMMANDS):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    # --threads before any torch work: a decoding command's setup_runtime caps it at the
    # usable CPUs; train also takes it as train.threads, which setup_runtime sets as given
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    try:
        return args.run(args)
    except Seq2SeqError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a file that vanished: one line, never a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
