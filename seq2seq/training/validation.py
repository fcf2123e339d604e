"""Validation during training: loss, greedy BLEU, and the cross-attention of a few sentences;
then ``Validation``, which the trainer holds: what a validation and the end of a run record,
and the weights they keep.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from sacrebleu.metrics import BLEU
from torch import nn

from seq2seq.config import Config, DecodeConfig
from seq2seq.data.batching import batches_of, collate
from seq2seq.data.prepare import Prepared
from seq2seq.decoding.evaluate import bleu_tokenize
from seq2seq.decoding.translate import translate_ids
from seq2seq.model.transformer import Seq2Seq
from seq2seq.run import checkpoint, rundir
from seq2seq.run.precision import autocast
from seq2seq.run.runlog import MetricsLog
from seq2seq.run.runtime import Runtime, barrier, gather, total
from seq2seq.training.curves import update_run_curves
from seq2seq.training.ema import WeightEMA
from seq2seq.training.optim import sequence_loss
from seq2seq.training.state import TrainState
from seq2seq.vocab import EOS_ID


@torch.inference_mode()
def validation_loss(
    model: nn.Module, data: Prepared, max_tokens: int, runtime: Runtime, dtype
) -> float:
    """Loss per target token over the validation split; several processes take a share of
    the batches each and add up. The loss is summed on the device and read once."""
    loss, tokens = torch.zeros((), device=runtime.device), 0
    batches = batches_of(data.valid_src, data.valid_tgt, max_tokens)
    for idx in batches[runtime.rank :: runtime.world]:
        batch = collate([data.valid_src[i] for i in idx], [data.valid_tgt[i] for i in idx])
        batch = batch.to(runtime.device)
        with autocast(runtime.device, dtype):
            logits = model(batch.src, batch.tgt_in, check=False)  # collate ends each in EOS
        loss += sequence_loss(logits, batch.tgt_out, 0.0)
        tokens += batch.n_tgt_tokens
    loss, tokens = total(runtime, loss.item(), tokens)
    return loss / max(tokens, 1)


def validation_bleu(
    model: Seq2Seq, data: Prepared, config: Config, runtime: Runtime, dtype
) -> float:
    """Greedy BLEU on the first ``train.valid_bleu_sentences`` validation pairs. Several
    processes decode every world-th sentence each and all score the gathered whole, so
    that every rank knows the score (and none waits long in a collective)."""
    n = min(config.train.valid_bleu_sentences, len(data.valid_src))
    mine = list(range(runtime.rank, n, runtime.world))
    hyps = translate_ids(
        model, [data.valid_src[i] for i in mine], greedy(config), device=runtime.device, dtype=dtype
    )
    shards = gather(runtime, [data.tokenizer.decode(h.tokens, "tgt") for h in hyps])
    text = [shards[i % runtime.world][i // runtime.world] for i in range(n)]
    return (
        reference_bleu(tuple(data.valid_refs[:n]), bleu_tokenize(config.data.tgt))
        .corpus_score(text, None)
        .score
    )


@functools.lru_cache(maxsize=4)
def reference_bleu(refs: tuple[str, ...], tokenize: str) -> BLEU:
    """sacreBLEU's BLEU with the statistics of ``refs`` computed once: every validation of a
    run scores against the same references, and tokenizing them took most of the scoring.
    The score is ``corpus_bleu``'s, to the bit."""
    return BLEU(tokenize=tokenize, references=[list(refs)])


def greedy(config: Config) -> DecodeConfig:
    """The run's length rule with greedy search, the cache on and EOS allowed."""
    return dataclasses.replace(config.decode, beam=1, nbest=1, ban_eos=False, use_cache=True)


