"""The faces that show what ``seq2seq.inspect`` measures: the attention report behind
``seq2seq attention`` (report.py), the explorer page (page.py, templates/), the explorer
answering forms from a loaded run (live.py), the browser server behind ``seq2seq serve``
(serve.py) and the notebook's ``load`` and ``Inspection`` (notebook.py).
"""
