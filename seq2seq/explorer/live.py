"""The explorer as ``seq2seq serve`` runs it: a loaded run answering a form with the explorer
page (``page.render_page``) or an intervention's JSON, within what one request may ask.

Each request's sentences (one per line) are decoded with the same code as ``seq2seq
attention`` (``records.sentence_records``); beam, length penalty, max_len and "ban EOS"
change the decoding (and beam search's tree with it), "influence" adds the occlusion map.
Bad input is a ``Seq2SeqError`` with its message on the
page (400). The model serves one request at a time, under one lock; a request may ask for at
most ``MAX_WEIGHTS`` attention weights (``Explorer.work``), and one not decoded within
``DEADLINE`` seconds, waiting for the model included, gets 503 and frees the model at the
next decoding step (``seq2seq.decoding.deadline``). The HTTP side is ``serve``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from http import HTTPStatus
from typing import TypeVar

from seq2seq.decoding.deadline import DeadlinePassed, deadline
from seq2seq.decoding.search import max_output_length
from seq2seq.decoding.translate import Translator
from seq2seq.errors import Seq2SeqError, finite_number, whole_number
from seq2seq.explorer.page import render_page
from seq2seq.inspect.records import sentence_interventions, sentence_records

T = TypeVar("T")

MAX_CHARS = 2000  # characters of text per request
MAX_SENTENCES = 10  # lines per request
# The work one request may ask for, in attention weights (``Explorer.work``): those it keeps (each
# of the beam's hypotheses, every step's, every layer's and head's; the chosen one is
# drawn on the page) and those of the passes it adds (influence: one occlusion pass per
# source position; an intervention: two greedy decodings). Each decoding step reallocates
# the self-attention cache one step longer, and glibc's malloc keeps much of what that
# frees, so resident memory grows with beam x max_len^2 besides
# (experiments/robustness/serve_load.py measures both).
MAX_BEAM = 8
MAX_LEN = 256
MAX_LENGTH_PENALTY = 10.0  # DecodeConfig's bound: beyond it ((5 + len) / 6) ** alpha overflows
MAX_WEIGHTS = 1 << 20
DEADLINE = 60.0  # seconds a request may wait for the model and decode
TITLE = "Attention explorer"


def _number(form: dict, key: str, largest: int) -> int | None:
    text = form.get(key, "").strip()
    if not text:
        return None
    value = whole_number(text)
    if value is None or not 1 <= value <= largest:
        raise Seq2SeqError(f"{key} must be a whole number from 1 to {largest}, got '{text[:20]}'")
    return value


def _length_penalty(form: dict) -> float | None:
    text = form.get("length_penalty", "").strip()
    if not text:
        return None
    value = finite_number(text)
    if value is None or abs(value) > MAX_LENGTH_PENALTY:
        raise Seq2SeqError(
            f"length_penalty must be a number from -{MAX_LENGTH_PENALTY:g} to "
            f"{MAX_LENGTH_PENALTY:g}, got '{text[:20]}'"
        )
    return value


class Explorer:
    """A loaded run, the one lock its model is used under, and how long a request may take
    (``deadline`` seconds from its arrival, waiting for the lock included)."""

    def __init__(self, translator: Translator, deadline: float = DEADLINE) -> None:
        self.translator = translator
        self.lock = threading.Lock()
        self.deadline = deadline

    def page(self, form: dict[str, str]) -> tuple[int, str]:
        """Status and page for the submitted ``form`` (field name -> value)."""
        first = "text" not in form  # the first visit: an empty form, influence ticked
        shown = {
            "text": form.get("text", ""),
            "beam": form.get("beam", ""),
            "length_penalty": form.get("length_penalty", ""),
            "max_len": form.get("max_len", ""),
            "ban_eos": bool(form.get("ban_eos")),
            "words": bool(form.get("words")),
            "influence": first or bool(form.get("influence")),
        }
        if first:
            return HTTPStatus.OK, render_page([], title=TITLE, form=shown)
        try:
            return HTTPStatus.OK, self._translate(form, shown)
        except Seq2SeqError as e:
            return HTTPStatus.BAD_REQUEST, render_page([], title=TITLE, form=shown, error=str(e))
        except DeadlinePassed:
            error = self._too_late("nothing was translated")
            return HTTPStatus.SERVICE_UNAVAILABLE, render_page(
                [], title=TITLE, form=shown, error=error
            )

    def intervention(self, form: dict[str, str]) -> tuple[int, dict]:
        """Status and JSON for the interventions panel: one sentence (``text``), one
        intervention (``spec``, as ``--intervene`` takes it), decoded as the page was
        (max_len, ban_eos, words); ``{"intervention": record}`` or ``{"error": message}``."""
        try:
            return HTTPStatus.OK, {"intervention": self._intervene(form)}
        except Seq2SeqError as e:
            return HTTPStatus.BAD_REQUEST, {"error": str(e)}
        except DeadlinePassed:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": self._too_late("nothing was decoded")}

    def _translate(self, form: dict[str, str], shown: dict) -> str:
        """The page of the form's sentences, decoded and rendered under the model's lock: a
        request's records and page, the largest things it makes, exist one at a time."""
        sentences = _sentences(form.get("text", ""))
        max_len = _number(form, "max_len", self._longest())
        beam = _number(form, "beam", MAX_BEAM)
        length_penalty = _length_penalty(form)
        influence = bool(form.get("influence"))
        k = beam or self.translator.config.decode.beam
        self._check_work(self.work(sentences, max_len, k, influence), influence)

        def task() -> str:
            records = sentence_records(
                self.translator,
                sentences,
                beam=beam,
                length_penalty=length_penalty,
                max_len=max_len,
                ban_eos=bool(form.get("ban_eos")),
                words=bool(form.get("words")),
                influence=influence,
            )
            return render_page(records, title=TITLE, form=shown)

        return self._in_time(task)

    def _intervene(self, form: dict[str, str]) -> dict:
        sentences = _sentences(form.get("text", ""))
        if len(sentences) != 1:
            raise Seq2SeqError(f"an intervention takes one sentence, got {len(sentences)}")
        spec = form.get("spec", "").strip()
        if not 0 < len(spec) <= 20:
            raise Seq2SeqError(f"name one intervention, KIND[:LAYER] or mask:N, got '{spec[:20]}'")
        max_len = _number(form, "max_len", self._longest())
        self._check_work(self.work(sentences, max_len, 1, False, decodings=2), influence=False)
        (record,) = self._in_time(
            partial(
                sentence_interventions,
                self.translator,
                sentences[0],
                [spec],
                max_len=max_len,
                ban_eos=bool(form.get("ban_eos")),
                words=bool(form.get("words")),
            )
        )
        return record

    def _longest(self) -> int:
        return min(MAX_LEN, self.translator.model.config.max_positions - 1)

    def _in_time(self, task: Callable[[], T]) -> T:
        """``task()`` under the model's lock, within ``deadline`` seconds from now: waiting
        for the lock past them, or decoding past them (checked at every decoding step),
        raises ``DeadlinePassed``, and the lock is free again."""
        end = time.monotonic() + self.deadline
        if not self.lock.acquire(timeout=self.deadline):
            raise DeadlinePassed("the model was busy until the deadline")
        try:
            with deadline(end):
                return task()
        finally:
            self.lock.release()

    def _too_late(self, what: str) -> str:
        return (
            f"busy: no answer within {self.deadline:g} seconds (waiting for the model and "
            f"decoding), so {what}; try again, or ask for less: fewer or shorter sentences, "
            "a smaller beam or max_len"
        )

    def work(
        self,
        sentences: list[str],
        max_len: int | None,
        beam: int,
        influence: bool,
        decodings: int = 0,
    ) -> int:
        """The attention weights a request may compute or keep, with each output as long as
        its length limit allows: (output x source subwords) x layers x heads, per sentence
        times the ``beam`` hypotheses kept and, under beam search, as many again for the
        search's tree (a row per beam a step), plus one occlusion pass per source subword
        with ``influence``, plus ``decodings`` more (greedy) decodings; and the chosen
        output's self-attention, source x source per encoder layer and output x output
        per decoder layer, times the heads."""
        tok, config = self.translator.tokenizer, self.translator.model.config
        decode = self.translator.config.decode
        a, b = (0.0, max_len) if max_len is not None else (decode.max_len_a, decode.max_len_b)
        weights = 0
        for sentence in sentences:
            src_len = min(len(tok.encode(sentence, "src")), self.translator.max_src_len) + 1
            tree = beam if beam > 1 else 0
            passes = beam + tree + (src_len if influence else 0) + decodings
            out_len = max_output_length(src_len, a, b, config.max_positions)
            cross = passes * out_len * src_len * config.n_dec_layers
            own = config.n_enc_layers * src_len**2 + config.n_dec_layers * out_len**2
            weights += (cross + own) * config.n_heads
        return weights

    @staticmethod
    def _check_work(weights: int, influence: bool) -> None:
        """Refuse, before decoding, a request whose ``work`` is over ``MAX_WEIGHTS``."""
        if weights > MAX_WEIGHTS:
            less = "fewer or shorter sentences, a smaller beam or max_len"
            raise Seq2SeqError(
                f"this asks for up to {weights:,} attention weights, at most {MAX_WEIGHTS:,} "
                f"at a time: send {less}{', or untick influence' if influence else ''}"
            )


def _sentences(text: str) -> list[str]:
    """The non-blank lines of a request's text, within the limits."""
    if len(text) > MAX_CHARS:
        raise Seq2SeqError(f"the text has {len(text)} characters; at most {MAX_CHARS} please")
    sentences = [line for line in text.splitlines() if line.strip()]
    if not sentences:
        raise Seq2SeqError("the text is empty: type a sentence to translate")
    if len(sentences) > MAX_SENTENCES:
        raise Seq2SeqError(f"{len(sentences)} sentences; at most {MAX_SENTENCES} at a time")
    return sentences
