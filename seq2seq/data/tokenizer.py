"""SentencePiece subwords: training on the training split, encode/decode, fixed special ids.

One model serves both sides when the vocabulary is joint (the default, so source, target
and output embeddings can be one matrix); otherwise each side has its own. Byte fallback
means no input is unrepresentable: a character never seen in training becomes its UTF-8
bytes instead of ``<unk>``, and ``decode(encode(x))`` gives back the normalised ``x``.

SentencePiece trains and batch-encodes on as many threads as torch's intra-op pool has:
``train.threads`` where a run sets it (``runtime.setup_runtime``), else torch's default
(the physical cores, or ``OMP_NUM_THREADS``), so one setting governs a process's CPU use.
"""

from __future__ import annotations

import io
import re
from functools import cached_property
from pathlib import Path

import sentencepiece as spm
import torch

from seq2seq.errors import Seq2SeqError
from seq2seq.fileio import atomic_write_bytes
from seq2seq.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

JOINT_FILE = "spm.model"
SIDE_FILES = {"src": "spm_src.model", "tgt": "spm_tgt.model"}
MODEL_TYPES = ("bpe", "unigram")

# Plenty for a subword vocabulary; keeps training memory bounded on big corpora.
_MAX_TRAINING_SENTENCES = 2_000_000

# Sizing a vocabulary to a small corpus. A piece's embedding (and, tied, its output row) learns
# only from the piece's occurrences, so a vocabulary much larger than the corpus leaves most
# pieces a handful of examples: 8,000 pieces on 34,000 words is ~4 words per piece. subword-nmt
# keeps only pieces seen 50 times or more (--vocabulary-threshold 50), and low-resource studies
# (Sennrich & Zhang 2019; Ding, Renduchintala & Duh 2019) find small vocabularies best on small
# data. The rule: one learned piece per 30 training words, on top of the specials and byte
# pieces, which are not learned from the text. 30 leaves the recipe the default 8,000 was tuned
# on as it was: Multi30k has 83 words per piece joint (de+en) and 33 for its smallest side alone
# (cs); a 5,000-pair Tatoeba file (~34,000 words) gets ~1,400. Never below the corpus's distinct
# characters, which every vocabulary holds (text without spaces, e.g. Chinese, has few "words").
_WORDS_PER_PIECE = 30
_UNLEARNED_PIECES = 4 + 256  # pad, unk, bos, eos, and the byte-fallback pieces


