"""The ``seq2seq`` commands that use a trained run: translate, evaluate, attention, serve, export.

Each parses its options and calls a library function (``cli.main`` prints failures); the
options several commands share are in ``options``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from seq2seq.commands.options import (
    add_columns_option,
    add_device_option,
    add_renamed_option,
    finite_number_arg,
    port_arg,
    whole_number_arg,
)
from seq2seq.errors import Seq2SeqError, whole_number


def _seconds_arg(text: str) -> float:
    import threading

    seconds = finite_number_arg(text)
    if not 0 < seconds <= threading.TIMEOUT_MAX:  # beyond, a timed wait refuses it
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return seconds


def _layer_arg(text: str) -> int | str:
    number = whole_number(text)
    if text == "all" or number is not None:
        return text if text == "all" else number
    raise argparse.ArgumentTypeError(f"expected a layer number (from 1) or 'all', got {text!r}")


def _head_arg(text: str) -> int | str:
    number = whole_number(text)
    if text in ("mean", "all") or number is not None:
        return text if number is None else number
    raise argparse.ArgumentTypeError(
        f"expected a head number (from 1), 'mean' or 'all', got {text!r}"
    )


ATTENTION_DESCRIPTION = (
    "Translate SENTENCE, or each line of -i FILE, with a trained run and draw the "
    "decoder's cross-attention of the output it produced (under beam search, the chosen "
    "hypothesis): rows are target subwords (queries, with the EOS step), columns source "
    "subwords (keys, with EOS); or, --kind encoder, the encoder's self-attention (source over "
    "source), or --kind decoder, the decoder's masked self-attention (its inputs, BOS then "
    "the output, over themselves; the causal mask drawn hatched). "
    "PNG/SVG: the maps --kind, --layer and --head choose, with each row's "
    "entropy (bits) and mass on EOS and punctuation (also on stdout, with the source token "
    "each row attends to most beside the one whose hiding from cross-attention lowers the "
    "row's token most: influence by occlusion). HTML: a self-contained "
    "explorer: a step-through of decoding (the token chosen at each step, its probability, "
    "the five most likely tokens, P(EOS), where and why the loop stopped), the heatmap "
    "(attention, or influence), a line view, a model view and interventions (uniform and "
    "permuted weights in each layer and in all, and any --intervene), with a sentence "
    "picker and a choice of attention. JSON: one record per sentence per line, with the "
    "influence map and the self-attention. Layers, heads, steps and rows are numbered from 1."
)


def _add_attention(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attention",
        help="translate sentences and explore their cross-attention, step by step",
        description=ATTENTION_DESCRIPTION,
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
    _add_map_choice(p)
    _add_beam_option(p)
    _add_length_penalty_option(p)
    p.add_argument(
        "--max-len",
        type=whole_number_arg,
        help="stop outputs at this many subwords (default: a * S + b)",
    )
    _add_ban_eos_option(p)
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
        "--intervene",
        action="append",
        default=[],
        metavar="KIND[:N]",
        help="decode again (greedy) with cross-attention changed, and show which words "
        "changed: uniform, permuted or kept (the control) weights in layer N (from 1; "
        "default: all), or mask:N, source position N (from 1; a word with --words) hidden "
        "from every layer; repeatable (an HTML page holds uniform and permuted in each layer "
        "and in all besides)",
    )
    p.add_argument(
        "--no-influence",
        action="store_true",
        help="skip influence by occlusion (one more decoder pass per source subword, batched)",
    )
    p.add_argument(
        "--no-interventions",
        action="store_true",
        help="an HTML page without the uniform and permuted interventions it holds by default "
        "(2 (L + 1) greedy decodings per sentence); --intervene still adds those asked for",
    )
    add_device_option(p)
    p.set_defaults(run=_run_attention)


def _add_map_choice(p: argparse.ArgumentParser) -> None:
    """--kind, --layer and --head: the maps a PNG or SVG draws and the table prints."""
    p.add_argument(
        "--kind",
        choices=("cross", "encoder", "decoder"),
        default="cross",
        help="which attention: cross (the decoder reading the source; fairseq's encoder_attn), "
        "encoder (the encoder's self-attention), decoder (the decoder's masked "
        "self-attention), as Hugging Face names them (cross_attentions, encoder_attentions, "
        "decoder_attentions) (default: cross)",
    )
    p.add_argument(
        "--layer",
        type=_layer_arg,
        default="all",
        metavar="L|all",
        help="layer (of the decoder; of the encoder with --kind encoder), 1 = first (default: all)",
    )
    p.add_argument(
        "--head",
        type=_head_arg,
        default="mean",
        metavar="H|mean|all",
        help="head, 1 = first; mean = average over heads; all = a grid of every head plus the "
        "mean (default: mean)",
    )


def _add_beam_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--beam",
        type=whole_number_arg,
        help="beam size; 1 = greedy (default: the run's decode.beam)",
    )


def _add_length_penalty_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--length-penalty",
        type=finite_number_arg,
        help="GNMT alpha for beam search (default: the run's decode.length_penalty)",
    )


def _add_ban_eos_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ban-eos", action="store_true", help="never stop at EOS: every output runs to max_len"
    )


def _run_attention(args: argparse.Namespace) -> int:
    from seq2seq.explorer.report import attention_report, format_summary, report_inputs

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
            kind=args.kind,
            beam=args.beam,
            length_penalty=args.length_penalty,
            max_len=args.max_len,
            ban_eos=args.ban_eos,
            words=args.words,
            influence=not args.no_influence,
            interventions=args.intervene,
            with_page_interventions=not args.no_interventions,
            fmt=args.format,
            out=args.output,
            device=args.device,
        )
    warned = [str(w.message) for w in caught]  # e.g. no installed font: glyphs draw as boxes
    for message in warned + [note for r in report["records"] for note in r["notes"]]:
        print(f"warning: {message}", file=sys.stderr)
    print(format_summary(report, args.layer, args.head, args.kind))
    return 0


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="a local web page to type sentences and explore their translation's attention",
        description="Load a trained run once and serve the attention explorer at "
        "http://HOST:PORT/ for sentences typed in; beam, max_len and 'ban EOS' show how "
        "decoding decides the length, 'influence' adds the occlusion map, and the "
        "interventions panel decodes a sentence again with cross-attention changed. Ctrl-C "
        "stops.",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--port", type=port_arg, default=8000, help="0 = any free port (default: 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument(
        "--public",
        action="store_true",
        help="allow a --host other than loopback (e.g. 0.0.0.0): anyone who reaches it can "
        "use the explorer, which has no login",
    )
    p.add_argument(
        "--deadline",
        type=_seconds_arg,
        default=60.0,
        metavar="SECONDS",
        help="a request not decoded within this long, waiting for the model included, gets "
        "503 (default: %(default)s)",
    )
    add_device_option(p)
    p.set_defaults(run=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from seq2seq.explorer.serve import serve

    serve(
        args.run_dir,
        host=args.host,
        port=args.port,
        device=args.device,
        public=args.public,
        deadline=args.deadline,
    )
    return 0


def _add_search_args(p: argparse.ArgumentParser) -> None:
    """Decoding options shared by ``translate`` and ``evaluate``; unset ones come from the
    run's ``decode`` config section."""
    _add_beam_option(p)
    _add_length_penalty_option(p)
    p.add_argument(
        "--max-len-a", type=finite_number_arg, help="max output subwords = a * source subwords + b"
    )
    p.add_argument("--max-len-b", type=whole_number_arg)
    p.add_argument("--no-cache", action="store_true", help="recompute the prefix every step (slow)")
    _add_ban_eos_option(p)
    add_renamed_option(
        p,
        "--max-tokens",
        "--batch-tokens",
        type=whole_number_arg,
        help="source tokens per batch (default: decode.max_tokens)",
    )
    add_device_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")


