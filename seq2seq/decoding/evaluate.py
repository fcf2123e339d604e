"""Decode a split with a trained run and score it: sacreBLEU BLEU and chrF with signatures.

Scores are on detokenized text against the raw references, so they are comparable with
other systems' sacreBLEU numbers (the signature says how they were computed). BLEU's
tokenizer follows the target language as ``sacrebleu -l`` chooses it (``bleu_tokenize``;
training's validation BLEU uses the same choice), unless one is given. Lowercased
BLEU is there for older papers that report it; BLEU on the Multi30k papers' scale
(``literature_bleu``: lowercased, normalised, Moses-tokenized text, as the dataset's own
``*.lc.norm.tok.*`` files) for comparing with them. The length ratio (hypothesis over reference
words, sacreBLEU's ``sys_len / ref_len``) and the stop reasons say whether a bad score comes
from translations cut short by ``max_len`` or ended early.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sacrebleu.metrics import BLEU, CHRF

from seq2seq.config import DEFAULT_DEVICE, DataConfig, DecodeConfig
from seq2seq.data.corpora import Corpus, open_corpus
from seq2seq.decoding.translate import DecodeProgress, Translation, Translator
from seq2seq.errors import Seq2SeqError
from seq2seq.fileio import atomic_write_text
from seq2seq.run.checkpoint import BEST_FILE, sha256_of, split_run_path, weights_identity

if TYPE_CHECKING:
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

# Targets written without spaces between words, where 13a would see a sentence as one word:
# sacreBLEU's choice for ``-l`` first, then characters where MeCab's optional packages are
# missing (they need a download). sacreBLEU leaves Thai at 13a; characters serve it better.
_LANGUAGE_TOKENIZERS = {
    "zh": ("zh",),
    "ja": ("ja-mecab", "char"),
    "ko": ("ko-mecab", "char"),
    "th": ("char",),
}

LITERATURE_SCALE = "lowercased, normalised, Moses-tokenized, as Multi30k papers report"


def bleu_tokenize(lang: str) -> str:
    """sacreBLEU's BLEU tokenizer for targets in ``lang`` (``zh``, ``ja-JP``, ``en`` ...):
    ``zh``; ``ja-mecab`` / ``ko-mecab`` where installed, else ``char``; ``char`` for Thai;
    ``13a`` for everything else. The BLEU signature shows it as ``tok:NAME``."""
    usable = [name for name in _LANGUAGE_TOKENIZERS.get(_base(lang), ()) if _usable(name)]
    return usable[0] if usable else "13a"


def _base(lang: str) -> str:
    """The language of a tag: ``de`` for ``de``, ``de-CH``, ``DE_ch``."""
    return lang.lower().replace("_", "-").split("-")[0]


@functools.cache
def _usable(tokenize: str) -> bool:
    """Whether sacreBLEU builds this tokenizer here (some need packages or a download)."""
    try:
        BLEU(tokenize=tokenize)
    except (RuntimeError, ImportError, OSError, KeyError):
        return False
    return True


def evaluate_split(
    run_dir: str | Path,
    data: str | None = None,
    split: str = "test",
    decode: DecodeConfig | None = None,
    *,
    src: str | None = None,
    tgt: str | None = None,
    test_split: str | None = None,
    columns: str | None = None,
    device: str = DEFAULT_DEVICE,
    hyp_file: str | Path | None = None,
    tokenize: str | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Translate ``split`` of a corpus and score it; write the hypotheses and the scores.

    Corpus, languages, test split and TSV columns default to the run's config (``data.*``;
    its columns only for its own corpus), ``decode``
    to its ``decode`` section, BLEU's ``tokenize`` to ``bleu_tokenize(tgt)``. Pairs with an
    empty side are not scored; the report counts them (``empty_pairs_dropped``).
    Hypotheses go to ``hyp_file`` (default ``RUN_DIR/hyps.{split}.{tgt}.txt``, with
    ``.beam{K}`` before the suffix for a beam search), one line
    per scored pair, and the returned scores as JSON beside it (``.json`` in place of the
    suffix). The scores name the weights they are of (``weights_identity``: file, step or
    average, sha256), which ``experiments.records collect`` checks against the run's.
    ``progress``: a bar on stderr while decoding, when stderr is a terminal.
    """
    if tokenize is not None:
        _check_tokenize(tokenize)  # before the model loads
    home, weights = split_run_path(run_dir)  # other weights than the run's: their own file
    scored = weights or home / BEST_FILE
    digest = sha256_of(scored) if scored.is_file() else None  # else load_run says what is amiss
    translator = Translator.from_run(run_dir, device)
    identity = weights_identity(home, scored)
    if identity["sha256"] != digest:  # a training still running replaced them
        raise Seq2SeqError(f"{scored} changed while it loaded; evaluate it again")
    d = translator.config.data
    data, src, tgt = data or d.data, src or d.src, tgt or d.tgt
    tokenize = tokenize or bleu_tokenize(tgt)
    columns = columns or (d.columns if data == d.data else None)
    corpus, pairs = _split_pairs(d, data, src, tgt, split, test_split or d.test_split, columns)
    decode = decode or translator.config.decode
    with contextlib.closing(DecodeProgress(len(pairs), progress)) as bar:
        results = translator.translate([s for s, _ in pairs], decode, progress=bar)
    hyps = [r[0].text for r in results]
    refs = [t for _, t in pairs]

    scores = {**score(hyps, refs, tokenize), **literature_bleu(hyps, refs, tgt)}
    search = f".beam{decode.beam}" if decode.beam > 1 else ""  # greedy and beam side by side
    default = f"hyps.{split}.{tgt}{search}" + (f".{weights.stem}" if weights else "") + ".txt"
    hyp_path = Path(hyp_file) if hyp_file else home / default
    scores_path = _scores_path(hyp_path)
    report = {
        "run": str(run_dir),
        **identity,
        "data": corpus.source_description,
        "split": split,
        "sentences": len(pairs),
        "empty_pairs_dropped": corpus.dropped.get(split, {}).get("empty", 0),
        "search": dataclasses.asdict(decode),
        **scores,
        "stop_reasons": stop_reason_shares(results),
        "hyp_file": str(hyp_path),
        "scores_file": str(scores_path),
    }
    atomic_write_text(hyp_path, "".join(h + "\n" for h in hyps))
    atomic_write_text(scores_path, json.dumps(report, indent=2) + "\n")
    return report


