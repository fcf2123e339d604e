"""How far the precision a map is computed in moves influence by occlusion, on one run: the
spread the explorer's tie thresholds (``seq2seq.inspect.influence.TIE_NATS``) come from.

For each sentence of a file: greedy search in fp32, then the occlusion map of that output
three times: under bf16 autocast, in fp32, and in float64 (a copy of the model), the reference
each lower precision is measured against (bf16 against fp32, fp32 against float64). For each
pair: the largest |difference| of a cell, per sentence (median, max) and overall, how much a
row's top-two gap moves, and in how many rows the most influential column differs.

    python experiments/influence_precision.py --run RUN [--file data/sample/train.de] [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

from seq2seq.decoding.load import load_run
from seq2seq.decoding.search import greedy_search
from seq2seq.inspect.influence import occlude
from seq2seq.run.runlog import machine
from seq2seq.vocab import EOS_ID

PAIRS = (("bf16", "fp32"), ("fp32", "float64"))  # (the map's precision, its reference)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True)
    p.add_argument("--file", default="data/sample/train.de")
    p.add_argument("--sentences", type=int, default=100)
    p.add_argument("--json", type=Path, help="write the record here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    config, tokenizer, model = load_run(args.run)
    wide = copy.deepcopy(model).double()
    text = Path(args.file).read_text(encoding="utf-8")
    lines = [x for x in text.splitlines() if x.strip()]
    found = {low: {"cell": [], "gap": [], "flips": 0} for low, _ in PAIRS}
    rows = 0
    for line in lines[: args.sentences]:
        ids = tokenizer.encode(line, "src")[: config.model.max_positions - 1]
        src = torch.tensor([ids + [EOS_ID]])  # (1, S)
        hyp = greedy_search(model, src)[0]
        tgt = hyp.tokens + [EOS_ID] if hyp.stop_reason == "eos" else hyp.tokens
        maps = {"fp32": occlude(model, src, tgt).influence.double()}  # (T, S)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            maps["bf16"] = occlude(model, src, tgt).influence.double()
        maps["float64"] = occlude(wide, src, tgt).influence
        rows += maps["fp32"].shape[0]
        for low, reference in PAIRS:
            a, b = maps[low], maps[reference]
            top = b.topk(2, dim=-1).indices  # (T, 2): the reference's two largest drops per row
            found[low]["cell"].append(float((a - b).abs().max()))
            found[low]["gap"].append(float((_gap(a, top) - _gap(b, top)).abs().max()))
            found[low]["flips"] += int((a.argmax(-1) != b.argmax(-1)).sum())
    record = {
        "command": ["python", "experiments/influence_precision.py", *(argv or sys.argv[1:])],
        "run": args.run,
        "model": {"steps": _steps(Path(args.run)), "precision": config.train.precision},
        "file": args.file,
        "sentences": len(found["fp32"]["cell"]),
        "rows": rows,
        "threads": 1,
        "environment": machine(),
        "pairs": {
            f"{low} against {reference}": {
                "largest_cell_nats": max(found[low]["cell"]),
                "median_sentence_largest_cell_nats": statistics.median(found[low]["cell"]),
                "largest_top_two_gap_move_nats": max(found[low]["gap"]),
                "rows_whose_top_column_differs": found[low]["flips"],
            }
            for low, reference in PAIRS
        },
    }
    for pair, r in record["pairs"].items():
        print(
            f"{pair}: {record['sentences']} sentences, {rows} rows: largest |difference| of a "
            f"cell per sentence median {r['median_sentence_largest_cell_nats']:.3g}, max "
            f"{r['largest_cell_nats']:.3g} nats; a row's top-two gap moved by at most "
            f"{r['largest_top_two_gap_move_nats']:.3g} nats; the most influential column "
            f"differs in {r['rows_whose_top_column_differs']} of {rows} rows"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


def _gap(influence: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """The drop of column top[:, 0] less that of top[:, 1], per row: (T, S), (T, 2) -> (T, 1)."""
    return influence.gather(1, top[:, :1]) - influence.gather(1, top[:, 1:])


def _steps(run: Path) -> int | None:
    """The step the run's weights are from, as its last validation logged it."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    valid = [row for row in map(json.loads, lines) if row.get("kind") == "valid"]
    return valid[-1]["step"] if valid else None


if __name__ == "__main__":
    sys.exit(main())
