"""Text in, token batches out: where a corpus comes from (registry, folders, TSV, the Hub), its
subword tokenizer, the encoded store and the batches a step trains on.
"""
