"""Export a run for fast inference with CTranslate2, and translate with the export.

``export_ctranslate2`` rebuilds our model as a CTranslate2 ``TransformerSpec`` (pre-norm,
ReLU, sinusoidal positions, token embeddings scaled by √D, LayerNorm eps 1e-5) from the
weights themselves, then saves it with the run's SentencePiece model(s) and ``config.yaml``
beside it, so the export directory is all ``translate --engine ctranslate2`` needs.
Grouped-query / multi-query attention (``n_kv_heads``) and MLA (``d_latent``) are refused.

``CTranslate2Translator`` is a ``Translator`` whose search is CTranslate2's
``translate_batch``: the same tokenization, truncation, output formats and stop rule. Each
sentence stops at EOS or at ``max_output_length(S)`` output tokens, ``S`` = source subwords
including the EOS appended here (as ``collate`` does); sentences are grouped by that limit
because CTranslate2 takes one ``max_decoding_length`` per call. The beam search is
CTranslate2's own, on raw log-probability sums (its length penalty off); the beams it
finishes are then re-ranked here by our GNMT penalty, ``((5 + len) / 6) ** alpha`` with EOS
counted, so beam outputs can differ from ours where the two searches keep other beams.
Cross-attention weights are not returned (``attention`` is None).

Letters: ``D`` d_model, ``V`` vocabulary.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
from torch import Tensor

from seq2seq.config import DEFAULT_DEVICE, DecodeConfig, ModelConfig
from seq2seq.data.tokenizer import JOINT_FILE, SIDE_FILES, Tokenizer
from seq2seq.decoding.beam import gnmt_length_penalty
from seq2seq.decoding.load import load_run
from seq2seq.decoding.search import Hypothesis, max_output_length
from seq2seq.decoding.translate import Translator
from seq2seq.errors import Seq2SeqError, whole_number
from seq2seq.model.transformer import Seq2Seq
from seq2seq.run.checkpoint import CONFIG_FILE, load_config_file, save_config
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

QUANTIZATIONS = ("float32", "int8_float32", "int8")
CT2_MODEL_FILE = "model.bin"  # what CTranslate2 saves; marks an export directory
LAYER_NORM_EPS = 1e-5  # torch's nn.LayerNorm default, which our layers use


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise Seq2SeqError(
            'ctranslate2 is not installed: pip install -e ".[ctranslate2]"'
        ) from None
    return ctranslate2


def check_exportable(config: ModelConfig) -> None:
    """One-line refusal for what our CTranslate2 spec cannot express."""
    if config.d_latent is not None:
        raise Seq2SeqError(
            f"cannot export to ctranslate2: MLA self-attention (model.d_latent={config.d_latent}) "
            "has no CTranslate2 equivalent"
        )
    if config.n_kv_heads not in (None, config.n_heads):
        raise Seq2SeqError(
            f"cannot export to ctranslate2: grouped-query attention (model.n_kv_heads="
            f"{config.n_kv_heads} < n_heads={config.n_heads}) is not supported by this export"
        )


def _array(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()


def _set_linear(spec, layer, rows: slice = slice(None)) -> None:
    """``spec`` = the nn.Linear ``layer``, or the output ``rows`` of it (Q of Q|K|V, K|V)."""
    spec.weight = _array(layer.weight[rows])  # (out, in)
    spec.bias = _array(layer.bias[rows])


def _set_norm(spec, norm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_ffn(spec, norm, ffn) -> None:
    _set_norm(spec.layer_norm, norm)
    _set_linear(spec.linear_0, ffn.up)
    _set_linear(spec.linear_1, ffn.down)


def _set_embedding(spec, embed) -> None:
    # The encoder takes a list of embeddings (factored input): ours is the one source.
    tokens = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    tokens.weight = _array(embed.tokens.weight)  # (V, D); scaled by √D in CTranslate2
    spec.position_encodings.encodings = _array(embed.positions)  # (max_positions, D)


def build_spec(model: Seq2Seq, tokenizer: Tokenizer):
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights and vocabulary."""
    specs = _ctranslate2().specs
    c = model.config
    check_exportable(c)
    encoder = specs.TransformerEncoderSpec(c.n_enc_layers, c.n_heads, pre_norm=True)
    decoder = specs.TransformerDecoderSpec(c.n_dec_layers, c.n_heads, pre_norm=True)
    _set_embedding(encoder, model.src_embed)
    _set_norm(encoder.layer_norm, model.encoder_norm)
    for spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
        attn = layer.self_attn
        _set_norm(spec.self_attention.layer_norm, layer.self_attn_norm)
        _set_linear(spec.self_attention.linear[0], attn.in_proj)  # Q|K|V, as CTranslate2 packs
        _set_linear(spec.self_attention.linear[1], attn.out_proj)
        _set_ffn(spec.ffn, layer.ffn_norm, layer.ffn)

    _set_embedding(decoder, model.tgt_embed)
    _set_norm(decoder.layer_norm, model.decoder_norm)
    decoder.projection.weight = _array(model.output.weight)  # the embedding when tied
    for spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
        attn, cross = layer.self_attn, layer.cross_attn
        _set_norm(spec.self_attention.layer_norm, layer.self_attn_norm)
        _set_linear(spec.self_attention.linear[0], attn.in_proj)
        _set_linear(spec.self_attention.linear[1], attn.out_proj)
        _set_norm(spec.attention.layer_norm, layer.cross_attn_norm)
        q_rows = slice(0, c.d_model)
        _set_linear(spec.attention.linear[0], cross.in_proj, q_rows)
        _set_linear(spec.attention.linear[1], cross.in_proj, slice(c.d_model, None))  # K|V
        _set_linear(spec.attention.linear[2], cross.out_proj)
        _set_ffn(spec.ffn, layer.ffn_norm, layer.ffn)

    spec = specs.TransformerSpec(encoder, decoder)
    src_vocab = tokenizer.pieces(list(range(tokenizer.src_vocab_size)), "src")
    tgt_vocab = tokenizer.pieces(list(range(tokenizer.tgt_vocab_size)), "tgt")
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    spec.config.unk_token = tgt_vocab[UNK_ID]
    spec.config.bos_token = tgt_vocab[BOS_ID]
    spec.config.eos_token = tgt_vocab[EOS_ID]
    spec.config.decoder_start_token = tgt_vocab[BOS_ID]
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    return spec