def corpus_vocab_size(texts: list[str], cap: int) -> int:
    """The vocabulary ``texts`` support by the rule above, at most ``cap``."""
    words = 0
    for text in texts:
        words += len(text.split())
        if words >= (cap - _UNLEARNED_PIECES) * _WORDS_PER_PIECE:
            return cap  # a large corpus: no need to count it all
    characters = len(set().union(*texts))
    return min(cap, _UNLEARNED_PIECES + max(characters, words // _WORDS_PER_PIECE))


def _fitted_size(texts: list[str], vocab_size: int, fit: bool, name: str) -> tuple[int, list[str]]:
    """``vocab_size``, or with ``fit`` the corpus's size when smaller; a note on either."""
    supported = corpus_vocab_size(texts, vocab_size)
    if supported >= vocab_size:
        return vocab_size, []
    words = sum(len(text.split()) for text in texts)
    if fit:
        return supported, [
            f"{name}: the default vocabulary size {vocab_size} does not fit a corpus of "
            f"{words:,} words; sized to {supported} (one piece per {_WORDS_PER_PIECE} words; "
            "data.vocab_size sets another)"
        ]
    return vocab_size, [
        f"{name}: vocabulary size {vocab_size} is large for a corpus of {words:,} "
        f"words ({words / vocab_size:.1f} per piece); about {supported} would suit it"
    ]


def _train_model(texts: list[str], path: Path, vocab_size: int, model_type: str) -> list[str]:
    """Train one SentencePiece model into ``path``; returns notes on any size adjustment.

    SentencePiece refuses a vocabulary larger than the corpus supports, or smaller than its
    characters plus the byte pieces need; both messages state the nearest valid size, and
    the model is retrained at that size rather than failing on a small corpus.
    """
    notes: list[str] = []
    size = vocab_size
    for _ in range(3):
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                model_writer=model,
                vocab_size=size,
                model_type=model_type,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                byte_fallback=True,
                input_sentence_size=_MAX_TRAINING_SENTENCES,
                shuffle_input_sentence=True,
                num_threads=torch.get_num_threads(),
                minloglevel=2,
            )
        except RuntimeError as e:
            too_high = re.search(r"Vocabulary size too high .*<= (\d+)", str(e))
            too_low = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(e))
            bound = too_high or too_low
            if bound is None:
                raise Seq2SeqError(
                    f"SentencePiece training failed: {str(e).splitlines()[0]}"
                ) from None
            size = int(bound.group(1))
            continue
        atomic_write_bytes(path, model.getvalue())
        if size != vocab_size:
            notes.append(
                f"vocabulary size {vocab_size} does not fit this corpus; {path.name} uses {size}"
            )
        return notes
    raise Seq2SeqError(f"SentencePiece could not settle on a vocabulary size near {vocab_size}")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_unicode(text: str) -> str:
    """Lone surrogates (what Python makes of undecodable bytes, e.g. in argv) become U+FFFD:
    SentencePiece takes only valid Unicode."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def _load_model(path: Path) -> spm.SentencePieceProcessor:
    if not path.is_file():
        raise Seq2SeqError(f"tokenizer model not found: {path}")
    processor = spm.SentencePieceProcessor()
    try:
        processor.load(str(path))
    except (RuntimeError, OSError):
        raise Seq2SeqError(f"{path} is not a SentencePiece model") from None
    specials = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
    if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise Seq2SeqError(
            f"{path} has special ids pad/unk/bos/eos = {specials}, expected {PAD_ID}/{UNK_ID}/{BOS_ID}/{EOS_ID}"
        )
    return processor


class Tokenizer:
    """Subword encoder for the source and target sides of one run.

    ``encode`` adds no BOS/EOS (``data.collate`` does); ``decode`` stops at EOS and drops
    the other specials.
    """

    def __init__(self, src: spm.SentencePieceProcessor, tgt: spm.SentencePieceProcessor):
        self._models = {"src": src, "tgt": tgt}
        self.notes: list[str] = []  # e.g. a vocabulary size the corpus could not fill

    @classmethod
    def train(
        cls,
        src_texts: list[str],
        tgt_texts: list[str],
        out_dir: Path,
        vocab_size: int = 8000,
        model_type: str = "bpe",
        joint: bool = True,
        fit_to_corpus: bool = False,
    ) -> Tokenizer:
        """Train on training-split texts only and save into ``out_dir``.

        ``fit_to_corpus``: ``vocab_size`` is only a ceiling, lowered to what a small corpus
        supports (``corpus_vocab_size``); else a size too large for the corpus is warned of."""
        if model_type not in MODEL_TYPES:
            raise Seq2SeqError(
                f"unknown SentencePiece model type '{model_type}' (use bpe or unigram)"
            )
        if not src_texts or not tgt_texts:
            raise Seq2SeqError("cannot train a tokenizer on an empty training split")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        sides = (
            [(src_texts + tgt_texts, JOINT_FILE)]
            if joint
            else [(src_texts, SIDE_FILES["src"]), (tgt_texts, SIDE_FILES["tgt"])]
        )
        notes = []
        for texts, name in sides:
            size, fitted = _fitted_size(texts, vocab_size, fit_to_corpus, name)
            notes += fitted + _train_model(texts, out_dir / name, size, model_type)
        tokenizer = cls.load(out_dir)
        tokenizer.notes = notes
        return tokenizer

    @classmethod
    def load(cls, path: Path | str) -> Tokenizer:
        """Load from a run directory (joint or per-side models) or a single ``.model`` file."""
        path = Path(path)
        if path.is_file():
            model = _load_model(path)
            return cls(model, model)
        if (path / JOINT_FILE).is_file():
            model = _load_model(path / JOINT_FILE)
            return cls(model, model)
        if (path / SIDE_FILES["src"]).is_file() or (path / SIDE_FILES["tgt"]).is_file():
            return cls(_load_model(path / SIDE_FILES["src"]), _load_model(path / SIDE_FILES["tgt"]))
        raise Seq2SeqError(
            f"no tokenizer in {path}: expected {JOINT_FILE} or {SIDE_FILES['src']} + {SIDE_FILES['tgt']}"
        )

    def save(self, out_dir: Path) -> None:
        """Write the model(s) into ``out_dir`` under a run directory's names, where
        ``load`` finds them: one joint model, or one a side."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        files = {"src": JOINT_FILE} if self.joint else SIDE_FILES
        for side, name in files.items():
            atomic_write_bytes(out_dir / name, self._models[side].serialized_model_proto())

    @staticmethod
    def model_files(run_dir: Path) -> dict[str, Path]:
        """The model file of each side in a run directory (one for both when joint)."""
        joint = Path(run_dir) / JOINT_FILE
        return {
            side: joint if joint.is_file() else Path(run_dir) / SIDE_FILES[side]
            for side in SIDE_FILES
        }

    def _model(self, side: str) -> spm.SentencePieceProcessor:
        try:
            return self._models[side]
        except KeyError:
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}") from None

    @property
    def joint(self) -> bool:
        return self._models["src"] is self._models["tgt"]

    @property
    def src_vocab_size(self) -> int:
        return self._models["src"].get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self._models["tgt"].get_piece_size()

    def normalize(self, text: str, side: str) -> str:
        """The text as the model sees it (NFKC, whitespace collapsed): what decode returns."""
        # SentencePiece marks spaces with U+2581 and adds one in front of the text.
        return self._model(side).normalize(text).replace("\u2581", " ").strip()

    def encode(self, text: str, side: str) -> list[int]:
        return self._model(side).encode(_valid_unicode(text), out_type=int)

    def encode_batch(self, texts: list[str], side: str) -> list[list[int]]:
        texts = [_valid_unicode(t) for t in texts]
        return self._model(side).encode(texts, out_type=int, num_threads=torch.get_num_threads())

    def decode(self, ids: list[int], side: str) -> str:
        kept = []
        for i in ids:
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                kept.append(int(i))
        return self._model(side).decode(kept)

    @cached_property
    def special_pieces(self) -> frozenset[str]:
        """The pieces SentencePiece types control or unknown (``<pad>``, ``<unk>``, ``<s>``,
        ``</s>``) on either side: each a word of its own (``seq2seq.drawing.words``). Byte-fallback
        pieces (``<0xF0>``) look alike but are not: they spell a character of their word."""
        return frozenset(
            model.id_to_piece(i)
            for model in self._models.values()
            for i in range(model.get_piece_size())
            if model.is_control(i) or model.is_unknown(i)
        )

    def pieces(self, ids: list[int], side: str) -> list[str]:
        """Subword strings for plot labels; specials read ``<pad>``, ``<unk>``, ``<s>``, ``</s>``."""
        model = self._model(side)
        return [model.id_to_piece(int(i)) for i in ids]
