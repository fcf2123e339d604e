"""Validation during training: loss, greedy BLEU, and the cross-attention of a few sentences."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import sacrebleu
import torch
from torch import nn

from seq2seq.config import Config, DecodeConfig
from seq2seq.data.batching import batches_of, collate
from seq2seq.data.prepare import Prepared
from seq2seq.decoding.evaluate import bleu_tokenize
from seq2seq.decoding.translate import translate_ids
from seq2seq.model.transformer import Seq2Seq
from seq2seq.run.precision import autocast
from seq2seq.run.runtime import Runtime, gather, total
from seq2seq.training.optim import sequence_loss
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
    tokenize = bleu_tokenize(config.data.tgt)
    return sacrebleu.corpus_bleu(text, [data.valid_refs[:n]], tokenize=tokenize).score


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
