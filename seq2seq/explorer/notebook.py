"""The notebook face: load a run, translate, and inspect one sentence in a cell.

``load(run)`` returns a ``LoadedRun``: ``translate`` takes a string or a list (strings back,
``Translation`` objects with ``full=True``); ``inspect`` takes one sentence and returns an
``Inspection`` holding its record (``records.sentence_records``: the translation, the attention
maps, cross and self, the influence map, the stop reason, beam search's tree), which a
notebook shows as the explorer. Its ``heatmap`` is a matplotlib figure of any kind of
attention; ``intervene`` and ``mask`` decode again under an
intervention and return an ``InterventionResult`` that shows the translation before and after.

Inline, the explorer is the page ``seq2seq attention -o page.html`` writes, inside an
``<iframe srcdoc=...>``: the page keeps its own ids, styles, scripts and keyboard, so several
explorers in one notebook cannot interfere, and nothing is fetched (no server, no widget
extension). A frame is what JupyterLab, Notebook, VS Code and Colab all run the same way; a
script inside it sets the frame's height to the page's where the frame may (same origin),
else the frame keeps ``FRAME_HEIGHT`` and scrolls.

A sentence the explorer cannot show (empty, or no subwords once tokenized, such as U+200B
alone) gives an ``Inspection`` that shows a message instead; one that stopped at max_len
shows the explorer under a message saying so.

Letters: ``L`` decoder layers, ``H`` heads, ``Tq`` target rows, ``Tk`` source columns.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from seq2seq.config import DEFAULT_DEVICE
from seq2seq.decoding.translate import Translation, Translator
from seq2seq.drawing.plotting import attention_figure
from seq2seq.errors import Seq2SeqError
from seq2seq.explorer import report
from seq2seq.explorer.page import render_page
from seq2seq.fileio import atomic_write_text
from seq2seq.inspect import records

FRAME_HEIGHT = 900  # px, until the page inside sets its own
# Inside the frame: follow the page's height. window.frameElement is null, or access throws,
# where the frame's origin is not the notebook's; the frame then scrolls.
_FIT_FRAME = """<script>
(function () {
  let frame = null;
  try { frame = window.frameElement; } catch (e) { return; }
  if (!frame) return;
  const fit = () => { frame.style.height = document.documentElement.scrollHeight + 4 + "px"; };
  new ResizeObserver(fit).observe(document.body);
  fit();
})();
</script>
"""


def load(run: str | Path, device: str = DEFAULT_DEVICE) -> LoadedRun:
    """A trained run (the directory ``seq2seq train`` wrote, or a weights file in it), ready
    to translate and inspect. ``device``: "auto" (CUDA, then MPS, then CPU), "cpu", "cuda"..."""
    return LoadedRun(Translator.from_run(run, device))


class LoadedRun:
    """A run's translator with the notebook's calls; ``translator`` serves everything else."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator

    def __repr__(self) -> str:
        c = self.translator.config
        return f"<seq2seq run {c.data.src}-{c.data.tgt} on {self.translator.device}>"

    def translate(
        self, text: str | list[str], *, beam: int | None = None, full: bool = False
    ) -> str | list[str] | Translation | list[Translation]:
        """The best translation of a string (a string), or of each string of a list (a
        list); with ``full``, ``Translation`` objects instead. ``beam``: None = the run's."""
        lines = [text] if isinstance(text, str) else list(text)
        decode = self.translator.config.decode
        if beam is not None:
            decode = decode.with_overrides(beam=beam)
        best = [hyps[0] for hyps in self.translator.translate(lines, decode)]
        found = best if full else [t.text for t in best]
        return found[0] if isinstance(text, str) else found

    def inspect(
        self,
        sentence: str,
        *,
        beam: int = 1,
        length_penalty: float | None = None,
        max_len: int | None = None,
        ban_eos: bool = False,
        words: bool = False,
        influence: bool = True,
    ) -> Inspection:
        """One sentence translated (greedy unless ``beam``; ``length_penalty``: None = the
        run's) with everything the explorer shows, under beam search its tree: see
        ``records.sentence_records`` for the options; every page intervention
        (``report.page_interventions``) is decoded too."""
        message = _unshowable(self.translator, sentence)
        if message:
            return Inspection(self, sentence, None, message)
        n_layers = self.translator.model.config.n_dec_layers
        specs = [spec.text for spec in report.page_interventions(n_layers)]
        options = {"max_len": max_len, "ban_eos": ban_eos, "words": words}
        (record,) = records.sentence_records(
            self.translator, [sentence], beam=beam, length_penalty=length_penalty,
            influence=influence, interventions=specs, **options,
        )  # fmt: skip
        return Inspection(self, sentence, record, _stop_message(record), options)


