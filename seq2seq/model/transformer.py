"""The encoder-decoder Transformer: ``forward = decode(tgt, encode(src))``.

Search (``search.py``) is written only against ``encode`` and ``decode``.
Letters: ``B`` batch, ``S`` source length, ``T`` target length, ``D`` d_model, ``V`` vocabulary,
``H`` heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.config import ModelConfig
from seq2seq.model.attention import DecoderCache, MultiHeadAttention
from seq2seq.model.layers import DecoderLayer, Embedding, EncoderLayer
from seq2seq.model.masks import causal_mask, check_rows, padding_mask
from seq2seq.vocab import PAD_ID


class Seq2Seq(nn.Module):
    """The encoder-decoder Transformer (Vaswani et al., 2017) with pre-norm layers: the
    encoder reads the source into a memory (``encode``), the decoder reads the target so far
    and that memory into next-token logits (``decode``).

    ``config`` sets the sizes, the attention's key/value heads (``n_kv_heads``) and MLA
    (``d_latent``, the decoder's self-attention), and which embeddings are one matrix: the
    source's and the target's (``share_embeddings``, one joint vocabulary), the target's and
    the output layer's (``tie_output``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.config = config
        if c.share_embeddings and c.src_vocab_size != c.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs one joint vocabulary (src_vocab_size == tgt_vocab_size)"
            )
        tgt_tokens = nn.Embedding(c.tgt_vocab_size, c.d_model, padding_idx=PAD_ID)
        src_tokens = (
            tgt_tokens
            if c.share_embeddings
            else nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=PAD_ID)
        )
        self.src_embed = Embedding(src_tokens, c.max_positions, c.dropout)
        self.tgt_embed = Embedding(tgt_tokens, c.max_positions, c.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.n_enc_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_dec_layers))
        self.encoder_norm = nn.LayerNorm(c.d_model)
        self.decoder_norm = nn.LayerNorm(c.d_model)
        self.output = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self._init_weights()
        if c.tie_output:
            self.output.weight = tgt_tokens.weight

    def hidden_matrices(self) -> dict[nn.Parameter, list[int]]:
        """The layers' weight matrices (not the embeddings, the output layer, the norms or the
        biases: what Muon takes), each with the blocks of rows it stacks: attention's packed
        projections (Q | K | V) their blocks, each other matrix one block of all its rows."""
        packed = self.packed_rows()
        layers = (*self.encoder_layers, *self.decoder_layers)
        matrices = [p for layer in layers for p in layer.parameters() if p.dim() == 2]
        return {p: packed.get(p, [p.shape[0]]) for p in matrices}

    def packed_rows(self) -> dict[nn.Parameter, list[int]]:
        """Attention's packed projections, each with the blocks of rows it stacks."""
        packed = {}
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                packed.update(module.packed_rows())
        return packed

    @torch.no_grad()
    def _init_weights(self) -> None:
        # Attention's packed projections: each block (Q, K, V) as the matrix it stands for.
        packed = self.packed_rows()
        for name, p in self.named_parameters():
            if p.dim() > 1:
                for block in p.split(packed.get(p, [p.shape[0]])):
                    nn.init.xavier_uniform_(block)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for emb in (self.src_embed.tokens, self.tgt_embed.tokens):
            nn.init.normal_(emb.weight, std=self.config.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()

    def set_dropout(self, p: float) -> None:
        """The residual and embedding dropout (``model.dropout``); the trainer's schedule moves it."""
        for module in (self.src_embed, self.tgt_embed, *self.encoder_layers, *self.decoder_layers):
            module.dropout.p = p

    def new_cache(self) -> DecoderCache:
        return DecoderCache(len(self.decoder_layers))

    def encode(self, src: Tensor, src_mask: Tensor, check: bool = True) -> Tensor:
        """The encoder memory. With ``check`` (the default, for sources from a user),
        ``src_mask`` is checked here, once per batch, for a sentence with no real token
        (``masks.py``); ``decode`` then trusts the same mask. The trainer passes False: its
        batches always end in EOS.

        Shapes: src (B, S), src_mask (B, 1, 1, S) -> memory (B, S, D)
        """
        if check:
            check_rows(src_mask)
        return self._encode(src, src_mask)[0]

    def _encode(
        self, src: Tensor, src_mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor] | None]:
        """``encode``'s memory, and with ``need_weights`` each layer's self-attention."""
        x = self.src_embed(src)
        weights = [] if need_weights else None
        for layer in self.encoder_layers:
            x, w = layer(x, src_mask, need_weights=need_weights)
            if need_weights:
                weights.append(w)
        return self.encoder_norm(x), weights  # (B, S, D), per layer (B, H, S, S)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None]:
        """Logits for every target position, and the cross-attention weights when asked.

        Without a cache, ``tgt`` is the whole prefix. With one, ``tgt`` holds only the new
        positions, which follow the ``cache.length`` already decoded; the cache's
        cross-attention K/V may have a batch that divides ``tgt``'s (beams sharing a
        source), in which case ``memory`` and ``src_mask`` have that smaller batch too.

        ``src_mask`` is the one ``encode`` checked.

        Shapes:
            tgt (B, T); memory (Bk, S, D); src_mask (Bk, 1, 1, S); Bk = B, or B / K for K beams
            -> logits (B, T, V) and per layer weights (B, H, T, S) or None
        """
        logits, weights, _ = self._decode(tgt, memory, src_mask, cache, need_weights)
        return logits, weights

    def _decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
        need_self_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None, list[Tensor] | None]:
        """``decode``'s logits and cross-attention, and with ``need_self_weights`` each
        layer's (masked) self-attention, (B, H, T, P + T) after P cached positions."""
        start = cache.length if cache is not None else 0
        n_new = tgt.shape[1]
        # One new position may read everything before it: no mask needed.
        tgt_mask = None if n_new == 1 else causal_mask(n_new, start + n_new, tgt.device)
        x = self.tgt_embed(tgt, start)
        weights = [] if need_weights else None
        self_weights = [] if need_self_weights else None
        for i, layer in enumerate(self.decoder_layers):
            self_cache = cache.self_attn[i] if cache is not None else None
            cross_cache = cache.cross_attn[i] if cache is not None else None
            x, w, own = layer(
                x,
                memory,
                tgt_mask,
                src_mask,
                self_cache=self_cache,
                cross_cache=cross_cache,
                need_weights=need_weights,
                need_self_weights=need_self_weights,
            )
            if need_weights:
                weights.append(w)
            if need_self_weights:
                self_weights.append(own)
        return self.output(self.decoder_norm(x)), weights, self_weights  # (B, T, V)

    def self_attention(self, src: Tensor, tgt: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Teacher-forced, as ``forward``: each encoder layer's self-attention and each decoder
        layer's masked (causal) self-attention, a masked key at weight 0. The same
        computation as ``forward``: the weights are read beside it (``attention.attend``).

        Shapes: src (B, S), tgt (B, T) -> per encoder layer (B, H, S, S), per decoder layer
        (B, H, T, T)
        """
        src_mask = padding_mask(src)
        check_rows(src_mask)
        memory, encoder = self._encode(src, src_mask, need_weights=True)
        _, _, decoder = self._decode(tgt, memory, src_mask, need_self_weights=True)
        return encoder, decoder

    def forward(self, src: Tensor, tgt: Tensor, check: bool = True) -> Tensor:
        """Teacher-forced logits: at every target position, the scores of the next token,
        from the whole source and the target up to that position (the causal mask hides the
        rest), in one pass. ``tgt`` is BOS and the target but its EOS (a batch's ``tgt_in``):
        position ``t``'s logits score the token after it. ``check`` as in ``encode``.

        Shapes: src (B, S), tgt (B, T) -> (B, T, V)
        """
        src_mask = padding_mask(src)
        return self.decode(tgt, self.encode(src, src_mask, check), src_mask)[0]


def build_model(config: ModelConfig) -> Seq2Seq:
    return Seq2Seq(config)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