def decode_overrides(args: argparse.Namespace) -> dict:
    """The decoding options given on the command line; None = the run's ``decode`` section."""
    return {
        "beam": args.beam,
        "nbest": getattr(args, "nbest", None),
        "length_penalty": args.length_penalty,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "max_tokens": args.max_tokens,
        "use_cache": False if args.no_cache else None,
        "ban_eos": True if args.ban_eos else None,
    }


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
    p.add_argument(
        "--nbest", type=whole_number_arg, help="hypotheses per input (needs --beam >= N)"
    )
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
    from seq2seq.decoding.export import open_translator
    from seq2seq.decoding.translate import translate_files

    if args.text and args.input:
        raise Seq2SeqError("give sentences as arguments or -i FILE, not both")
    translator = open_translator(args.run_dir, args.device, args.engine)
    decode = translator.config.decode.with_overrides(**decode_overrides(args))
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
        "lowercased BLEU, BLEU on the Multi30k papers' scale (lowercased, normalised, "
        "Moses-tokenized), the length ratio and the stop reasons; write the hypotheses "
        "and the scores (JSON beside them).",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--data", help="corpus (default: the run's data.data)")
    p.add_argument("--src", help="source language (default: the run's data.src)")
    p.add_argument("--tgt", help="target language (default: the run's data.tgt)")
    p.add_argument("--split", default="test", choices=["train", "validation", "test"])
    p.add_argument("--test-split", help="which test* split is the test set (default: the run's)")
    add_columns_option(p)
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        help="hypothesis file (default RUN_DIR/hyps.SPLIT.TGT[.beamK].txt)",
    )
    p.add_argument(
        "--tokenize",
        help="sacreBLEU tokenizer for BLEU (default: from the target language, as sacrebleu -l "
        "picks it: zh, ja-mecab or char, ko-mecab or char, char for th, else 13a)",
    )
    _add_search_args(p)
    p.set_defaults(run=_run_evaluate)


def _run_evaluate(args: argparse.Namespace) -> int:
    from seq2seq.decoding.evaluate import evaluate_split, format_report
    from seq2seq.run.checkpoint import load_config_file, split_run_path

    run_dir, _ = split_run_path(args.run_dir)  # RUN, or a weights file inside it
    decode = load_config_file(run_dir).decode.with_overrides(**decode_overrides(args))
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
    from seq2seq.decoding.export import export_ctranslate2

    out = export_ctranslate2(args.run_dir, args.output, args.quantization)
    print(f"wrote a CTranslate2 model ({args.quantization}) to {out}")
    return 0


COMMANDS = (_add_translate, _add_evaluate, _add_attention, _add_serve, _add_export)