def save_attention_maps(
    model: Seq2Seq, data: Prepared, config: Config, out_dir: Path, device, draw: bool = True
) -> None:
    """Cross-attention of a few fixed validation sentences: the raw weights, and with ``draw``
    their PNG grids (drawing costs more than decoding them: the trainer draws at the end)."""
    from seq2seq.drawing.plotting import (  # matplotlib only when used
        plot_attention,
        write_attention_json,
    )

    tok, n = data.tokenizer, config.train.attention_sentences
    hyps = translate_ids(
        model, data.valid_src[:n], greedy(config), device=device, need_weights=True
    )
    for i, hyp in enumerate(hyps):
        src_pieces = tok.pieces(data.valid_src[i] + [EOS_ID], "src")
        tgt_ids = hyp.tokens + ([EOS_ID] if hyp.stop_reason == "eos" else [])
        tgt_pieces = tok.pieces(tgt_ids, "tgt")
        weights = hyp.attention.float().cpu().numpy()  # (L, H, Tq, Tk)
        if draw:
            png, title = out_dir / f"sentence_{i}.png", f"validation sentence {i}"
            plot_attention(weights, src_pieces, tgt_pieces, png, heads="all", title=title)
        write_attention_json(
            weights,
            src_pieces,
            tgt_pieces,
            out_dir / f"sentence_{i}.json",
            translation=tok.decode(hyp.tokens, "tgt"),
            stop_reason=hyp.stop_reason,
            extra={"source": data.valid_sources[i]},
        )


# ---------------------------------------------------------------------------------------
# A run's validations.


