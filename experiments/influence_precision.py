"""How far bf16 moves influence by occlusion from fp32, on one run: the spread the explorer's
tie threshold (``seq2seq.inspect.influence.TIE_NATS``) is derived from.

For each sentence of a file: greedy search in fp32, then the occlusion map of that output in
fp32 and again under bf16 autocast. Prints the largest |bf16 - fp32| of a cell, per sentence
(median, max) and overall, how much a row's top-two gap moves, and in how many rows the most
influential column differs between the two precisions.

    python experiments/influence_precision.py --run RUN [--file data/sample/train.de]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from seq2seq.decoding.load import load_run
from seq2seq.decoding.search import greedy_search
from seq2seq.inspect.influence import occlude
from seq2seq.vocab import EOS_ID


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True)
    p.add_argument("--file", default="data/sample/train.de")
    p.add_argument("--sentences", type=int, default=100)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    config, tokenizer, model = load_run(args.run)
    text = Path(args.file).read_text(encoding="utf-8")
    lines = [x for x in text.splitlines() if x.strip()]
    cell, gap_moved, flips, rows = [], [], 0, 0
    for line in lines[: args.sentences]:
        ids = tokenizer.encode(line, "src")[: config.model.max_positions - 1]
        src = torch.tensor([ids + [EOS_ID]])  # (1, S)
        hyp = greedy_search(model, src)[0]
        tgt = hyp.tokens + [EOS_ID] if hyp.stop_reason == "eos" else hyp.tokens
        fp32 = occlude(model, src, tgt).influence  # (T, S)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = occlude(model, src, tgt).influence
        cell.append(float((bf16 - fp32).abs().max()))
        top = fp32.topk(2, dim=-1).indices  # (T, 2): fp32's two largest drops per row
        gap_moved.append(float((_gap(bf16, top) - _gap(fp32, top)).abs().max()))
        flips += int((bf16.argmax(-1) != fp32.argmax(-1)).sum())
        rows += fp32.shape[0]
    print(
        f"{len(cell)} sentences, {rows} rows: largest |bf16 - fp32| of a cell per sentence "
        f"median {statistics.median(cell):.4f}, max {max(cell):.4f} nats; a row's top-two gap "
        f"moved by at most {max(gap_moved):.4f} nats; the most influential column differs in "
        f"{flips} of {rows} rows"
    )
    return 0


def _gap(influence: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """The drop of column top[:, 0] less that of top[:, 1], per row: (T, S), (T, 2) -> (T, 1)."""
    return influence.gather(1, top[:, :1]) - influence.gather(1, top[:, 1:])


if __name__ == "__main__":
    sys.exit(main())
