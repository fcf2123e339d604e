"""Decoding speed: generated tokens/s on one fixed batch, A/B interleaved, median of repeats.

Cases, each at every output length N (EOS banned, so every output has exactly N tokens):

- greedy with the KV cache vs recomputing the prefix (``use_cache=False``): goal >= 4x at
  N = 64;
- greedy and beam 5 vs Hugging Face ``MarianMTModel.generate`` on a randomly initialised
  model of the same size (no download; ``min_new_tokens = max_new_tokens = N``): goals
  >= 2x greedy, >= 4x beam 5;
- greedy with cross-attention weights returned vs without: goal <= 1.1x slowdown;
- with ``--thread-ab A,B``: greedy and beam on A torch threads vs on B (no goal: the rows
  that choose the decoding default, run once on an idle machine and once beside a busy one);
- with ``--ctranslate2``: greedy and beam vs the run exported to CTranslate2 (float32 and
  int8, exported here into a temporary directory) on the same sentences and lengths, at
  each of ``--ct2-threads`` (ours on as many torch threads); then the test BLEU of each
  engine with the run's own decoding settings (EOS and max_len), greedy and beam: goal
  int8 within 0.3 BLEU of float32.

The batch is the first ``--sentences`` source sentences of the Multi30k test split,
tokenized with the run's tokenizer; both sides run in fp32 on ``--threads`` threads. Each
repeat times A and B back to back, alternating which goes first, after one warm-up call
each, so a change in machine load hits both. Run it on an otherwise idle machine:

    python experiments/bench_decode.py --run runs/de-en --json bench_decode.json
    python experiments/bench_decode.py --run RUN --quick   # proves it runs; numbers mean nothing
    python experiments/bench_decode.py --run runs/de-en --ctranslate2 --json bench_ct2.json

``--json`` writes the results with the machine and the model (``experiments.common.model_used``)
they were measured on; ``--json experiments/results/NAME/benchmark.json`` makes them a record
that ``python -m experiments.records render`` turns into a speed table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from experiments.common import model_used  # noqa: E402
from experiments.records.speed import bleu_table, cases_table  # noqa: E402
from seq2seq.config import DecodeConfig  # noqa: E402
from seq2seq.data.batching import collate  # noqa: E402
from seq2seq.data.corpora import load_corpus  # noqa: E402
from seq2seq.decoding.evaluate import bleu_tokenize, score  # noqa: E402
from seq2seq.decoding.load import load_run  # noqa: E402
from seq2seq.decoding.search import translate_batch  # noqa: E402
from seq2seq.decoding.translate import Translator  # noqa: E402
from seq2seq.run.runlog import machine  # noqa: E402
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID  # noqa: E402


def marian_like(model_config, device: torch.device):
    """A randomly initialised ``MarianMTModel`` of the same size as ours."""
    from transformers import MarianConfig, MarianMTModel

    c = model_config
    config = MarianConfig(
        vocab_size=c.tgt_vocab_size,
        d_model=c.d_model,
        encoder_layers=c.n_enc_layers,
        decoder_layers=c.n_dec_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        max_position_embeddings=c.max_positions,
        activation_function="relu",
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
    )
    torch.manual_seed(0)
    return MarianMTModel(config).to(device).eval()


def timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def interleaved(a, b, repeats: int, device: torch.device) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, timed in alternating order after a warm-up."""
    a(), b()
    times_a, times_b = [], []
    for r in range(repeats):
        pair = [(a, times_a), (b, times_b)]
        for fn, times in pair if r % 2 == 0 else pair[::-1]:
            times.append(timed(fn, device))
    return statistics.median(times_a), statistics.median(times_b)


