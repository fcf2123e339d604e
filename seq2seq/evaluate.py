"""Decode a split with a trained run and score it: sacreBLEU BLEU and chrF with signatures.

Scores are on detokenized text against the raw references, so they are comparable with
other systems' sacreBLEU numbers (the signature says how they were computed). Lowercased
BLEU is there for older papers that report it; the length ratio (hypothesis over reference
words, sacreBLEU's ``sys_len / ref_len``) and the stop reasons say whether a bad score comes
from translations cut short by ``max_len`` or ended early.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF

from seq2seq.data import load_corpus
from seq2seq.errors import Seq2SeqError
from seq2seq.fileio import atomic_write_text
from seq2seq.search import SearchConfig
from seq2seq.translate import Translation, Translator


def evaluate_split(
    run_dir: str | Path,
    data: str | None = None,
    split: str = "test",
    search: SearchConfig | None = None,
    *,
    src: str | None = None,
    tgt: str | None = None,
    test_split: str | None = None,
    max_tokens: int | None = None,
    device: str = "cpu",
    hyp_file: str | Path | None = None,
) -> dict[str, Any]:
    """Translate ``split`` of a corpus and score it; write the hypotheses and the scores.

    Corpus, languages and test split default to the run's config (``data.*``), the search
    to its ``decode`` section. Hypotheses go to ``hyp_file`` (default
    ``RUN_DIR/hyps.{split}.{tgt}.txt``), one line per pair, and the returned scores as
    JSON beside it (``.json`` in place of the suffix).
    """
    translator = Translator.from_run(run_dir, device)
    d = translator.config.data
    data, src, tgt = data or d.data, src or d.src, tgt or d.tgt
    corpus = load_corpus(data, src, tgt, test_split or d.test_split, d.carve_valid, d.carve_test)
    pairs = corpus.splits.get(split)
    if not pairs:
        raise Seq2SeqError(
            f"{corpus.source_description} has no pairs in split '{split}'; "
            f"splits: {', '.join(corpus.splits)}"
        )
    search = search or translator.search_config()
    results = translator.translate([s for s, _ in pairs], search, max_tokens)
    hyps = [r[0].text for r in results]
    refs = [t for _, t in pairs]

    scores = score(hyps, refs)
    hyp_path = Path(hyp_file) if hyp_file else Path(run_dir) / f"hyps.{split}.{tgt}.txt"
    scores_path = _scores_path(hyp_path)
    report = {
        "run": str(run_dir),
        "data": corpus.source_description,
        "split": split,
        "sentences": len(pairs),
        "search": dataclasses.asdict(search),
        **scores,
        "stop_reasons": stop_reason_shares(results),
        "hyp_file": str(hyp_path),
        "scores_file": str(scores_path),
    }
    atomic_write_text(hyp_path, "".join(h + "\n" for h in hyps))
    atomic_write_text(scores_path, json.dumps(report, indent=2) + "\n")
    return report


def score(hyps: list[str], refs: list[str]) -> dict[str, Any]:
    """BLEU, chrF and lowercased BLEU with their signatures, and the length ratio."""
    out: dict[str, Any] = {}
    for name, metric in (
        ("bleu", BLEU()),
        ("chrf", CHRF()),
        ("bleu_lowercase", BLEU(lowercase=True)),
    ):
        result = metric.corpus_score(hyps, [refs])
        out[name] = round(result.score, 2)
        out[f"{name}_text"] = str(result)
        out[f"{name}_signature"] = str(metric.get_signature())
        if name == "bleu":
            out["sys_len"], out["ref_len"] = result.sys_len, result.ref_len
            out["length_ratio"] = round(result.sys_len / max(result.ref_len, 1), 4)
    return out


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
    return "\n".join(
        [
            f"{report['data']}, split {report['split']}: {report['sentences']} sentences, {how}",
            report["bleu_text"],
            f"  signature {report['bleu_signature']}",
            report["chrf_text"],
            f"  signature {report['chrf_signature']}",
            f"lowercased {report['bleu_lowercase_text']}",
            f"  signature {report['bleu_lowercase_signature']}",
            f"length ratio hyp/ref {report['length_ratio']:.3f} "
            f"({report['sys_len']} / {report['ref_len']} words)",
            f"stop reasons: {stops}",
            f"hypotheses: {report['hyp_file']}",
            f"scores: {report['scores_file']}",
        ]
    )


def _scores_path(hyp_path: Path) -> Path:
    if hyp_path.suffix == ".json":
        return hyp_path.with_name(hyp_path.name + ".scores.json")
    return hyp_path.with_suffix(".json")
