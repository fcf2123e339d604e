"""A beam search's tree as a sentence's record holds it (``records.sentence_records``, key
``tree``): what the explorer draws and a notebook's ``Inspection.beam_tree`` returns.

The tree is ``seq2seq.decoding.tree``'s, in plain lists: its nodes (token pieces, scores, fate,
and for every node the search expanded the cross-attention row its children were scored with),
every hypothesis that ended, ranked by the search's normalized score, and the length penalty's
constants, so that a page re-ranks the endings for another ``alpha`` with the search's formula.

Letters: ``L`` decoder layers, ``H`` heads, ``S`` source columns.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from seq2seq.decoding.beam import GNMT_BASE, GNMT_SCALE
from seq2seq.decoding.search import Hypothesis
from seq2seq.decoding.translate import one_line
from seq2seq.decoding.tree import MAX_STEPS, BeamTree, Ending
from seq2seq.drawing import words
from seq2seq.vocab import EOS_ID

DIGITS = 4  # of the scores and attention weights a record holds


def tree_record(tok, tree: BeamTree, hyps: list[Hypothesis]) -> dict:
    """The record of one sentence's tree; ``hyps``: what the search returned, best first
    (``chosen``: the first; ``returned``: any of them).

    Keys: beam, alpha, width (continuations recorded per beam), max_steps, truncated (steps
    past max_steps were decoded, their nodes not recorded), end (step, reason, and for
    "early" best_open and worst_finished), penalty (base and scale of GNMT's ``((base +
    length) / scale) ** alpha``), nodes (id, step, parent, token, logp, score, normalized,
    fate, chosen, attention (L, H, S) or None) and endings (node or None, translation,
    tokens, steps (scored, EOS included: the penalty's length), score, normalized,
    stop_reason, returned, chosen), best first.
    """
    returned = [(h.tokens, h.stop_reason) for h in hyps]
    endings = sorted(tree.endings, key=lambda e: -e.normalized)
    chosen = next(e for e in endings if (e.tokens, e.stop_reason) == returned[0])
    on_path = _path(tree, chosen.node)
    nodes = [
        {
            "id": i,
            "step": node.step,
            "parent": node.parent,
            "token": tok.pieces([node.token], "tgt")[0],
            "logp": round(node.logp, DIGITS),
            "score": round(node.score, DIGITS),
            "normalized": round(node.normalized, DIGITS),
            "fate": node.fate,
            "chosen": i in on_path,
            "attention": None
            if node.attention is None
            else np.round(node.attention.numpy(), DIGITS).tolist(),
        }
        for i, node in enumerate(tree.nodes)
    ]
    return {
        "beam": tree.beam,
        "alpha": tree.alpha,
        "width": tree.width,
        "max_steps": MAX_STEPS,
        "truncated": tree.truncated,
        "end": tree.end,
        "penalty": {"base": GNMT_BASE, "scale": GNMT_SCALE},
        "nodes": nodes,
        "endings": [
            _ending(tok, e, (e.tokens, e.stop_reason) in returned, e is chosen) for e in endings
        ],
    }


def _ending(tok, e: Ending, returned: bool, chosen: bool) -> dict:
    return {
        "node": e.node,
        "translation": one_line(tok.decode(e.tokens, "tgt")),
        "tokens": tok.pieces(e.tokens + ([EOS_ID] if e.stop_reason == "eos" else []), "tgt"),
        "steps": e.step,
        "score": round(e.score, DIGITS),
        "normalized": round(e.normalized, DIGITS),
        "stop_reason": e.stop_reason,
        "returned": returned,
        "chosen": chosen,
    }


def _path(tree: BeamTree, node: int | None) -> set[int]:
    """The nodes from ``node`` up to the root (none past the tree's step cap)."""
    found = set()
    while node is not None:
        found.add(node)
        node = tree.nodes[node].parent
    return found


def tree_in_words(
    tree: dict | None, src_tokens: Sequence[str], specials: Collection[str]
) -> dict | None:
    """The tree with its attention rows' source columns merged into words (the steps stay
    subwords, as the step view's). Shapes: attention (L, H, S) -> (L, H, Wk)"""
    if tree is None:
        return None
    nodes = [
        node
        if node["attention"] is None
        else {
            **node,
            "attention": np.round(
                words.merge_source(node["attention"], src_tokens, specials), DIGITS
            ).tolist(),
        }
        for node in tree["nodes"]
    ]
    return {**tree, "nodes": nodes}
