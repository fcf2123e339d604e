"""seq2seq: a small encoder-decoder Transformer translation toolkit."""

__version__ = "0.1.0"
