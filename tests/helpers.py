"""Small builders shared by the test modules (pytest puts tests/ on sys.path)."""

import torch

from seq2seq.config import ModelConfig
from seq2seq.model import Seq2Seq, build_model

V = 20  # vocabulary of the tiny models: 4 specials + 16 tokens


def tiny_model(n_kv_heads=None, d_latent=None, seed=0, **overrides) -> Seq2Seq:
    """A 2+2-layer, d_model 32 model in eval mode, seeded; ``overrides`` go to ModelConfig."""
    torch.manual_seed(seed)
    sizes = dict(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_enc_layers=2,
        n_dec_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    config = ModelConfig(n_kv_heads=n_kv_heads, d_latent=d_latent, **{**sizes, **overrides})
    return build_model(config).eval()