def _draw_figures_inline() -> None:
    """In IPython, show a bare ``Figure`` (no pyplot, so no ``%matplotlib inline`` hook) as
    a PNG, as ``%matplotlib inline`` would; elsewhere nothing."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
    except ImportError:  # not a notebook
        return
    shell = get_ipython()
    if shell is not None:
        select_figure_formats(shell, {"png"})


def _unshowable(translator: Translator, sentence: str) -> str | None:
    """Why the explorer cannot show ``sentence`` (``records.check_sentences``, as a sentence),
    or None."""
    try:
        records.check_sentences(translator, [sentence])
    except Seq2SeqError as e:
        said = str(e)
        return f"{said[0].upper()}{said[1:]}."
    return None


def _stop_message(record: dict) -> str | None:
    if record["stop_reason"] != "max_len":
        return None
    return (
        f"Decoding stopped at max_len ({record['max_len']} subwords) before the model chose "
        "EOS: the translation is cut there, and its last row is not an end."
    )


class Inspection:
    """One sentence as the explorer shows it: ``record`` (None when ``message`` says why
    not), and its parts by name. In a notebook it displays as the explorer."""

    def __init__(
        self,
        run: LoadedRun,
        sentence: str,
        record: dict | None,
        message: str | None,
        options: dict | None = None,
    ) -> None:
        self.run, self.source, self.record, self.message = run, sentence, record, message
        self._options = options or {}

    def _part(self, key: str):
        return None if self.record is None else self.record[key]

    @property
    def translation(self) -> str | None:
        return self._part("translation")

    @property
    def stop_reason(self) -> str | None:
        """ "eos" or "max_len"; None for a sentence that was not translated."""
        return self._part("stop_reason")

    @property
    def src_tokens(self) -> list[str] | None:
        return self._part("src_tokens")  # Tk

    @property
    def tgt_tokens(self) -> list[str] | None:
        return self._part("tgt_tokens")  # Tq

    @property
    def attention(self) -> np.ndarray | None:
        """Cross-attention of the output produced: (L, H, Tq, Tk)."""
        return self._part("weights")

    @property
    def encoder_attention(self) -> np.ndarray | None:
        """The encoder's self-attention, source over source: (Le, H, Tk, Tk)."""
        return self._part("encoder_weights")

    @property
    def decoder_attention(self) -> np.ndarray | None:
        """The decoder's masked self-attention over its inputs (``decoder_tokens``), 0 right
        of the diagonal, where the causal mask hides a later position: (L, H, Tq, Tq)."""
        return self._part("decoder_weights")

    @property
    def decoder_tokens(self) -> list[str] | None:
        """The decoder's inputs, Tq: BOS, then the output before each step."""
        return self._part("decoder_tokens")

    @property
    def influence(self) -> np.ndarray | None:
        """What hiding each source column costs each output token, in nats: (Tq, Tk)."""
        return self._part("influence")

    @property
    def beam_tree(self) -> dict | None:
        """Beam search's tree (``seq2seq.inspect.beam_tree.tree_record``): every step's
        candidates with their scores and fate, and every hypothesis that ended, best first;
        None under greedy search. Inline, the explorer's "Beam search tree" tab draws it."""
        return self._part("tree")

    def _shown(self) -> dict:
        if self.record is None:
            raise Seq2SeqError(self.message)
        return self.record

    def heatmap(
        self, layer: int | None = None, head: int | str = "mean", kind: str = "cross"
    ) -> Figure:
        """The attention as ``seq2seq attention`` draws it: a panel per layer (or ``layer``
        alone, from 1), averaged over heads, or one ``head`` (from 1), or ``"all"``; ``kind``
        "cross", "encoder" (its self-attention) or "decoder" (its masked self-attention)."""
        options = report.drawing(self._shown(), layer or "all", head, kind)
        _draw_figures_inline()
        return attention_figure(**options)

    def intervene(self, spec: str) -> InterventionResult:
        """Greedy decoding again under ``spec``: "uniform:2" (layer 2's cross-attention made
        uniform), "permuted:all", "kept:1" (the control), "mask:3" (source column 3 hidden
        from every layer); see ``interventions.parse_spec``."""
        self._shown()
        (change,) = records.sentence_interventions(
            self.run.translator, self.source, [spec], **self._options
        )
        return InterventionResult(self.source, change)

    def mask(self, word: str) -> InterventionResult:
        """``intervene("mask:N")`` for the source column that reads ``word`` (a subword, or
        a word at word level; the first if it occurs twice)."""
        units = self._shown()["src_tokens"]
        found = [n for n, unit in enumerate(units, start=1) if unit.lstrip("\u2581") == word]
        if not found:
            whole = "" if self._options["words"] else " (inspect(..., words=True) has words)"
            raise Seq2SeqError(f"no source column reads {word!r}; the columns{whole}: {units}")
        return self.intervene(f"mask:{found[0]}")

    def page(self) -> str:
        """The explorer as a page of its own (what ``seq2seq attention -o x.html`` writes)."""
        r = self._shown()
        return render_page([r], title=report.page_title([r]))

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(Path(path), self.page())

    def _repr_html_(self) -> str:
        note = "" if self.message is None else f"<p><b>{html.escape(self.message)}</b></p>"
        if self.record is None:
            return note
        page = self.page()
        head, _, tail = page.rpartition("</body>")  # the template's own: data escapes "<"
        frame = (
            f'<iframe srcdoc="{html.escape(head + _FIT_FRAME + "</body>" + tail)}" '
            f'style="width:100%;height:{FRAME_HEIGHT}px;border:none" '
            f'title="{html.escape(report.page_title([self.record]))}"></iframe>'
        )
        return note + frame

    def __repr__(self) -> str:
        if self.record is None:
            return f"<Inspection of {self.source!r}: {self.message}>"
        r = self.record
        return (
            f"<Inspection {r['source']!r} -> {r['translation']!r}: {r['decoding']}, stopped "
            f"at {r['stop_reason']} (step {r['stop_step']}); attention {tuple(r['shape'])}>"
        )


