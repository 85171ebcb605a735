"""SentencePiece tokenizers: loading one, and checking its vocabulary (training one is
core/datasets/writers.py's; the byte tables behind bits per byte are core/data/tables.py's)."""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

from core.common.errors import PgolfError, hint
from core.common.files import read_file
from core.data.shards import making_command

MAX_TOKENIZER_BYTES = 2**28  # 256 MiB; a 65,536-piece model is a few MB


def load_tokenizer(path: str | Path) -> spm.SentencePieceProcessor:
    path = Path(path)
    if not path.exists():
        raise PgolfError(
            f"tokenizer {path} does not exist ({hint(f'run: {making_command(path)}', 'set TOKENIZER_PATH')})"
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
