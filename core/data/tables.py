"""The tokenizer's byte tables: how many UTF-8 bytes of text each target token stands for, so that
bits per byte does not depend on the tokenizer. `base_bytes[t]` counts the piece without its leading
"▁", plus one byte for that space unless the previous token is a boundary (control, unknown or
unused), i.e. the start of a document.

Data with a validation byte sidecar counts its bytes from it instead (core/eval/score.py's EvalData):
CaseOps data, and data whose tokenizer these tables would miscount (core/datasets/byte_counts.py). This
module is imported only for the runs without one (core/config/features.py's FEATURES).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sentencepiece as spm

SPACE = "\u2581"  # the "▁" SentencePiece writes for a space


@dataclass(frozen=True)
class ByteTables:
    base_bytes: np.ndarray  # int16: UTF-8 bytes of the piece without its leading "▁"
    has_leading_space: np.ndarray  # bool: the piece starts with "▁"
    is_boundary: np.ndarray  # bool: control / unknown / unused pieces (and ids past the vocabulary)


def byte_tables(sp: spm.SentencePieceProcessor, vocab_size: int) -> ByteTables:
    n = max(sp.vocab_size(), vocab_size)
    base = np.zeros(n, dtype=np.int16)
    space = np.zeros(n, dtype=bool)
    boundary = np.ones(n, dtype=bool)
    for i in range(sp.vocab_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            continue
        piece = sp.id_to_piece(i)
        boundary[i], space[i] = False, piece.startswith(SPACE)
        # A byte piece ("<0xE2>") is one raw byte, whatever its text form says.
        base[i] = 1 if sp.is_byte(i) else len(piece.removeprefix(SPACE).encode("utf-8"))
    return ByteTables(base, space, boundary)


def token_bytes(prev_ids: np.ndarray, target_ids: np.ndarray, tables: ByteTables) -> np.ndarray:
    """Bytes of text each target token adds, given the token before it."""
    prev, target = np.asarray(prev_ids).reshape(-1), np.asarray(target_ids).reshape(-1)
    space = tables.has_leading_space[target] & ~tables.is_boundary[prev]
    return tables.base_bytes[target].astype(np.int64) + space


def stream_bytes(tokens: np.ndarray, tables: ByteTables) -> np.ndarray:
    """int64 bytes each position of a token stream adds as a target: index i counts tokens[i] after
    tokens[i - 1]; index 0, never a target, counts 0."""
    tokens = np.asarray(tokens).reshape(-1)
    out = np.zeros(tokens.size, dtype=np.int64)
    out[1:] = token_bytes(tokens[:-1], tokens[1:], tables)
    return out