def _split_pairs(
    d: DataConfig,
    data: str,
    src: str,
    tgt: str,
    split: str,
    test_split: str | None,
    columns: str | None,
) -> tuple[Corpus, list[tuple[str, str]]]:
    """The corpus and the pairs of ``split``, carved as the run's data settings ``d`` carve."""
    corpus = open_corpus(  # the training split streams: listed only when it is the one scored
        data,
        src,
        tgt,
        test_split=test_split,
        carve_valid=d.carve_valid,
        carve_test=d.carve_test,
        columns=columns,
    )
    pairs = list(corpus.train) if split == "train" else corpus.splits.get(split)
    if not pairs:
        raise Seq2SeqError(
            f"{corpus.source_description} has no pairs in split '{split}'; "
            f"splits: {', '.join(['train', *corpus.splits])}"
        )
    return corpus, pairs


def score(hyps: list[str], refs: list[str], tokenize: str = "13a") -> dict[str, Any]:
    """BLEU, chrF and lowercased BLEU with their signatures, and the length ratio."""
    out: dict[str, Any] = {}
    for name, metric in (
        ("bleu", BLEU(tokenize=tokenize)),
        ("chrf", CHRF()),
        ("bleu_lowercase", BLEU(lowercase=True, tokenize=tokenize)),
    ):
        result = metric.corpus_score(hyps, [refs])
        out[name] = round(result.score, 2)
        out[f"{name}_text"] = str(result)
        out[f"{name}_signature"] = str(metric.get_signature())
        if name == "bleu":
            out["sys_len"], out["ref_len"] = result.sys_len, result.ref_len
            out["length_ratio"] = round(result.sys_len / max(result.ref_len, 1), 4)
    return out


def lc_norm_tok(lines: Iterable[str], lang: str) -> list[str]:
    """``lines`` as the Multi30k papers score them, by sacremoses: the dataset's
    ``scripts/task1-tokenize.sh`` (``lowercase.perl | normalize-punctuation.perl -l LANG |
    tokenizer.perl -l LANG``: no aggressive dash splitting, XML characters escaped). It
    reproduces the dataset's ``*.lc.norm.tok.*`` files line for line."""
    normalizer, tokenizer = _moses(_base(lang))
    # Perl normalises each line with its newline, which lets the de/fr/es rule that moves a
    # sentence's final period behind its closing quote see a character after the quote.
    return [
        tokenizer.tokenize(normalizer.normalize(line.lower() + "\n"), escape=True, return_str=True)
        for line in lines
    ]


