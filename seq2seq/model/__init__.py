"""The Transformer itself, read in this order: masks.py (the mask convention and its checks),
attention.py (the attention function and MultiHeadAttention: self and cross, MHA/GQA/MQA, the
KV cache), layers.py (embeddings, positions, feed-forward, the encoder and decoder layers),
transformer.py (Seq2Seq with encode() and decode()). latent_attention.py holds the MLA
variant, a subclass of MultiHeadAttention that the decoder uses where ``d_latent`` is set.
"""