@dataclasses.dataclass(eq=False)
class Validation:
    """A run's validations and its end: scores ``model`` on the validation split, counts
    patience in ``state``, and writes the weights kept (best, last k, average, moving average)
    into ``run_dir``. Every rank scores; rank 0 writes."""

    config: Config
    run_dir: Path
    runtime: Runtime
    data: Prepared
    model: Seq2Seq
    dtype: torch.dtype | None
    state: TrainState  # the trainer's counters, which a validation moves
    ema: WeightEMA  # the weights' moving average (train.ema)
    log: MetricsLog
    say: Callable[[str], None]
    elapsed: Callable[[], float]  # seconds trained, earlier segments of a resumed run included
    scores_stale: bool  # seq2seq evaluate's scores are of weights not yet replaced
    drawn_at: float | None = None  # elapsed() when curves.png was last drawn

    def finish(self) -> None:
        """The end of a run that a budget stopped (on every rank): the state it ended on
        validated, the last kept states averaged, the last state's attention maps drawn."""
        s, t = self.state, self.config.train
        if s.valid_step != s.step:
            self.validate(scheduled=False)  # the state the budget ended on is scored
        if t.average_last >= 2:
            self.try_average()
        if t.ema:
            self.try_ema()
        if t.attention_sentences and self.runtime.main:
            self.save_attention(draw=True)  # the last state's maps, drawn
        if t.save_every and self.runtime.main:  # the curves to the end, however recent
            update_run_curves(self.run_dir, self.say)
        s.finished = True

    def validate(self, scheduled: bool = True) -> None:
        """Validation loss and greedy BLEU; the best weights by BLEU become ``model.safetensors``.

        Only scheduled validations (every epoch or ``validate_every`` steps) count toward
        patience, so that a run stopped by a budget and resumed stops early exactly where
        an uninterrupted run would.
        """
        s, t, runtime = self.state, self.config.train, self.runtime
        began = time.monotonic()
        self.model.eval()
        loss = validation_loss(
            self.model, self.data, self.config.data.max_tokens, runtime, self.dtype
        )
        bleu = validation_bleu(self.model, self.data, self.config, runtime, self.dtype)
        s.valid_step = s.step
        best = bleu > s.best_bleu
        if best:
            s.best_bleu, s.best_step = bleu, s.step
        if scheduled and bleu > s.patience_best:
            s.patience_best, s.bad_validations = bleu, 0
        elif scheduled:
            s.bad_validations += 1
        if not runtime.main:  # every rank knows the scores; rank 0 writes
            self.model.train()
            return
        self.replacing_weights()
        if best:
            metadata = {"step": s.step, "bleu": bleu}
            checkpoint.save_model(self.model, self.run_dir / checkpoint.BEST_FILE, metadata)
        checkpoint.keep_weights(self.model, self.run_dir, s.step, t.keep_last, bleu)
        if t.attention_sentences:  # the weights now, the PNGs once at the end (see finish)
            self.save_attention(draw=False)
        minutes = self.elapsed() / 60
        ppl = math.exp(min(loss, 50))
        values = {"loss": loss, "ppl": ppl, "bleu": bleu, "best_bleu": s.best_bleu}
        # valid_s: what this validation cost (loss, BLEU, checkpoints, attention maps)
        timing = {"epoch": s.epoch, "elapsed_min": minutes, "valid_s": time.monotonic() - began}
        self.log.log("valid", s.step, {**values, **timing})
        if self.drawing_due():
            update_run_curves(self.run_dir, self.say)  # RUN/curves.png; never stops the run
        self.say(
            f"step {s.step} epoch {s.epoch}: valid loss {loss:.3f} ppl {ppl:.2f} BLEU {bleu:.2f} "
            f"(best {s.best_bleu:.2f} at {s.best_step}) {minutes:.1f} min"
        )
        self.model.train()

    def drawing_due(self) -> bool:
        """Whether curves.png is to be redrawn now: after every validation, or with
        ``train.save_every``, not sooner than that many seconds after the last drawing."""
        every, now = self.config.train.save_every, self.elapsed()
        if every and self.drawn_at is not None and now - self.drawn_at < every:
            return False
        self.drawn_at = now
        return True

    def save_attention(self, draw: bool) -> None:
        """Cross-attention of the first validation sentences in ``attention/step_N/``. Drawn
        only at the end of a run: drawing at every validation cost more than its BLEU."""
        out_dir = self.run_dir / "attention" / f"step_{self.state.step}"
        was_training = self.model.training
        self.model.eval()
        save_attention_maps(
            self.model, self.data, self.config, out_dir, self.runtime.device, draw=draw
        )
        self.model.train(was_training)

    def try_average(self) -> None:
        """Average the last ``average_last`` kept states; keep the average as the best model
        when its validation BLEU beats the best single state's."""
        barrier(self.runtime)  # rank 0 has written the last kept state (a shared run directory)
        kept = checkpoint.kept_checkpoints(self.run_dir)[-self.config.train.average_last :]
        if len(kept) < 2:
            return
        steps = [int(p.stem.removeprefix("step_")) for p in kept]
        self.try_weights(
            checkpoint.average_checkpoints(kept),
            kept[0],
            f"average of the states at steps {', '.join(map(str, steps))}",
            {"averaged_steps": steps},
            ("average", {"steps": steps}),
        )

    def try_ema(self) -> None:
        """The weights' moving average (``train.ema``), kept as the best model when its
        validation BLEU beats the best so far (the best state's, or the average's)."""
        decay = self.config.train.ema
        self.try_weights(
            self.ema.weights,
            self.run_dir / checkpoint.LAST_FILE,
            f"moving average of the weights (decay {decay:g})",
            {"ema": decay},
            ("ema", {"decay": decay}),
        )

    def try_weights(
        self,
        weights: dict[str, torch.Tensor],
        source: Path,
        words: str,
        metadata: dict[str, Any],
        logged: tuple[str, dict[str, Any]],
    ) -> None:
        """Validate ``weights`` (read from ``source``) in place of the trained ones; keep them
        as ``model.safetensors``, with ``metadata``, when their BLEU beats the best so far.
        ``logged``: the metrics line's kind and its facts; ``words`` name them in the log."""
        s = self.state
        trained = {k: v.clone() for k, v in self.model.state_dict().items()}
        checkpoint.load_weights_into(self.model, weights, source)
        self.model.eval()
        bleu = validation_bleu(self.model, self.data, self.config, self.runtime, self.dtype)
        better = bleu > s.best_bleu
        if better:  # every rank knows the scores, as in validate; rank 0 writes
            s.best_bleu, s.best_step = bleu, s.step
        if better and self.runtime.main:
            self.replacing_weights()
            metadata = {"step": s.step, "bleu": bleu, **metadata}
            checkpoint.save_model(self.model, self.run_dir / checkpoint.BEST_FILE, metadata)
        self.model.load_state_dict(trained)
        self.model.train()
        kind, facts = logged
        self.log.log(kind, s.step, {"bleu": bleu, **facts, "kept": better})
        self.say(
            f"{words}: validation BLEU {bleu:.2f}; "
            + ("kept as the best model" if better else "not better than the best so far")
        )

    def replacing_weights(self) -> None:
        """Called on rank 0 before it writes any weights: a resumed run's first write removes
        ``seq2seq evaluate``'s scores, which were of the weights it replaces. Not sooner, so a
        resume that fails before it has written keeps the scores of the weights it kept."""
        if self.scores_stale:
            self.scores_stale = False
            removed = rundir.clear_scores(self.run_dir)
            if removed:
                self.say(f"removed {', '.join(removed)}: scores of the weights trained further")
