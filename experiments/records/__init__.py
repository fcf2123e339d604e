"""Run records in the repository, and the tables rendered from them.

A run directory (``runs/``, not committed) holds weights; a record holds the evidence
behind every figure quoted from it, small enough to commit. ``collect`` copies a finished
run's record into ``experiments/results/NAME/``:

- ``config.yaml``, ``metrics.jsonl``, ``environment.json``, ``data_summary.json``;
- every ``seq2seq evaluate`` output in the run: the scores JSON and the hypotheses
  (text files over ``GZIP_OVER`` bytes gzipped), each scores file of the weights it names as
  the run holds them now (their sha256; scores of weights trained further since are refused);
- ``record.json``: name, recipe label, seed, direction, budget, how far it trained, the
  scored weights (what they are, their validation BLEU, their sha256), and which test and
  validation scores the record holds. Never weights.

A benchmark writes its record itself: ``experiments/bench_train.py --json
experiments/results/NAME/benchmark.json`` (likewise ``bench_decode.py``).

``render`` writes ``docs/results.md`` from the committed records alone (results per
direction and recipe as mean ± sd over seeds, the goals of ``goals.yaml``, the tuning table
from validation only, the speed tables), and a compact results table between the markers
``<!-- records:results -->`` and ``<!-- /records:results -->`` of the README (or any page of
``docs/`` that holds them). ``render --check`` says whether the committed files equal the
render; a test runs it.

    python -m experiments.records collect runs/de-en de-en-s1 --recipe default
    python -m experiments.records render [--check]

Run from the repository root (``-m`` puts it on ``sys.path``).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
DOC = REPO / "docs" / "results.md"
GOALS = "goals.yaml"  # in the results folder
RECORD = "record.json"
BENCHMARK = "benchmark.json"
GZIP_OVER = 100_000  # bytes: a text file larger than this is committed gzipped


class RecordError(Exception):
    """A problem with a run or a record, said in one line."""
