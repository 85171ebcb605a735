"""SentencePiece tokenizers: loading, and the byte tables behind bits per byte (training one is
core/datasets/writers.py's).

The byte tables count how many UTF-8 bytes of text each target token stands for,
so that BPB does not depend on the tokenizer: `base_bytes[t]` for the piece
without its leading "▁", plus one byte for that space unless the previous token
is a boundary (control, unknown or unused), i.e. the start of a document.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

from core.common.errors import PgolfError, hint
from core.common.files import read_file

SPACE = "\u2581"  # the "▁" SentencePiece writes for a space
MAX_TOKENIZER_BYTES = 2**28  # 256 MiB; a 65,536-piece model is a few MB


def load_tokenizer(path: str | Path) -> spm.SentencePieceProcessor:
    path = Path(path)
    if not path.exists():
        raise PgolfError(
            f"tokenizer {path} does not exist ({hint('run: python cli.py data prepare', 'set TOKENIZER_PATH')})"
        )
    if path.suffix != ".model":
        raise PgolfError(f"tokenizer {path} should be a SentencePiece .model file")
    # Read here, so that an unreadable file is said to be one, not "not a SentencePiece model".
    proto = read_file(path, "tokenizer", MAX_TOKENIZER_BYTES)
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except (OSError, RuntimeError):
        raise PgolfError(f"tokenizer {path} is not a SentencePiece model") from None
    return sp


def check_vocab(sp: spm.SentencePieceProcessor, vocab_size: int, tokenizer_path: str | Path) -> None:
    if sp.vocab_size() != vocab_size:
        raise PgolfError(
            f"tokenizer {tokenizer_path} has {sp.vocab_size()} pieces but vocab_size is {vocab_size}"
        )


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
