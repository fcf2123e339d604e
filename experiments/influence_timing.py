"""Influence by occlusion: how long it takes for one sentence, and the share of that time
the ``S`` extra passes take; and what it adds to an explorer page.

A sentence of 20 words (or ``--sentence``) is translated greedily with the run's model,
then ``seq2seq.inspect.influence.occlude`` scores that output with each source subword hidden in
turn: ``S`` occlusions, batched into as few decoder passes as ``MAX_LOGITS`` allows. Timed,
median of ``--repeats`` after a warm-up, in alternating order so that a change in machine
load hits both: the whole ``occlude`` call, and the same call with no occlusion (the
encoder and the unmasked pass alone). The extra passes' share is ``1 - alone / whole``.
fp32 on the CPU, on ``--threads`` torch threads. Run it on an otherwise idle machine.

The page: the explorer page (``seq2seq attention -i FILE -o page.html``) of the first
``--page-sentences`` lines of ``--page-file``, in bytes, as written (the maps, influence and
the interventions every page holds), without the interventions, and without influence
either. Sizes do not depend on machine load; ``--size-only`` measures them alone.

    python experiments/influence_timing.py --run runs/de-en \
        --page-file data/multi30k/test_2016_flickr.de.gz --json experiments/influence/de-en.json
    python experiments/influence_timing.py --run RUN --quick   # proves it runs; numbers mean nothing
    python experiments/influence_timing.py --run runs/tour --size-only \
        --json experiments/influence/page_size_tour.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from experiments.bench_decode import interleaved, timed  # noqa: E402
from experiments.common import model_used  # noqa: E402
from seq2seq.decoding.load import load_run  # noqa: E402
from seq2seq.decoding.search import greedy_search  # noqa: E402
from seq2seq.decoding.translate import Translator  # noqa: E402
from seq2seq.explorer.page import render_page  # noqa: E402
from seq2seq.explorer.report import page_interventions  # noqa: E402
from seq2seq.inspect.influence import occlude  # noqa: E402
from seq2seq.inspect.records import sentence_records  # noqa: E402
from seq2seq.run.runlog import machine  # noqa: E402
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
    p.add_argument(
        "--page-file",
        type=Path,
        default=REPO_ROOT / "data/sample/train.de",
        help="source sentences of the page measured, one a line (.gz too; default: "
        "data/sample/train.de)",
    )
    p.add_argument("--page-sentences", type=int, default=10, help="lines of it (default: 10)")
    p.add_argument("--size-only", action="store_true", help="the page's size, no timing")
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args()
    if args.quick:
        args.repeats = 3
    return args


def page_sizes(run: Path, path: Path, n: int) -> dict:
    """Bytes of the explorer page of the first ``n`` lines of ``path``: as written, without
    the interventions every page holds, and without influence either."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        sentences = [line.strip() for _, line in zip(range(n), f, strict=False)]
    translator = Translator.from_run(run, "cpu")
    specs = [s.text for s in page_interventions(translator.model.config.n_dec_layers)]
    sizes = {}
    for name, influence, interventions in [
        ("maps", False, []), ("maps_influence", True, []), ("written", True, specs),
    ]:  # fmt: skip
        records = sentence_records(
            translator, sentences, beam=1, influence=influence, interventions=interventions
        )
        sizes[name] = len(render_page(records, title="page").encode("utf-8"))
    m = translator.model.config
    return {
        "file": str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path),
        "sentences": len(sentences),
        "decoding": "greedy search",
        "decoder": {"layers": m.n_dec_layers, "heads": m.n_heads},
        "interventions": specs,
        "bytes": sizes,
        "influence_share": (sizes["maps_influence"] - sizes["maps"]) / sizes["maps_influence"],
    }


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    page = page_sizes(args.run, args.page_file, args.page_sentences)
    b = page["bytes"]
    print(
        f"page of {page['sentences']} sentences: {b['written'] / 1000:.0f} kB as written; "
        f"{b['maps_influence'] / 1000:.0f} kB without its interventions, of which influence "
        f"{100 * page['influence_share']:.1f}%; {b['maps'] / 1000:.0f} kB the maps alone"
    )
    results = {"page": page, "model": model_used(args.run)}
    if not args.size_only:
        results.update(timing(args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


def timing(args: argparse.Namespace) -> dict:
    """Influence for one sentence, timed (see the module's docstring)."""
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
    return results


if __name__ == "__main__":
    sys.exit(main())