def ct2_speed_cases(args, model_dir: Path, tokenizer, ids, lengths, ours, case) -> None:
    """Our greedy and beam vs CTranslate2 float32 and int8 on the same forced lengths, at
    each thread count; ``ours(n, **settings)`` and ``case`` are ``main``'s."""
    import ctranslate2

    eos = tokenizer.pieces([EOS_ID], "src")[0]
    sources = [tokenizer.pieces(x, "src") + [eos] for x in ids]

    def forced(translator, n: int, beam: int) -> Callable[[], object]:
        return lambda: translator.translate_batch(
            sources,
            beam_size=beam,
            max_input_length=0,
            max_decoding_length=n,
            min_decoding_length=n,
        )

    for threads in (int(t) for t in args.ct2_threads.split(",")):
        torch.set_num_threads(threads)
        for kind in ("float32", "int8"):
            ct2 = ctranslate2.Translator(
                str(model_dir / kind), device=args.device, inter_threads=1, intra_threads=threads
            )
            for n in lengths:
                for beam in (1, args.beam):
                    search = "greedy" if beam == 1 else f"beam {beam}"
                    name = f"{search} N={n}, {threads} thread(s): ours vs CTranslate2 {kind}"
                    case(name, ours(n, beam=beam), forced(ct2, n, beam), "-", None, n)
    torch.set_num_threads(args.threads)


