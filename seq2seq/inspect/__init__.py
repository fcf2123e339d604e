"""The instruments for looking inside a translation: a sentence's record of its decoding
(records.py), influence by occlusion (influence.py) and interventions on cross-attention
(interventions.py). What shows them (the report, the explorer page, the server, the notebook)
is ``seq2seq.explorer``, the layer above.
"""