def _run_root(path: Path) -> Path:
    """The run directory of ``path``: itself, or the one above a weights file that holds the
    config (``RUN/averaged.safetensors``, ``RUN/checkpoints/step_N.safetensors``)."""
    if path.is_dir():
        return path
    return next((p for p in path.parents if (p / CONFIG_FILE).is_file()), path.parent)


def export_ctranslate2(run_dir: str | Path, out_dir: str | Path, quantization: str = "float32"):
    """Write ``run_dir``'s model as a CTranslate2 model in ``out_dir`` (which must not exist
    or be empty), with its tokenizer and config; returns ``out_dir``.

    ``run_dir`` may name a weights file inside a run, as everywhere. The export is written
    beside ``out_dir`` and renamed into place, so a failure leaves no half-written model."""
    if quantization not in QUANTIZATIONS:
        raise Seq2SeqError(
            f"unknown quantization '{quantization}' (use {', '.join(QUANTIZATIONS)})"
        )
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise Seq2SeqError(f"{out_dir} exists and is not empty: remove it or choose another -o")
    root = _run_root(Path(run_dir))
    check_exportable(load_config_file(root).model)  # refused before any weights load
    config, tokenizer, model = load_run(run_dir)
    spec = build_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    partial.chmod(0o755)  # mkdtemp's 0700 would follow the rename
    try:
        spec.save(str(partial))
        for name in (JOINT_FILE, *SIDE_FILES.values()):
            if (root / name).is_file():
                shutil.copyfile(root / name, partial / name)
        save_config(partial, config)
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        partial.rename(out_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out_dir


def _ct2_device(device: str) -> tuple[str, int]:
    """CTranslate2's (device, index) for our ``--device`` names."""
    if device == "auto":
        return ("cuda", 0) if _ctranslate2().get_cuda_device_count() > 0 else ("cpu", 0)
    if device == "cpu":
        return "cpu", 0
    if device == "cuda" or device.startswith("cuda:"):
        index = whole_number(device.partition(":")[2] or "0")
        if index is None:
            raise Seq2SeqError(f"unknown device '{device}' (use auto, cpu, cuda or cuda:N)")
        if _ctranslate2().get_cuda_device_count() <= index:
            raise Seq2SeqError(f"device '{device}' asked for, but CTranslate2 sees no such GPU")
        return "cuda", index
    raise Seq2SeqError(f"device '{device}' is not available to CTranslate2 (use cpu or cuda)")


class CTranslate2Translator(Translator):
    """A CTranslate2 export ready to translate, with ``Translator``'s interface.

    ``model`` is the ``ctranslate2.Translator``; ``threads`` its intra-op threads (0 = its
    default)."""

    def __init__(self, config, tokenizer, model, device: str) -> None:
        self.config, self.tokenizer, self.model, self.device = config, tokenizer, model, device
        self.dtype = None
        pieces = tokenizer.pieces(list(range(tokenizer.tgt_vocab_size)), "tgt")
        self._tgt_ids = {piece: i for i, piece in enumerate(pieces)}

    @classmethod
    def from_export(
        cls, export_dir: str | Path, device: str = DEFAULT_DEVICE, threads: int = 0
    ) -> CTranslate2Translator:
        export_dir = Path(export_dir)
        if not (export_dir / CT2_MODEL_FILE).is_file():
            raise Seq2SeqError(
                f"{export_dir}: not a CTranslate2 export ({CT2_MODEL_FILE} missing); "
                "make one with: seq2seq export RUN -o DIR --format ctranslate2"
            )
        config = load_config_file(export_dir)
        tokenizer = Tokenizer.load(export_dir)
        name, index = _ct2_device(device)
        model = _ctranslate2().Translator(
            str(export_dir), device=name, device_index=index, intra_threads=threads
        )
        return cls(config, tokenizer, model, name)

    @property
    def max_src_len(self) -> int:
        return self.config.model.max_positions - 1

    def _search(
        self, src_ids: list[list[int]], decode: DecodeConfig, need_weights: bool
    ) -> list[list[Hypothesis]]:
        """CTranslate2's search, one call per distinct ``max_len``; ``need_weights`` has no
        effect (the hypotheses carry no attention)."""
        del need_weights
        decode.check()
        eos = self.tokenizer.pieces([EOS_ID], "src")[0]
        never = [[p] for p in self.tokenizer.pieces([PAD_ID, BOS_ID], "tgt")]
        groups: dict[int, list[int]] = defaultdict(list)
        for i, ids in enumerate(src_ids):
            s = len(ids) + 1  # EOS included
            limit = max_output_length(
                s, decode.max_len_a, decode.max_len_b, self.config.model.max_positions
            )
            groups[limit].append(i)
        out: list[list[Hypothesis]] = [[] for _ in src_ids]
        for limit, index in groups.items():
            sources = [self.tokenizer.pieces(src_ids[i], "src") + [eos] for i in index]
            results = self.model.translate_batch(
                sources,
                max_batch_size=decode.max_tokens,
                batch_type="tokens",
                beam_size=decode.beam,
                # Every finished beam, raw log-prob sums: ranked here with our GNMT penalty
                # (CTranslate2 divides by length ** alpha instead).
                num_hypotheses=decode.beam,
                length_penalty=0.0,
                max_input_length=0,
                max_decoding_length=limit,
                min_decoding_length=limit if decode.ban_eos else 0,
                suppress_sequences=never,
                return_scores=True,
            )
            for i, result in zip(index, results, strict=True):
                hyps = [
                    self._hypothesis(tokens, score, limit, decode)
                    for tokens, score in zip(result.hypotheses, result.scores, strict=True)
                ]
                hyps.sort(key=lambda h: -h.normalized_score)
                out[i] = hyps[: decode.nbest]
        return out

    def _hypothesis(
        self, pieces: list[str], score: float, limit: int, decode: DecodeConfig
    ) -> Hypothesis:
        tokens = [self._tgt_ids[p] for p in pieces]
        stop = "max_len" if len(tokens) == limit else "eos"
        normalized = score  # greedy search ranks by the raw sum, as in search.py
        if decode.beam > 1:
            normalized = score / gnmt_length_penalty(
                len(tokens) + (stop == "eos"), decode.length_penalty
            )
        return Hypothesis(tokens=tokens, score=score, stop_reason=stop, normalized_score=normalized)


def open_translator(
    path: str | Path, device: str = DEFAULT_DEVICE, engine: str = "torch"
) -> Translator:
    """A run (``engine="torch"``) or a CTranslate2 export (``"ctranslate2"``) ready to translate."""
    if engine == "ctranslate2":
        return CTranslate2Translator.from_export(path, device)
    if engine != "torch":
        raise Seq2SeqError(f"unknown engine '{engine}' (use torch or ctranslate2)")
    if (Path(path) / CT2_MODEL_FILE).is_file():
        raise Seq2SeqError(f"{path} is a CTranslate2 export: add --engine ctranslate2")
    return Translator.from_run(path, device)