class InterventionResult:
    """One intervention's record (``interventions.intervention_records``): the translation
    before and after, the words it changed marked."""

    def __init__(self, source: str, change: dict) -> None:
        self.source, self.record = source, change

    @property
    def before(self) -> str:
        return self.record["original"]

    @property
    def after(self) -> str:
        return self.record["translation"]

    def _sides(self, mark, text=str) -> list[tuple[str, str, str]]:
        """(name, the words as ``text`` writes them, the changed ones through ``mark``, the
        stop reason), before then after."""
        c = self.record

        def marked(words: list[str], changed: list[bool]) -> str:
            shown = (mark(text(w)) if m else text(w) for w, m in zip(words, changed, strict=True))
            return " ".join(shown)

        return [
            ("before", marked(c["original_words"], c["removed"]), c["original_stop_reason"]),
            (f"after {c['spec']}", marked(c["words"], c["changed"]), c["stop_reason"]),
        ]

    def __repr__(self) -> str:
        sides = self._sides(lambda w: f"[{w}]")
        lines = [f"  {name}: {words} (stop: {stop})" for name, words, stop in sides]
        return "\n".join([f"{self.source} (greedy; [marked]: only on one side)", *lines])

    def _repr_html_(self) -> str:
        sides = self._sides(lambda w: f"<mark>{w}</mark>", html.escape)
        rows = "".join(
            f"<tr><th>{html.escape(name)}</th><td>{words}</td><td>stop: {stop}</td></tr>"
            for name, words, stop in sides
        )
        return (
            f"<p>{html.escape(self.source)} &middot; greedy search; marked: the words only one "
            f"side has</p><table>{rows}</table>"
        )
