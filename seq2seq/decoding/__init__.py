"""Using a trained model: greedy and beam search over encode/decode (search.py), translating
text (translate.py), scoring a split with sacreBLEU (evaluate.py), exporting to CTranslate2
(export.py).
"""