def ct2_bleu(args, config, model_dir: Path) -> list[dict]:
    """Test BLEU of ours and of each export, greedy and beam, with the run's decoding rule."""
    from seq2seq.decoding.export import CTranslate2Translator

    corpus = load_corpus(args.data, config.data.src, config.data.tgt, config.data.test_split)
    sources, refs = zip(*corpus.splits["test"], strict=True)
    tokenize = bleu_tokenize(config.data.tgt)
    engines = {
        "ours (PyTorch)": Translator.from_run(args.run, args.device),
        **{
            f"CTranslate2 {kind}": CTranslate2Translator.from_export(
                model_dir / kind, args.device, threads=args.threads
            )
            for kind in ("float32", "int8")
        },
    }
    rows = []
    for beam in (1, args.beam):
        decode = config.decode.with_overrides(beam=beam, nbest=1)
        for name, engine in engines.items():
            texts = [hyps[0].text for hyps in engine.translate(list(sources), decode)]
            bleu = score(texts, list(refs), tokenize)["bleu"]
            rows.append({"engine": name, "beam": beam, "bleu": bleu})
            print(f"  BLEU {name} beam {beam}: {bleu}", file=sys.stderr, flush=True)
        f32, int8 = rows[-2]["bleu"], rows[-1]["bleu"]
        rows[-1]["goal"] = "within 0.3 of float32"
        rows[-1]["pass"] = abs(int8 - f32) <= 0.3
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run", type=Path, default=REPO_ROOT / "runs" / "de-en", help="run directory"
    )
    parser.add_argument(
        "--data", default="multi30k", help="corpus with a test split (default: %(default)s)"
    )
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--lengths", default="32,64", help="forced output lengths, comma-separated")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="8 sentences, lengths 4,8, 3 repeats")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--ctranslate2", action="store_true", help="add the CTranslate2 rows and test BLEU"
    )
    parser.add_argument("--ct2-threads", default="1,2", help="thread counts for those rows")
    parser.add_argument(
        "--thread-ab", metavar="A,B", help="add rows: ours on A torch threads vs on B"
    )
    args = parser.parse_args()
    if args.quick:
        args.sentences, args.lengths, args.repeats = 8, "4,8", 3
    lengths = [int(n) for n in args.lengths.split(",")]
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    config, tokenizer, model = load_run(args.run, device)
    pairs = load_corpus(args.data, config.data.src, config.data.tgt).splits["test"][
        : args.sentences
    ]
    limit = config.model.max_positions - 1
    ids = [x[:limit] for x in tokenizer.encode_batch([s for s, _ in pairs], "src")]
    src = collate(ids, None).src.to(device)  # (B, S)
    reference = marian_like(config.model, device)
    n_sentences = src.shape[0]

    def ours(n: int, need_weights: bool = False, **settings) -> Callable[[], object]:
        decode = DecodeConfig(max_len_a=0.0, max_len_b=n, ban_eos=True, **settings)
        return lambda: translate_batch(model, src, decode, need_weights=need_weights)

    def theirs(n: int, beam: int) -> Callable[[], object]:
        def run() -> object:
            with torch.inference_mode():
                return reference.generate(
                    input_ids=src,
                    attention_mask=src != PAD_ID,
                    num_beams=beam,
                    do_sample=False,
                    max_new_tokens=n,
                    min_new_tokens=n,
                    use_cache=True,
                )

        return run

    rows = []

    def case(
        name: str, a, b, goal: str, check: Callable[[float], bool] | None, n: int, slowdown=False
    ):
        """``a`` is ours; ratio = a's speed over b's (or b's over a's for a slowdown)."""
        t_a, t_b = interleaved(a, b, args.repeats, device)
        tokens = n_sentences * n
        ours_rate, ref_rate = tokens / t_a, tokens / t_b
        ratio = ref_rate / ours_rate if slowdown else ours_rate / ref_rate
        rows.append(
            {
                "case": name,
                "ours_tok_s": round(ours_rate, 1),
                "reference_tok_s": round(ref_rate, 1),
                "ratio": round(ratio, 2),
                "goal": goal,
                "pass": None if check is None else bool(check(ratio)),
            }
        )
        print(f"  {name}: {ratio:.2f}x", file=sys.stderr, flush=True)

    for n in lengths:
        case(
            f"greedy N={n}: cache vs no cache",
            ours(n),
            ours(n, use_cache=False),
            ">= 4x" if n >= 64 else "(>= 4x at 64)",
            (lambda r: r >= 4) if n >= 64 else None,
            n,
        )
        case(
            f"greedy N={n}: ours vs HF Marian", ours(n), theirs(n, 1), ">= 2x", lambda r: r >= 2, n
        )
        case(
            f"beam {args.beam} N={n}: ours vs HF Marian",
            ours(n, beam=args.beam),
            theirs(n, args.beam),
            ">= 4x",
            lambda r: r >= 4,
            n,
        )
        case(
            f"greedy N={n}: weights returned vs not (slowdown)",
            ours(n, need_weights=True),
            ours(n),
            "<= 1.1x",
            lambda r: r <= 1.1,
            n,
            slowdown=True,
        )

    if args.thread_ab:
        a_threads, b_threads = (int(t) for t in args.thread_ab.split(","))

        def on(threads: int, fn: Callable[[], object]) -> Callable[[], object]:
            return lambda: (torch.set_num_threads(threads), fn())[1]

        for n in lengths:
            for beam in (1, args.beam):
                search = "greedy" if beam == 1 else f"beam {beam}"
                fn = ours(n, beam=beam)
                name = f"{search} N={n}: {a_threads} vs {b_threads} thread(s)"
                case(name, on(a_threads, fn), on(b_threads, fn), "-", None, n)
        torch.set_num_threads(args.threads)

    bleu_rows = []
    if args.ctranslate2:
        from seq2seq.decoding.export import export_ctranslate2

        with tempfile.TemporaryDirectory() as tmp:
            for kind in ("float32", "int8"):
                export_ctranslate2(args.run, Path(tmp) / kind, kind)
            ct2_speed_cases(args, Path(tmp), tokenizer, ids, lengths, ours, case)
            bleu_rows = ct2_bleu(args, config, Path(tmp))

    table = cases_table(rows)
    if bleu_rows:
        table += "\n\n" + bleu_table(bleu_rows)
    print(table)
    if args.json:
        setup = {
            "run": str(args.run),
            "sentences": n_sentences,
            "source_len": list(src.shape),
            "lengths": lengths,
            "beam": args.beam,
            "repeats": args.repeats,
            "threads": args.threads,
            "thread_ab": args.thread_ab,
            "device": str(device),
            "quick": args.quick,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "benchmark": "decode",
            "command": ["python", *sys.argv],
            "environment": machine(),
            "model": model_used(args.run),
            "setup": setup,
            "cases": rows,
            "bleu": bleu_rows,
            "table": table,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
