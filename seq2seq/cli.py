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

    p = sub.add_parser(
        "data",
        help="summarise a parallel corpus: pairs, subword lengths, padding",
        description="Load a corpus, (train and) apply a tokenizer, print its summary.",
    )
    add_data_args(p)
    p.add_argument(
        "--tokenizer", type=Path, help="reuse this tokenizer (run directory or .model file)"
    )
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-len", type=int, default=100, help="subwords per side for training pairs")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch, per side")
    p.add_argument("--out", type=Path, help="also write the summary as JSON here")
    p.set_defaults(run=run_data_command)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a translation model into a run directory",
        description="Train with the default recipe, a YAML config, and --set overrides.",
    )
    p.add_argument(
        "--data",
        help="Hub id, local folder, TSV file or registry name (default bentrevett/multi30k)",
    )
    p.add_argument("--src", help="source language code (default de)")
    p.add_argument("--tgt", help="target language code (default en)")
    p.add_argument("--test-split", help="which test* split is the test set")
    p.add_argument("--out", type=Path, required=True, help="run directory, e.g. runs/de-en")
    p.add_argument("--config", type=Path, help="YAML file with model/data/train/decode sections")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set train.lr=5e-4",
    )
    p.add_argument("--max-epochs", type=int)
    p.add_argument("--max-time", type=float, metavar="MINUTES", help="wall-time budget in minutes")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last state"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from seq2seq.config import load_config
    from seq2seq.train import train

    flags = {
        "data.data": args.data,
        "data.src": args.src,
        "data.tgt": args.tgt,
        "data.test_split": args.test_split,
        "train.max_epochs": args.max_epochs,
        "train.max_time": args.max_time,
        "train.max_steps": args.max_steps,
        "train.seed": args.seed,
        "train.precision": "fp32" if args.fp32 else None,
    }
    overrides = [f"{k}={v}" for k, v in flags.items() if v is not None] + args.overrides
    config = load_config(args.config, overrides)
    state = train(
        config,
        args.out,
        resume=args.resume,
        overwrite=args.overwrite,
        tensorboard=args.tensorboard,
        progress=not args.no_progress,
    )
    return 0 if state["best_bleu"] >= 0 or state["stop_reason"].startswith("signal") else 1


def _layer_arg(text: str) -> int | str:
    if text == "all" or text.isdigit():
        return text if text == "all" else int(text)
    raise argparse.ArgumentTypeError(f"expected a layer number (from 1) or 'all', got '{text}'")


def _head_arg(text: str) -> int | str:
    if text in ("mean", "all") or text.isdigit():
        return int(text) if text.isdigit() else text
    raise argparse.ArgumentTypeError(
        f"expected a head number (from 1), 'mean' or 'all', got '{text}'"
    )


def _add_attention(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attention",
        help="translate a sentence and draw its cross-attention",
        description="Translate SENTENCE with a trained run and draw the decoder's cross-attention "
        "of the output it produced (under beam search, the chosen hypothesis): rows are target "
        "subwords (queries, with the EOS step), columns source subwords (keys, with EOS). Beside "
        "each map, and on stdout: each row's entropy (bits) and its mass on EOS and punctuation "
        "columns. Layers and heads are numbered from 1.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("sentence", metavar="SENTENCE", help="source sentence (quote it)")
    p.add_argument("-o", "--output", type=Path, help="output file (default: attention.FORMAT here)")
    p.add_argument(
        "--format",
        choices=["png", "svg", "html", "json"],
        help="default: from -o's suffix, else png; html and json hold every layer and head",
    )
    p.add_argument(
        "--layer",
        type=_layer_arg,
        default="all",
        metavar="L|all",
        help="decoder layer, 1 = first (default: all)",
    )
    p.add_argument(
        "--head",
        type=_head_arg,
        default="mean",
        metavar="H|mean|all",
        help="head, 1 = first; mean = average over heads; all = a grid of every head plus the "
        "mean (default: mean)",
    )
    p.add_argument(
        "--beam", type=int, help="beam size; 1 = greedy (default: the run's decode.beam)"
    )
    p.add_argument(
        "--reference",
        metavar="TRANSLATION",
        help="draw the maps of this given translation, teacher-forced, instead of the model's own",
    )
    p.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:N or auto (default: %(default)s)"
    )
    p.set_defaults(run=_run_attention)


def _run_attention(args: argparse.Namespace) -> int:
    import warnings

    from seq2seq.attention_report import attention_report, format_table

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = attention_report(
            args.run_dir,
            args.sentence,
            args.layer,
            args.head,
            args.beam,
            args.format,
            args.output,
            args.reference,
            args.device,
        )
    for w in caught:  # e.g. no installed font for a script: its glyphs draw as boxes
        print(f"warning: {w.message}", file=sys.stderr)
    print(f"translation: {report['translation']}")
    print(f"decoding: {report['decoding']}; stop reason: {report['stop_reason']}")
    print(format_table(report))
    print(f"wrote {report['path']}")
    return 0


