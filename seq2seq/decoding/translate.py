"""Translate text with a trained run: a list of sentences, or a stream of lines of any length.

``translate_ids`` decodes lists of subword ids in token-bounded batches sorted by length and
returns the best hypothesis of each in input order (the trainer's validation and the
experiments use it); ``translate_ids_nbest`` returns every hypothesis. ``Translator`` holds a
run's config, tokenizer and model. ``translate`` takes sentences and returns, per sentence,
its hypotheses as ``Translation`` objects (detokenized text plus what the search returned);
``translate_stream`` reads lines in chunks, translates each chunk, and writes the chunk's
outputs in input order before it reads on, so memory does not grow with the input and a
crash half-way leaves every finished chunk on disk. All of them take one ``DecodeConfig``.

Bad input never stops a stream. An empty line, or one the tokenizer reads as no subwords
(only characters it drops, such as U+200B or control characters), gives an empty output
line and is not fed to the model (stop reason ``empty``, which ``evaluate`` counts); a line over the model's source limit (``max_positions - 1`` subwords, room
for EOS) is cut there with a warning naming it; unseen characters become byte pieces (the
tokenizer's byte fallback); invalid UTF-8 is decoded with U+FFFD replacement characters,
with one warning for the first such line.

Output formats: one line per input line (the best hypothesis) when ``nbest == 1``; with
``nbest > 1``, every hypothesis on its own line as ``INDEX ||| SCORE ||| TEXT`` (the
fairseq / Moses n-best layout): INDEX counts input lines from 0, SCORE is what the search
ranked by (log-prob over the GNMT length penalty), best first. An empty input line gives
one line ``INDEX ||| 0.0000 ||| `` there.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

import torch
from torch import Tensor
from tqdm import tqdm

from seq2seq.config import DEFAULT_DEVICE, Config, DecodeConfig
from seq2seq.data.batching import batches_of, collate
from seq2seq.decoding.load import load_run
from seq2seq.decoding.search import Hypothesis, translate_batch
from seq2seq.errors import Seq2SeqError
from seq2seq.model.transformer import Seq2Seq
from seq2seq.run.precision import autocast, autocast_dtype, matmul_precision
from seq2seq.run.runtime import setup_runtime

CHUNK_LINES = 1000  # lines read, translated and written at a time by translate_stream


@dataclass
class Translation:
    """One hypothesis for one input line, detokenized.

    ``stop_reason`` is the search's ("eos" | "max_len"), or "empty" for an input line of
    no subwords, which is not translated (no tokens, score 0).
    """

    text: str
    tokens: list[int]  # output ids, without BOS and the final EOS
    score: float  # sum of log-probs
    normalized_score: float  # what the search ranked by
    stop_reason: str
    src_len: int  # source subwords the encoder saw, EOS included; 0 for an empty line
    truncated: bool = False  # the source was cut to the model's limit
    attention: Tensor | None = None  # (L, H, Tq, src_len) when the search was asked for weights


def translate_ids(
    model: Seq2Seq,
    src_ids: list[list[int]],
    decode: DecodeConfig,
    *,
    device: torch.device,
    dtype: torch.dtype | None = None,
    need_weights: bool = False,
) -> list[Hypothesis]:
    """The best hypothesis for each source, in input order (see ``translate_ids_nbest``)."""
    found = translate_ids_nbest(
        model, src_ids, decode, device=device, dtype=dtype, need_weights=need_weights
    )
    return [hyps[0] for hyps in found]


def translate_ids_nbest(
    model: Seq2Seq,
    src_ids: list[list[int]],
    decode: DecodeConfig,
    *,
    device: torch.device,
    dtype: torch.dtype | None = None,
    need_weights: bool = False,
) -> list[list[Hypothesis]]:
    """Up to ``decode.nbest`` hypotheses for each source, best first, in input order.

    ``src_ids`` are subword ids without EOS (``collate`` appends it), none empty. They are
    decoded in batches of at most ``decode.max_tokens`` source tokens, padding included,
    sorted by length, under autocast to ``dtype`` (None = the model's own precision).
    """
    decode.check()
    out: list[list[Hypothesis]] = [[] for _ in src_ids]
    for index in batches_of(src_ids, None, decode.max_tokens):
        src = collate([src_ids[i] for i in index], None).src.to(device)  # (B, S)
        with autocast(device, dtype):
            found = translate_batch(model, src, decode, need_weights=need_weights)
        for i, hyps in zip(index, found, strict=True):
            out[i] = hyps
    return out


def warn(message: str) -> None:
    tqdm.write(f"warning: {message}", file=sys.stderr)  # above a progress bar, if one is shown


class DecodeProgress:
    """A bar on stderr for long decoding: sentences done, and output subwords per second.

    Shown only when ``enabled`` and stderr is a terminal: in a log file a bar is a stream of
    carriage returns. Standard output, where the translations go, never sees it."""

    def __init__(self, total: int | None, enabled: bool = True) -> None:
        shown = enabled and sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="sent", file=sys.stderr, disable=not shown, leave=False)
        self.tokens = 0

    def update(self, sentences: int, tokens: int) -> None:
        if self.bar.disable:
            return
        self.tokens += tokens
        rate = self.tokens / max(self.bar.format_dict["elapsed"], 1e-9)
        self.bar.set_postfix_str(f"{rate:,.0f} tok/s", refresh=False)
        self.bar.update(sentences)

    def close(self) -> None:
        self.bar.close()


class Translator:
    """A trained run ready to translate: config, tokenizer, model (eval mode) and device."""

    def __init__(self, config: Config, tokenizer, model, device: torch.device) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        self.device = device
        # The precision the run validated with, where the hardware has it.
        self.dtype = autocast_dtype(config.train.precision, device)

    @contextlib.contextmanager
    def numerics(self) -> Iterator[None]:
        """The precision the run validated with, inside this block: its autocast, and on CUDA
        its TF32 matrix multiplies on or off (the process's switch as it was after)."""
        tf32 = matmul_precision(self.config.train.precision, self.device)
        with tf32, autocast(self.device, self.dtype):
            yield

    @classmethod
    def from_run(cls, run_dir: str | Path, device: str = DEFAULT_DEVICE) -> Translator:
        resolved = setup_runtime(device).device
        config, tokenizer, model = load_run(run_dir, resolved)
        return cls(config, tokenizer, model, resolved)

    @property
    def max_src_len(self) -> int:
        """Source subwords the model takes, leaving room for EOS."""
        return self.model.config.max_positions - 1

    def translate(
        self,
        lines: list[str],
        decode: DecodeConfig | None = None,
        *,
        first_line: int = 1,
        need_weights: bool = False,
        progress: DecodeProgress | None = None,
    ) -> list[list[Translation]]:
        """The hypotheses of every line, best first, in input order.

        ``decode`` defaults to the run's ``decode`` section. ``first_line`` is the number of
        ``lines[0]`` in warnings; ``need_weights`` keeps each hypothesis' cross-attention;
        ``progress`` is told of every batch done.
        """
        decode = decode or self.config.decode
        decode.check()
        ids = self.tokenizer.encode_batch(list(lines), "src")
        results: list[list[Translation]] = [[_empty()] for _ in ids]
        todo = [i for i, x in enumerate(ids) if x]  # empty lines are not fed to the model
        truncated = set()
        for i in todo:
            if len(ids[i]) > self.max_src_len:
                warn(
                    f"line {first_line + i}: {len(ids[i])} subwords, cut to the model's "
                    f"limit of {self.max_src_len}"
                )
                ids[i] = ids[i][: self.max_src_len]
                truncated.add(i)
        sources = [ids[i] for i in todo]
        found: list[list[Hypothesis]] = [[] for _ in todo]
        # For a progress bar, one search per batch: the batches the search would make itself
        # (whole length-sorted batches re-sort into themselves), so the outputs are the same.
        whole = [list(range(len(todo)))]
        groups = whole if progress is None else batches_of(sources, None, decode.max_tokens)
        for group in groups:
            with self.numerics():
                searched = self._search([sources[k] for k in group], decode, need_weights)
            for k, hyps in zip(group, searched, strict=True):
                found[k] = hyps
            if progress is not None:
                progress.update(len(group), sum(len(found[k][0].tokens) for k in group))
        if progress is not None:
            progress.update(len(lines) - len(todo), 0)  # empty lines, done without the model
        for i, hyps in zip(todo, found, strict=True):
            results[i] = [self._translation(h, len(ids[i]) + 1, i in truncated) for h in hyps]
        return results

    def _search(
        self, src_ids: list[list[int]], decode: DecodeConfig, need_weights: bool
    ) -> list[list[Hypothesis]]:
        """The search behind ``translate``; another engine (``seq2seq.decoding.export``) replaces it."""
        return translate_ids_nbest(
            self.model,
            src_ids,
            decode,
            device=self.device,
            dtype=self.dtype,
            need_weights=need_weights,
        )

    def translate_stream(
        self,
        lines: Iterable[str],
        out: TextIO,
        decode: DecodeConfig | None = None,
        *,
        chunk_lines: int = CHUNK_LINES,
        verbose: TextIO | None = None,
        progress: DecodeProgress | None = None,
    ) -> int:
        """Translate ``lines`` chunk by chunk into ``out`` (flushed after every chunk);
        returns the number of lines. ``verbose``: where to describe every hypothesis."""
        decode = decode or self.config.decode
        n_done = 0
        chunk: list[str] = []

        def flush() -> None:
            results = self.translate(
                chunk,
                decode,
                first_line=n_done + 1,
                need_weights=verbose is not None,
                progress=progress,
            )
            out.write(format_translations(results, n_done, decode.nbest > 1))
            out.flush()
            if verbose is not None:
                for i, hyps in enumerate(results):
                    for rank, hyp in enumerate(hyps, start=1):
                        rank_text = f" hypothesis {rank}" if decode.nbest > 1 else ""
                        verbose.write(describe(hyp, f"{n_done + i + 1}{rank_text}") + "\n")
                verbose.flush()

        for line in lines:
            chunk.append(line)
            if len(chunk) == chunk_lines:
                flush()
                n_done += len(chunk)
                chunk = []
        if chunk:
            flush()
            n_done += len(chunk)
        return n_done

    def _translation(self, hyp: Hypothesis, src_len: int, truncated: bool) -> Translation:
        return Translation(
            text=one_line(self.tokenizer.decode(hyp.tokens, "tgt")),
            tokens=hyp.tokens,
            score=hyp.score,
            normalized_score=hyp.normalized_score,
            stop_reason=hyp.stop_reason,
            src_len=src_len,
            truncated=truncated,
            attention=hyp.attention,
        )


def _empty() -> Translation:
    return Translation(
        text="", tokens=[], score=0.0, normalized_score=0.0, stop_reason="empty", src_len=0
    )


def one_line(text: str) -> str:
    """Byte pieces can decode to line breaks; they would break the line alignment."""
    return text.replace("\r", " ").replace("\n", " ")


def format_translations(results: list[list[Translation]], first_index: int, nbest: bool) -> str:
    """Output lines: the best text per input, or ``INDEX ||| SCORE ||| TEXT`` per hypothesis."""
    if not nbest:
        return "".join(hyps[0].text + "\n" for hyps in results)
    return "".join(
        f"{first_index + i} ||| {hyp.normalized_score:.4f} ||| {hyp.text}\n"
        for i, hyps in enumerate(results)
        for hyp in hyps
    )


def describe(hyp: Translation, line: int | str) -> str:
    """What the decoder saw and did for one hypothesis, for ``--verbose``.

    The attention shapes are those of the weights the decoder returned: ``Tq`` counts its
    steps (the EOS step included), ``Tk`` the source subwords (EOS included)."""
    if hyp.stop_reason == "empty":
        return (
            f"line {line}: no subwords (empty, or characters the tokenizer drops), not translated"
        )
    eos = " + EOS" if hyp.stop_reason == "eos" else ""
    cut = ", cut to the model's limit" if hyp.truncated else ""
    text = (
        f"line {line}: source Tk={hyp.src_len} subwords incl. EOS{cut}; "
        f"output {len(hyp.tokens)} subwords{eos}; stop {hyp.stop_reason}"
    )
    if hyp.attention is not None:
        n_heads = hyp.attention.shape[1]
        shapes = " ".join(f"[{w.shape[1]}, {w.shape[2]}]" for w in hyp.attention)
        text += f"; cross-attention [Tq, Tk] per layer ({n_heads} heads each): {shapes}"
    return text


def read_lines(raw_lines: Iterable[bytes]) -> Iterator[str]:
    """Lines (bytes, as read from a binary file) without their line ends, decoded as UTF-8.

    Bytes that are not UTF-8 become U+FFFD, with one warning for the first such line.
    Binary reading splits at ``\\n`` only (not at U+2028 and friends), so output lines
    stay aligned with ``wc -l``."""
    warned = False
    for number, raw in enumerate(raw_lines, start=1):
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            if not warned:
                warn(
                    f"line {number}: invalid UTF-8, decoded with replacement characters "
                    "(later such lines are not reported)"
                )
                warned = True
            yield raw.decode("utf-8", errors="replace")


def prompted(stream: BinaryIO, prompt: TextIO) -> Iterator[bytes]:
    """The lines of a terminal, each read after a ``> `` prompt; Ctrl-D (end of input) ends them."""
    while True:
        prompt.write("> ")
        prompt.flush()
        raw = stream.readline()
        if not raw:
            prompt.write("\n")
            return
        yield raw


def translate_files(
    translator: Translator,
    decode: DecodeConfig,
    *,
    texts: list[str] | None = None,
    input_path: Path | None = None,
    output_path: Path | None = None,
    verbose: bool = False,
    progress: bool = False,
) -> int:
    """``seq2seq translate``: ``texts``, else the lines of ``input_path``, else standard
    input (a ``> `` prompt per line when it is a terminal), into ``output_path`` or standard
    output; returns the number of lines. ``progress``: a bar on stderr when it is a terminal,
    for a file or piped input whose translations do not go to the terminal themselves.

    ``output_path`` is written in place, chunk by chunk, not through a temporary file: a
    crash half-way keeps the lines already written, and a rerun can skip them.
    """
    stdin = sys.stdin
    interactive = not texts and input_path is None and stdin.isatty()
    with contextlib.ExitStack() as stack:
        if texts:
            lines: Iterable[str] = texts
        elif input_path is not None:
            try:
                lines = read_lines(stack.enter_context(open(input_path, "rb")))  # noqa: SIM115
            except OSError as e:
                raise Seq2SeqError(f"cannot read {input_path}: {e.strerror or e}") from None
        else:
            raw = stdin.buffer
            lines = read_lines(prompted(raw, sys.stderr) if interactive else raw)
        out = sys.stdout
        if output_path is not None:
            try:
                out = stack.enter_context(open(output_path, "w", encoding="utf-8"))  # noqa: SIM115
            except OSError as e:
                raise Seq2SeqError(f"cannot write {output_path}: {e.strerror or e}") from None
        shown = progress and not (texts or interactive or verbose or out.isatty())
        total = _count_lines(input_path) if shown and input_path is not None else None
        bar = stack.enter_context(contextlib.closing(DecodeProgress(total, shown)))
        return translator.translate_stream(
            lines,
            out,
            decode,
            chunk_lines=1 if interactive else CHUNK_LINES,
            verbose=sys.stderr if verbose else None,
            progress=bar,
        )


def _count_lines(path: Path) -> int:
    """Lines as ``read_lines`` sees them: split at ``\\n``, a last one without it counted."""
    with open(path, "rb") as f:
        return sum(1 for _ in f)
