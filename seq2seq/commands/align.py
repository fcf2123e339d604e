"""``seq2seq align``: word alignments of a source file and its references (or the model's own
translations) from cross-attention or from influence, as Pharaoh lines, scored against a gold
alignment where one is given (``seq2seq.inspect.alignment``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seq2seq.commands.options import add_device_option, whole_number_arg
from seq2seq.errors import Seq2SeqError

DESCRIPTION = (
    "Align the words of each line of SOURCE_FILE with those of the same line of "
    "REFERENCE_FILE, teacher-forced, or with --decode those of the model's own translation. "
    "Each target word is linked to the source word it attends to most (the mean over every "
    "decoder layer and head, unless --layer, or --layer and --head, choose), or with --from "
    "influence the source word whose hiding from cross-attention lowers its log-probability "
    "most; EOS takes no link. Words are the word views' (subwords joined at SentencePiece's "
    "word starts). One line per sentence of Pharaoh links i-j (source word i, target word j, "
    "from 0) on stdout or -o FILE. --gold FILE (links i-j sure, ipj possible) prints AER, "
    "precision and recall (Och & Ney 2003) on stderr. Attention shows where the decoder read, "
    "not why it wrote a word: an alignment from it is no explanation."
)


def add_align(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "align",
        help="word alignments (Pharaoh i-j) from cross-attention or influence, and their AER",
        description=DESCRIPTION,
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("source_file", type=Path, metavar="SOURCE_FILE", help="one sentence a line")
    p.add_argument(
        "reference_file",
        type=Path,
        nargs="?",
        metavar="REFERENCE_FILE",
        help="one translation a line, teacher-forced (not with --decode)",
    )
    p.add_argument(
        "--decode",
        action="store_true",
        help="align the model's own translations (the run's decode.beam, or --beam)",
    )
    p.add_argument("--beam", type=whole_number_arg, help="with --decode: beam size; 1 = greedy")
    p.add_argument(
        "--from",
        dest="source",
        choices=("attention", "influence"),
        default="attention",
        help="what links a target word to a source word (default: %(default)s)",
    )
    p.add_argument(
        "--layer",
        type=whole_number_arg,
        help="the mean over the heads of this decoder layer (from 1; default: the mean over "
        "every layer and head)",
    )
    p.add_argument("--head", type=whole_number_arg, help="with --layer: this head alone (from 1)")
    p.add_argument("--gold", type=Path, metavar="FILE", help="gold links to score against")
    p.add_argument("-o", "--output", type=Path, help="write the links here instead of stdout")
    p.add_argument(
        "--translations",
        type=Path,
        metavar="FILE",
        help="with --decode: also write the translations aligned, one a line",
    )
    add_device_option(p)
    p.set_defaults(run=_run_align)


def _check_options(args: argparse.Namespace) -> None:
    if args.decode:
        if args.reference_file is not None:
            raise Seq2SeqError(
                "--decode aligns the model's own translations: give no REFERENCE_FILE"
            )
        if args.gold is not None:
            raise Seq2SeqError("--gold scores links to the references: it cannot go with --decode")
    else:
        if args.reference_file is None:
            raise Seq2SeqError("give REFERENCE_FILE, or --decode to align the model's translations")
        for name, value in (("--beam", args.beam), ("--translations", args.translations)):
            if value is not None:
                raise Seq2SeqError(f"{name} goes with --decode")
    if args.source == "influence" and (args.layer is not None or args.head is not None):
        raise Seq2SeqError("--layer and --head choose attention maps: not with --from influence")


def _run_align(args: argparse.Namespace) -> int:
    from seq2seq.decoding.translate import Translator
    from seq2seq.explorer.report import read_sentences
    from seq2seq.fileio import atomic_write_text
    from seq2seq.inspect import alignment

    _check_options(args)
    sources = read_sentences(args.source_file, "SOURCE_FILE")
    references = None
    if args.reference_file is not None:
        references = read_sentences(args.reference_file, "REFERENCE_FILE")
    gold = None if args.gold is None else alignment.parse_gold(_read_gold(args.gold), len(sources))
    translator = Translator.from_run(args.run_dir, args.device)
    config = translator.model.config
    alignment.check_map_choice(args.layer, args.head, config.n_dec_layers, config.n_heads)
    maps = alignment.word_maps(
        translator, sources, references, influence=args.source == "influence", beam=args.beam
    )
    if gold is not None:
        alignment.check_gold(gold, [(len(m.src_words), len(m.tgt_words)) for m in maps])
    links = [alignment.links_of(m, args.source, args.layer, args.head) for m in maps]
    text = "".join(alignment.format_pharaoh(x) + "\n" for x in links)
    for n, m in enumerate(maps, start=1):
        for note in m.notes:
            print(f"warning: line {n}: {note}", file=sys.stderr)
    if args.output is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)
    if args.translations is not None:
        atomic_write_text(args.translations, "".join(m.translation + "\n" for m in maps))
    if gold is not None:
        print(alignment.format_scores(alignment.score(links, gold)), file=sys.stderr)
    return 0


def _read_gold(path: Path) -> list[str]:
    """The gold file's lines (an empty one: a sentence without links)."""
    from seq2seq.decoding.translate import read_lines

    try:
        with open(path, "rb") as f:
            return list(read_lines(f))
    except OSError as e:
        raise Seq2SeqError(f"--gold {path}: {e.strerror or e}") from None


COMMANDS = (add_align,)
