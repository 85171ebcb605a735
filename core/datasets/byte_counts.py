"""The bytes of text each token spells, proven per document: what bits per byte must divide by.

A tokenizer encodes the document after its own normalization (SentencePiece's `normalize`: NFKC,
whitespace folded, each space written "▁"). A token spells part of that text: a piece its own text
with every "▁" one space byte, a byte-fallback token its one byte, an unknown token the text it
covers. Three byte-fallback tokens that spell "▁" (E2 96 81) spell one space, so they count 1 byte
together. Per document the counts add up to the UTF-8 bytes of the normalized text with "▁" read as
a space; `document_bytes` checks that for every document it counts.

The challenge's byte tables (core/data/tables.py) agree with these counts for its own tokenizers,
but not for every tokenizer: with no standalone "▁" piece they count a byte-encoded space as 3
bytes, and they drop the space of a piece that opens a document. Making a dataset stores these counts
as the validation byte sidecar wherever the tables would count differently (core/datasets/prepare.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import sentencepiece as spm

from core.common.errors import PgolfError

SPACE = "\u2581"  # the "▁" SentencePiece writes for a space
_SPACE_BYTES = tuple(SPACE.encode("utf-8"))  # (0xE2, 0x96, 0x81)


@dataclass(frozen=True)
class Mismatch:
    """Where a document's token counts and its text part: the token, its piece, both counts so far."""

    token: int  # index of the first token whose running total passes the text's bytes, or the last
    piece: str
    counted: int  # the counts' total over the whole document
    text: int  # UTF-8 bytes of the normalized text


def normalized_bytes(sp: spm.SentencePieceProcessor, text: str) -> int:
    """UTF-8 bytes of `text` as the tokenizer encodes it: its normalization, each "▁" one space."""
    return spelled_bytes(sp.normalize(text))


def spelled_bytes(normalized: str) -> int:
    """UTF-8 bytes of normalized text, each "▁" one space."""
    return len(normalized.replace(SPACE, " ").encode("utf-8"))


class TokenBytes:
    """Counts, for one tokenizer, the bytes of normalized text each token of a document spells."""

    def __init__(self, sp: spm.SentencePieceProcessor):
        self.sp = sp
        n = sp.vocab_size()
        self.spelled = np.zeros(n, dtype=np.int64)  # per id; unknown tokens depend on their text
        for i in range(n):
            if sp.is_byte(i):
                self.spelled[i] = 1
            elif not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)):
                self.spelled[i] = len(sp.id_to_piece(i).replace(SPACE, " ").encode("utf-8"))
        byte_ids = [sp.piece_to_id(f"<0x{b:02X}>") for b in _SPACE_BYTES]
        # The byte pieces that spell "▁", when the tokenizer has all three (byte fallback).
        self.space_bytes = byte_ids if all(sp.is_byte(i) for i in byte_ids) else None
        self.pieces = np.array([sp.id_to_piece(i) for i in range(n)], dtype=object)
        known = "".join(p for i, p in enumerate(self.pieces) if len(p) == 1 and self.spelled[i])
        # An unknown token stands for a run of characters the tokenizer has no piece for.
        self.unknown_runs = re.compile(f"[^{re.escape(known)}]+") if known else None

    def counts(self, text: str, ids: Sequence[int] | np.ndarray, normalized: str | None = None) -> np.ndarray:
        """int64 bytes each token of `ids` (the tokens of `text`, no BOS) spells (`normalized`: the
        text as the tokenizer normalizes it, when known)."""
        ids = np.asarray(ids, dtype=np.int64)
        out = self.spelled[ids]
        unknown = np.flatnonzero(ids == self.sp.unk_id())
        if unknown.size:  # an unknown token's piece is the normalized text it covers
            covered = self._unknown_pieces(text, ids, unknown, normalized)
            out[unknown] = [spelled_bytes(piece) for piece in covered]
        if self.space_bytes is not None and len(ids) >= 3:
            a, b, c = self.space_bytes
            starts = np.flatnonzero((ids[:-2] == a) & (ids[1:-1] == b) & (ids[2:] == c))
            out[starts], out[starts + 1], out[starts + 2] = 1, 0, 0
        return out

    def _unknown_pieces(
        self, text: str, ids: np.ndarray, unknown: np.ndarray, normalized: str | None
    ) -> list[str]:
        """The normalized text each unknown token of `ids` covers: the runs of characters with no piece,
        in order, where the pieces and those runs spell the normalized text; else from encoding it again."""
        normalized = self.sp.normalize(text) if normalized is None else normalized
        runs = self.unknown_runs.findall(normalized) if self.unknown_runs is not None else []
        if len(runs) == unknown.size:
            pieces = self.pieces[ids]
            pieces[unknown] = runs
            if "".join(pieces.tolist()) == normalized:
                return runs
        pieces = self.sp.encode_as_pieces(text)
        return [pieces[j] for j in unknown]

    def check(
        self, text: str, ids: Sequence[int] | np.ndarray, counts: np.ndarray, normalized: str | None = None
    ) -> Mismatch | None:
        """None when `counts` add up to the normalized text's bytes; else where they part from it."""
        normalized = self.sp.normalize(text) if normalized is None else normalized
        truth = spelled_bytes(normalized)
        total = int(np.sum(counts))
        if total == truth:
            return None
        # The first token where the running total passes the text's bytes, or the last one.
        running = np.cumsum(counts)
        over = np.flatnonzero(running > truth)
        at = int(over[0]) if over.size else max(len(counts) - 1, 0)
        piece = self.sp.id_to_piece(int(ids[at])) if len(ids) else ""
        return Mismatch(at, piece, total, truth)

    def document_bytes(self, text: str, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """`counts`, refused with the document's first difference unless they add up to its text."""
        normalized = self.sp.normalize(text)
        counts = self.counts(text, ids, normalized)
        wrong = self.check(text, ids, counts, normalized)
        if wrong is not None:
            raise PgolfError(
                f"the token counts of a document add up to {wrong.counted} bytes, its normalized text holds "
                f"{wrong.text} (first at token {wrong.token}, piece {wrong.piece!r})"
            )
        return counts
