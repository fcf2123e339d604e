"""Looking inside a translation: a sentence's record of its decoding (records.py) and the
attention report behind seq2seq attention (report.py), influence by occlusion, interventions,
the explorer page (explorer.py, templates/), the explorer answering forms from a loaded run
(live_explorer.py) and the browser server (serve.py).
"""