def _add_search_args(p: argparse.ArgumentParser) -> None:
    """Decoding options shared by ``translate`` and ``evaluate``; unset ones come from the
    run's ``decode`` config section."""
    p.add_argument(
        "--beam", type=int, help="beam size; 1 = greedy (default: the run's decode.beam)"
    )
    p.add_argument("--length-penalty", type=float, help="GNMT alpha for beam search")
    p.add_argument("--max-len-a", type=float, help="max output subwords = a * source subwords + b")
    p.add_argument("--max-len-b", type=int)
    p.add_argument("--no-cache", action="store_true", help="recompute the prefix every step (slow)")
    p.add_argument(
        "--ban-eos", action="store_true", help="never stop at EOS: every output runs to max_len"
    )
    p.add_argument(
        "--batch-tokens", type=int, help="source tokens per batch (default: decode.max_tokens)"
    )
    p.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:N or auto (default: %(default)s)"
    )


def _search_overrides(args: argparse.Namespace) -> dict:
    return {
        "beam": args.beam,
        "nbest": getattr(args, "nbest", None),
        "length_penalty": args.length_penalty,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "use_cache": not args.no_cache,
        "ban_eos": args.ban_eos,
        "need_weights": getattr(args, "verbose", False),
    }


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


def _add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "translate",
        help="translate sentences, a file or standard input with a trained run",
        description="Translate TEXT arguments, else the lines of -i FILE or standard input "
        "(a '> ' prompt when it is a terminal; Ctrl-D ends). One output line per input line; "
        "with --nbest N > 1, N lines 'INDEX ||| SCORE ||| TEXT' per input (INDEX from 0). "
        "Invalid UTF-8 input is decoded with replacement characters (one warning).",
    )
    p.__class__ = _IntermixedParser
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("text", nargs="*", metavar="TEXT", help="sentences to translate")
    p.add_argument("-i", "--input", type=Path, help="read lines from this file")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        help="write here (in place, flushed per chunk) instead of stdout",
    )
    p.add_argument("--nbest", type=int, help="hypotheses per input (needs --beam >= N)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="per sentence on stderr: source/output lengths, stop reason, cross-attention shapes",
    )
    _add_search_args(p)
    p.set_defaults(run=_run_translate)


def _run_translate(args: argparse.Namespace) -> int:
    from seq2seq.translate import Translator, translate_files

    if args.text and args.input:
        raise Seq2SeqError("give sentences as arguments or -i FILE, not both")
    translator = Translator.from_run(args.run_dir, args.device)
    search = translator.search_config(**_search_overrides(args))
    translate_files(
        translator, search, args.text, args.input, args.output, args.batch_tokens, args.verbose
    )
    return 0


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="translate a split and score it (sacreBLEU BLEU, chrF)",
        description="Decode a split of a corpus and print BLEU, chrF (with signatures), "
        "lowercased BLEU, the length ratio and the stop reasons; write the hypotheses "
        "and the scores (JSON beside them).",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--data", help="corpus (default: the run's data.data)")
    p.add_argument("--src", help="source language (default: the run's data.src)")
    p.add_argument("--tgt", help="target language (default: the run's data.tgt)")
    p.add_argument("--split", default="test", choices=["train", "validation", "test"])
    p.add_argument("--test-split", help="which test* split is the test set (default: the run's)")
    p.add_argument(
        "-o", "--output", type=Path, help="hypothesis file (default RUN_DIR/hyps.SPLIT.TGT.txt)"
    )
    _add_search_args(p)
    p.set_defaults(run=_run_evaluate)


def _run_evaluate(args: argparse.Namespace) -> int:
    from seq2seq.checkpoint import load_config_file
    from seq2seq.evaluate import evaluate_split, format_report
    from seq2seq.translate import search_config

    search = search_config(load_config_file(args.run_dir).decode, **_search_overrides(args))
    report = evaluate_split(
        args.run_dir,
        args.data,
        args.split,
        search,
        src=args.src,
        tgt=args.tgt,
        test_split=args.test_split,
        max_tokens=args.batch_tokens,
        device=args.device,
        hyp_file=args.output,
    )
    print(format_report(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seq2seq",
        description="Train an encoder-decoder Transformer translator, translate, and inspect cross-attention.",
    )
    parser.add_argument("--version", action="version", version=f"seq2seq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_add_data, _add_train, _add_translate, _add_evaluate, _add_attention):
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
    except OSError as e:  # a full disk, a file that vanished: one line, never a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
