"""The special token ids, fixed across every model this project trains.

Batches, search and checkpoints agree on them without importing the SentencePiece wrapper.
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_IDS = frozenset((PAD_ID, UNK_ID, BOS_ID, EOS_ID))