@functools.cache
def _moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
    """sacremoses' normaliser and tokenizer for ``lang``, built once (zh's takes seconds);
    imported here, since importing sacremoses alone takes half a second."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    # perl_parity: a lone ’ becomes " as in the Perl script, not '
    return MosesPunctNormalizer(lang=lang, perl_parity=True), MosesTokenizer(lang=lang)


@functools.lru_cache(maxsize=4)
def _tokenized_refs(refs: tuple[str, ...], lang: str) -> list[str]:
    """``lc_norm_tok`` of a split's references, kept: sacremoses takes about a second per
    thousand lines, and every search scored on one split reads the same references."""
    return lc_norm_tok(refs, lang)


def literature_bleu(hyps: list[str], refs: list[str], lang: str) -> dict[str, Any]:
    """BLEU on the Multi30k papers' scale (``LITERATURE_SCALE``): sacreBLEU without a
    tokenizer of its own over ``lc_norm_tok`` text in the target language ``lang``."""
    # force: the text is tokenized on purpose, so sacreBLEU's "forgot to detokenize?" warning
    # would be wrong (the signature does not change)
    metric = BLEU(tokenize="none", force=True)
    result = metric.corpus_score(lc_norm_tok(hyps, lang), [_tokenized_refs(tuple(refs), lang)])
    return {
        "bleu_lc_norm_tok": round(result.score, 2),
        "bleu_lc_norm_tok_text": str(result),
        "bleu_lc_norm_tok_signature": str(metric.get_signature()),
        "bleu_lc_norm_tok_preprocessing": f"lowercase, then sacremoses {version('sacremoses')} "
        f"normalise -l {_base(lang)} (perl parity), tokenize -l {_base(lang)} (escaped)",
    }


def stop_reason_shares(results: list[list[Translation]]) -> dict[str, float]:
    """Share of each stop reason among the best hypotheses."""
    counts: dict[str, int] = {}
    for hyps in results:
        counts[hyps[0].stop_reason] = counts.get(hyps[0].stop_reason, 0) + 1
    return {reason: round(n / len(results), 4) for reason, n in sorted(counts.items())}


def format_report(report: dict[str, Any]) -> str:
    s = report["search"]
    how = "greedy" if s["beam"] == 1 else f"beam {s['beam']}, length penalty {s['length_penalty']}"
    stops = ", ".join(f"{reason} {share:.1%}" for reason, share in report["stop_reasons"].items())
    empty = report["empty_pairs_dropped"]
    dropped = f" ({empty} empty pairs dropped)" if empty else ""
    return "\n".join(
        [
            f"{report['data']}, split {report['split']}: {report['sentences']} sentences"
            f"{dropped}, {how}",
            report["bleu_text"],
            f"  signature {report['bleu_signature']}",
            report["chrf_text"],
            f"  signature {report['chrf_signature']}",
            f"lowercased {report['bleu_lowercase_text']}",
            f"  signature {report['bleu_lowercase_signature']}",
            f"{LITERATURE_SCALE}: {report['bleu_lc_norm_tok_text']}",
            f"  signature {report['bleu_lc_norm_tok_signature']}",
            f"  text: {report['bleu_lc_norm_tok_preprocessing']}",
            f"length ratio hyp/ref {report['length_ratio']:.3f} "
            f"({report['sys_len']} / {report['ref_len']} words)",
            f"stop reasons: {stops}",
            f"hypotheses: {report['hyp_file']}",
            f"scores: {report['scores_file']}",
        ]
    )


def _check_tokenize(tokenize: str) -> None:
    if tokenize not in BLEU.TOKENIZERS:
        raise Seq2SeqError(
            f"--tokenize {tokenize}: sacreBLEU has {', '.join(sorted(BLEU.TOKENIZERS))}"
        )
    if not _usable(tokenize):
        raise Seq2SeqError(
            f"--tokenize {tokenize} cannot run here: it needs packages or files that are "
            "not installed (e.g. pip install 'sacrebleu[ja]' for ja-mecab)"
        )


def _scores_path(hyp_path: Path) -> Path:
    if hyp_path.suffix == ".json":
        return hyp_path.with_name(hyp_path.name + ".scores.json")
    return hyp_path.with_suffix(".json")
