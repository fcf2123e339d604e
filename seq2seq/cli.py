"""``seq2seq`` command line: parse, load config, call a library function; nothing else.

Every user-facing failure is a ``Seq2SeqError``, printed here as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from seq2seq import __version__
from seq2seq.config import DataConfig
from seq2seq.errors import Seq2SeqError


def _add_columns(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--columns",
        metavar="SRC,TGT",
        help="the source and target columns of a TSV corpus, by position from 1 or header name, "
        "e.g. 1,2 (default: a header naming the languages, else the first two)",
    )


def _add_data(sub: argparse._SubParsersAction) -> None:
    defaults = DataConfig()
    p = sub.add_parser(
        "data",
        help="summarise a parallel corpus: pairs, subword lengths, padding",
        description="Load a corpus, (train and) apply a tokenizer, print its summary: what a "
        "training run with the same data settings would see.",
    )
    p.add_argument(
        "--data",
        default=defaults.data,
        help="registry name (data/corpora.yaml), Hub id, folder of {split}.{lang}[.gz] files, "
        "TSV file or folder (default: %(default)s, the Multi30k copy in the repository)",
    )
    p.add_argument("--src", default=defaults.src, help="source language (default: %(default)s)")
    p.add_argument("--tgt", default=defaults.tgt, help="target language (default: %(default)s)")
    p.add_argument("--test-split", help="the split to use as test (default: the one named test*)")
    _add_columns(p)
    p.add_argument(
        "--tokenizer", type=Path, help="reuse this tokenizer (run directory or .model file)"
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        help=f"default: sized to the corpus, at most {defaults.vocab_size}",
    )
    p.add_argument(
        "--max-len", type=int, default=defaults.max_len, help="subwords per side for training pairs"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=defaults.max_tokens,
        help="tokens per batch, per side (default: %(default)s, as training)",
    )
    p.add_argument("--out", type=Path, help="also write the summary as JSON here")
    p.set_defaults(run=_run_data)


def _run_data(args: argparse.Namespace) -> int:
    """``seq2seq data``: load the corpus, tokenize it, print (and optionally save) the report."""
    from seq2seq.corpora import data_report, load_corpus
    from seq2seq.fileio import atomic_write_text
    from seq2seq.tokenizer import Tokenizer

    defaults = DataConfig()
    corpus = load_corpus(
        args.data,
        args.src,
        args.tgt,
        args.test_split,
        defaults.carve_valid,
        defaults.carve_test,
        columns=args.columns,
    )
    if args.tokenizer:
        tokenizer = Tokenizer.load(args.tokenizer)
    else:
        train = corpus.splits["train"]
        with tempfile.TemporaryDirectory() as scratch:
            tokenizer = Tokenizer.train(
                [s for s, _ in train],
                [t for _, t in train],
                Path(scratch),
                args.vocab_size or defaults.vocab_size,
                fit_to_corpus=args.vocab_size is None,
            )
    report = data_report(corpus, tokenizer, args.max_len, args.max_tokens)
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
        f"{split} {reason} {n:,}"
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
    _add_columns(p)
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
    p.add_argument(
        "--max-time",
        type=float,
        metavar="MINUTES",
        help="wall-time budget in minutes (default 30; 0 = none, stop by patience or epochs)",
    )
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--device", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps (default auto)"
    )
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
    from seq2seq import checkpoint
    from seq2seq.config import config_from_dict, given_values
    from seq2seq.train import say, train

    flags = {
        "data.data": args.data,
        "data.src": args.src,
        "data.tgt": args.tgt,
        "data.test_split": args.test_split,
        "data.columns": args.columns,
        "train.max_epochs": args.max_epochs,
        "train.max_time": args.max_time,
        "train.max_steps": args.max_steps,
        "train.seed": args.seed,
        "train.device": args.device,
        "train.precision": "fp32" if args.fp32 else None,
    }
    overrides = [f"{k}={v}" for k, v in flags.items() if v is not None] + args.overrides
    given = given_values(args.config, overrides)
    config = config_from_dict(given)  # checks every value given, on --resume too
    if args.resume and (args.out / checkpoint.CONFIG_FILE).is_file():
        config, ignored = checkpoint.resume_config(args.out, given)
        if ignored:
            say(f"note: --resume keeps the run's recipe; ignored: {', '.join(ignored)}")
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
        help="translate sentences and explore their cross-attention, step by step",
        description="Translate SENTENCE, or each line of -i FILE, with a trained run and draw the "
        "decoder's cross-attention of the output it produced (under beam search, the chosen "
        "hypothesis): rows are target subwords (queries, with the EOS step), columns source "
        "subwords (keys, with EOS). PNG/SVG: the maps --layer and --head choose, with each row's "
        "entropy (bits) and mass on EOS and punctuation (also on stdout). HTML: a self-contained "
        "explorer: a step-through of decoding (the token chosen at each step, its probability, "
        "the five most likely tokens, P(EOS), where and why the loop stopped), the heatmap, a "
        "line view and a model view, with a sentence picker. JSON: one record per sentence per "
        "line. Layers, heads and steps are numbered from 1.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("sentence", nargs="?", metavar="SENTENCE", help="source sentence (quote it)")
    p.add_argument(
        "-i", "--input", type=Path, help="one source sentence per line (HTML and JSON only)"
    )
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
        "--max-len", type=int, help="stop outputs at this many subwords (default: a * S + b)"
    )
    p.add_argument(
        "--ban-eos", action="store_true", help="never stop at EOS: every output runs to max_len"
    )
    p.add_argument(
        "--words",
        action="store_true",
        help="merge subwords into words: a source word's weight is the sum over its subwords, "
        "a target word's row the mean of its subwords' rows",
    )
    p.add_argument(
        "--reference",
        metavar="TRANSLATION",
        help="draw the maps of this given translation, teacher-forced, instead of the model's own",
    )
    p.add_argument(
        "--reference-file",
        type=Path,
        metavar="FILE",
        help="with -i: one reference per line, teacher-forced",
    )
    p.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:N or auto (default: %(default)s)"
    )
    p.set_defaults(run=_run_attention)


def _run_attention(args: argparse.Namespace) -> int:
    import warnings

    from seq2seq.attention_report import attention_report, format_summary, report_inputs

    sentences, references = report_inputs(
        args.sentence, args.input, args.reference, args.reference_file
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = attention_report(
            args.run_dir,
            sentences,
            references=references,
            layer=args.layer,
            head=args.head,
            beam=args.beam,
            max_len=args.max_len,
            ban_eos=args.ban_eos,
            words=args.words,
            fmt=args.format,
            out=args.output,
            device=args.device,
        )
    warned = [str(w.message) for w in caught]  # e.g. no installed font: glyphs draw as boxes
    for message in warned + [note for r in report["records"] for note in r["notes"]]:
        print(f"warning: {message}", file=sys.stderr)
    print(format_summary(report, args.layer, args.head))
    return 0


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="a local web page to type sentences and explore their translation's attention",
        description="Load a trained run once and serve the attention explorer at "
        "http://HOST:PORT/ for sentences typed in; beam, max_len and 'ban EOS' show how "
        "decoding decides the length. Ctrl-C stops.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port (default: 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    p.set_defaults(run=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from seq2seq.serve import serve

    serve(args.run_dir, host=args.host, port=args.port, device=args.device)
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
    p.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")


def _decode_overrides(args: argparse.Namespace) -> dict:
    """The decoding options given on the command line; None = the run's ``decode`` section."""
    return {
        "beam": args.beam,
        "nbest": getattr(args, "nbest", None),
        "length_penalty": args.length_penalty,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "max_tokens": args.batch_tokens,
        "use_cache": False if args.no_cache else None,
        "ban_eos": True if args.ban_eos else None,
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
    p.add_argument(
        "--engine",
        choices=("torch", "ctranslate2"),
        default="torch",
        help="ctranslate2: RUN_DIR is a 'seq2seq export' directory (default: %(default)s)",
    )
    p.set_defaults(run=_run_translate)


def _run_translate(args: argparse.Namespace) -> int:
    from seq2seq.export import open_translator
    from seq2seq.translate import translate_files

    if args.text and args.input:
        raise Seq2SeqError("give sentences as arguments or -i FILE, not both")
    translator = open_translator(args.run_dir, args.device, args.engine)
    decode = translator.config.decode.with_overrides(**_decode_overrides(args))
    translate_files(
        translator,
        decode,
        texts=args.text,
        input_path=args.input,
        output_path=args.output,
        verbose=args.verbose,
        progress=not args.no_progress,
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
    _add_columns(p)
    p.add_argument(
        "-o", "--output", type=Path, help="hypothesis file (default RUN_DIR/hyps.SPLIT.TGT.txt)"
    )
    p.add_argument(
        "--tokenize",
        help="sacreBLEU tokenizer for BLEU (default: from the target language, as sacrebleu -l "
        "picks it: zh, ja-mecab or char, ko-mecab or char, char for th, else 13a)",
    )
    _add_search_args(p)
    p.set_defaults(run=_run_evaluate)


def _run_evaluate(args: argparse.Namespace) -> int:
    from seq2seq.checkpoint import load_config_file
    from seq2seq.evaluate import evaluate_split, format_report

    decode = load_config_file(args.run_dir).decode.with_overrides(**_decode_overrides(args))
    report = evaluate_split(
        args.run_dir,
        args.data,
        args.split,
        decode,
        src=args.src,
        tgt=args.tgt,
        test_split=args.test_split,
        columns=args.columns,
        tokenize=args.tokenize,
        device=args.device,
        hyp_file=args.output,
        progress=not args.no_progress,
    )
    print(format_report(report))
    return 0


def _add_average(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "average",
        help="average the last kept checkpoints of a run into one weights file",
        description="Average the weights of the last N validated states a run kept in "
        "RUN/checkpoints/ (train.keep_last) into one file that every command loads in place "
        "of a run directory, e.g. seq2seq translate RUN/averaged.safetensors TEXT.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--last", type=int, default=5, help="how many (default: %(default)s)")
    p.add_argument(
        "-o", "--output", type=Path, help="weights file (default: RUN_DIR/averaged.safetensors)"
    )
    p.set_defaults(run=_run_average)


def _run_average(args: argparse.Namespace) -> int:
    from seq2seq.checkpoint import average_run

    out, chosen = average_run(args.run_dir, args.last, args.output)
    steps = ", ".join(p.stem.removeprefix("step_") for p in chosen)
    print(f"averaged {len(chosen)} checkpoints (steps {steps}) into {out}")
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
    from seq2seq.curves import save_curves

    print(f"saved {save_curves(args.run_dirs, args.output)}")
    return 0


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's model for a fast inference engine (CTranslate2)",
        description="Write RUN_DIR's model, tokenizer and config into a new directory that "
        "'seq2seq translate --engine ctranslate2 DIR' (or ctranslate2.Translator) loads. "
        "GQA/MQA (model.n_kv_heads) and MLA (model.d_latent) models are refused.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("-o", "--output", type=Path, required=True, help="a new or empty directory")
    p.add_argument("--format", choices=("ctranslate2",), default="ctranslate2")
    p.add_argument(
        "--quantization",
        choices=("float32", "int8_float32", "int8"),
        default="float32",
        help="weight type (default: %(default)s)",
    )
    p.set_defaults(run=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from seq2seq.export import export_ctranslate2

    out = export_ctranslate2(args.run_dir, args.output, args.quantization)
    print(f"wrote a CTranslate2 model ({args.quantization}) to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seq2seq",
        description="Train an encoder-decoder Transformer translator, translate, and inspect cross-attention.",
    )
    parser.add_argument("--version", action="version", version=f"seq2seq {__version__}")
    # Options may sit between positionals in every subcommand (translate RUN --beam 5 TEXT).
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_IntermixedParser)
    commands = (_add_data, _add_train, _add_translate, _add_evaluate, _add_average, _add_plot)
    for add in (*commands, _add_attention, _add_serve, _add_export):
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
