"""Influence by occlusion for one sentence: how long it takes, and the share of that time
the ``S`` extra passes take (issue 35's measure).

A sentence of 20 words (or ``--sentence``) is translated greedily with the run's model,
then ``seq2seq.influence.occlude`` scores that output with each source subword hidden in
turn: ``S`` occlusions, batched into as few decoder passes as ``MAX_LOGITS`` allows. Timed,
median of ``--repeats`` after a warm-up, in alternating order so that a change in machine
load hits both: the whole ``occlude`` call, and the same call with no occlusion (the
encoder and the unmasked pass alone). The extra passes' share is ``1 - alone / whole``.
fp32 on the CPU, on ``--threads`` torch threads. Run it on an otherwise idle machine:

    python experiments/influence_timing.py --run runs/de-en --json influence_timing.json
    python experiments/influence_timing.py --run RUN --quick   # proves it runs; numbers mean nothing
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from experiments.bench_decode import interleaved, timed  # noqa: E402
from experiments.common import model_used  # noqa: E402
from seq2seq.checkpoint import load_run  # noqa: E402
from seq2seq.influence import occlude  # noqa: E402
from seq2seq.runlog import machine  # noqa: E402
from seq2seq.search import greedy_search  # noqa: E402
from seq2seq.vocab import EOS_ID  # noqa: E402

CPU = torch.device("cpu")
SENTENCE = (  # 20 words
    "Ein älterer Mann mit einem roten Hut sitzt auf einer Bank im Park und liest seiner "
    "Enkelin ein Buch vor."
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a trained run (e.g. runs/de-en)")
    p.add_argument("--sentence", default=SENTENCE, help="source sentence (default: 20 words)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls of each (default: 20)")
    p.add_argument("--quick", action="store_true", help="3 repeats: proves it runs")
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args()
    if args.quick:
        args.repeats = 3
    return args


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    config, tokenizer, model = load_run(args.run)
    src_ids = tokenizer.encode(args.sentence, "src")[: config.model.max_positions - 1]
    src = torch.tensor([src_ids + [EOS_ID]])  # (1, S)
    hyp = greedy_search(model, src)[0]  # also the warm-up of the timing below
    translate_s = statistics.median(
        timed(lambda: greedy_search(model, src), CPU) for _ in range(args.repeats)
    )
    tgt_ids = hyp.tokens + [EOS_ID] if hyp.stop_reason == "eos" else hyp.tokens
    occlusion = occlude(model, src, tgt_ids)
    whole_s, alone_s = interleaved(
        lambda: occlude(model, src, tgt_ids), lambda: occlude(model, src, tgt_ids, []),
        args.repeats, CPU,
    )  # fmt: skip
    results = {
        "sentence": args.sentence,
        "words": len(args.sentence.split()),
        "src_subwords": src.shape[1],
        "tgt_subwords": len(tgt_ids),
        "vocab": config.model.tgt_vocab_size,
        "passes": occlusion.passes,
        "translate_s": translate_s,
        "occlude_s": whole_s,
        "unmasked_pass_s": alone_s,
        "extra_passes_s": whole_s - alone_s,
        "extra_share": 1 - alone_s / whole_s,
        "threads": args.threads,
        "repeats": args.repeats,
        "quick": args.quick,
        "model": model_used(args.run),
        "machine": machine(),
    }
    print(
        f"{results['words']} words, {results['src_subwords']} source x "
        f"{results['tgt_subwords']} output subwords: influence {whole_s * 1000:.1f} ms "
        f"({occlusion.passes} decoder passes), of which the {results['src_subwords']} "
        f"occlusions {100 * results['extra_share']:.0f}%; the unmasked pass alone "
        f"{alone_s * 1000:.1f} ms; greedy translation {translate_s * 1000:.1f} ms "
        f"({args.threads} thread(s), median of {args.repeats})"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
