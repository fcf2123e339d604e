"""Word alignments from cross-attention against those from influence, and each against a
small gold alignment made by hand: per decoder layer (the mean over its heads), per head, and
the mean over every layer and head.

For each pair of a source file and its references (default: the 24 Multi30k de-en validation
pairs of ``gold.de`` / ``gold.en``), teacher-forced on the reference: the word-level maps
``seq2seq align`` reads (``seq2seq.inspect.alignment``), EOS left out. Each target word is
linked to its most attended source word in each attention map, and to its most influential one
(occlusion). For each map: the share of target words whose attention link is the influence
link (rows where influence is a tie, within the precision's threshold, left out), and AER,
precision and recall against ``gold.align``; the same for influence, and for a baseline that
knows no model, the diagonal (target word j linked to source word round(j (Ws - 1) / (Wt - 1))).

    python experiments/alignment/run.py --run runs/align-deen --json experiments/results/alignment_deen.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from seq2seq.decoding.translate import Translator
from seq2seq.inspect import alignment
from seq2seq.inspect.influence import tie_nats, tied_columns
from seq2seq.run.runlog import machine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/, for common
from common import model_used  # noqa: E402

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a trained run directory")
    p.add_argument("--src", type=Path, default=HERE / "gold.de")
    p.add_argument("--ref", type=Path, default=HERE / "gold.en")
    p.add_argument("--gold", type=Path, default=HERE / "gold.align")
    p.add_argument("--json", type=Path, help="write the record here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sources = _lines(args.src)
    translator = Translator.from_run(args.run, "cpu")
    maps = alignment.word_maps(translator, sources, _lines(args.ref), influence=True)
    notes = [f"line {n}: {note}" for n, m in enumerate(maps, 1) for note in m.notes]
    if notes:  # the gold numbers the text's space-separated words
        raise SystemExit(f"{args.gold}: the tokenizer's words are not the text's ({notes[0]})")
    gold = alignment.parse_gold(_lines(args.gold, blank=True), len(sources))
    alignment.check_gold(gold, [(len(m.src_words), len(m.tgt_words)) for m in maps])
    tie = tie_nats(translator.dtype, translator.device)
    influence = [alignment.links_of(m, "influence") for m in maps]
    decided = [_decided_rows(m.influence, tie) for m in maps]
    config = translator.model.config
    rows = []
    for name, layer, head in _choices(config.n_dec_layers, config.n_heads):
        predicted = [alignment.links_of(m, "attention", layer, head) for m in maps]
        agreement = _agreement(predicted, influence, decided)
        rows.append({"map": name, "layer": layer, "head": head, "agreement": agreement,
                     **_scores(predicted, gold)})  # fmt: skip
    record = {
        "command": ["python", "experiments/alignment/run.py", *(argv or sys.argv[1:])],
        "run": args.run,
        "model": model_used(Path(args.run)),
        "layers": config.n_dec_layers,
        "heads": config.n_heads,
        "files": {"src": _shown(args.src), "ref": _shown(args.ref), "gold": _shown(args.gold)},
        "sentences": len(maps),
        "target_words": sum(len(m.tgt_words) for m in maps),
        "influence_ties": sum(
            len(m.tgt_words) - len(d) for m, d in zip(maps, decided, strict=True)
        ),
        "tie_nats": tie,
        "chance_agreement": float(
            np.mean([1 / len(m.src_words) for m in maps for _ in m.tgt_words])
        ),
        "environment": machine(),
        "attention": rows,
        "influence": _scores(influence, gold),
        "diagonal": _scores([_diagonal(len(m.src_words), len(m.tgt_words)) for m in maps], gold),
    }
    _print(record)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


def _lines(path: Path, blank: bool = False) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines if blank else [line for line in lines if line.strip()]


def _shown(path: Path) -> str:
    """A path as the record names it: from the repository root where it is inside it."""
    resolved = path.resolve()
    root = HERE.parents[1]
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def _choices(n_layers: int, n_heads: int) -> list[tuple[str, int | None, int | None]]:
    """Every map the command can choose: the mean of all, each layer, each head of each."""
    choices = [("mean of every layer and head", None, None)]
    choices += [(f"layer {layer}, mean of heads", layer, None) for layer in range(1, n_layers + 1)]
    choices += [
        (f"layer {layer}, head {head}", layer, head)
        for layer in range(1, n_layers + 1)
        for head in range(1, n_heads + 1)
    ]
    return choices


def _decided_rows(influence: np.ndarray, tie: float) -> set[int]:
    """The target words whose most influential source word is not a tie."""
    return {j for j, tied in enumerate(tied_columns(influence, tie)) if len(tied) == 1}


def _agreement(
    attended: list[frozenset], influential: list[frozenset], decided: list[set]
) -> float:
    """The share of target words, on rows influence decides, linked to the same source word."""
    same = total = 0
    for a, b, rows in zip(attended, influential, decided, strict=True):
        a_of, b_of = {j: i for i, j in a}, {j: i for i, j in b}
        same += sum(a_of[j] == b_of[j] for j in rows)
        total += len(rows)
    return same / total if total else float("nan")


def _scores(predicted: list[frozenset], gold: list[alignment.Gold]) -> dict:
    s = alignment.score(predicted, gold)
    return {"aer": s.aer, "precision": s.precision, "recall": s.recall, "links": s.links,
            "sure": s.sure, "possible": s.possible}  # fmt: skip


def _diagonal(n_src: int, n_tgt: int) -> frozenset:
    """Target word j linked to the source word at the same relative position."""
    scale = (n_src - 1) / (n_tgt - 1) if n_tgt > 1 else 0.0
    return frozenset((round(j * scale), j) for j in range(n_tgt))


def _print(record: dict) -> None:
    print(f"{record['sentences']} sentences, {record['target_words']} target words")
    print(f"{'map':<32}{'agrees with influence':>22}{'AER':>8}{'precision':>11}{'recall':>8}")
    for row in record["attention"]:
        print(
            f"{row['map']:<32}{row['agreement']:>22.3f}{row['aer']:>8.3f}"
            f"{row['precision']:>11.3f}{row['recall']:>8.3f}"
        )
    for name in ("influence", "diagonal"):
        r = record[name]
        print(f"{name:<32}{'':>22}{r['aer']:>8.3f}{r['precision']:>11.3f}{r['recall']:>8.3f}")


if __name__ == "__main__":
    sys.exit(main())
