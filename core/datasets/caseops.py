"""CaseOps: a lossless case transform of text, and the original bytes each token stands for.

The transform (the records' `lossless_caps_caseops_v1`) takes capitals out of the text and writes
them as four operator characters from Unicode's private use area, each one piece of the tokenizer
(a SentencePiece user-defined symbol), so that "The", "THE" and "the" share their lowercase pieces:

    TITLE   U+E001  the next ASCII word starts with a capital ("The" -> TITLE "the")
    ALLCAPS U+E002  the next ASCII word, two letters or more, is all capitals ("NASA" -> ALLCAPS "nasa")
    CAPNEXT U+E003  the next letter of a mixed-case word is a capital ("iPhone" -> "i" CAPNEXT "phone")
    ESC     U+E004  the next character is one of the four, literally ("\\uE001" -> ESC "\\uE001")

A word is a maximal run of ASCII letters; every other character (non-ASCII letters included) is
left alone. `decode(encode(s)) == s` for every string (tests/test_caseops.py checks it on arbitrary
Unicode), and `encode` gives the records' output character for character (the golden test).

Bits per byte stay those of the original text: a validation token stands for the UTF-8 bytes of the
ORIGINAL text it covers (an operator 0; an escaped operator its 3; a letter 1, whatever its case).
`token_bytes` counts them; making a dataset stores them beside the validation tokens as a byte
sidecar (`fineweb_val_bytes_*.bin`, read by core/data/shards.py), which scoring counts instead of
the tokenizer's byte tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from core.common.errors import PgolfError

TRANSFORM = "lossless_caps_caseops_v1"  # the name manifests give the transform
TITLE, ALLCAPS, CAPNEXT, ESC = "\ue001", "\ue002", "\ue003", "\ue004"
OPERATORS = (TITLE, ALLCAPS, CAPNEXT, ESC)  # the tokenizer's user-defined symbols, in this order
_OPERATOR_BYTES = len(TITLE.encode("utf-8"))  # 3, the same for all four

_WORD_OR_OPERATOR = re.compile(r"[A-Za-z]+|[\ue001-\ue004]")
# One encoded unit: an escaped operator, an ALLCAPS word, or a word with optional TITLE and
# CAPNEXT marks; any other operator left over is one encode never writes there.
_ENCODED_UNIT = re.compile(
    r"\ue004([\ue001-\ue004])|\ue002([a-z]+)|(\ue001?)([a-z](?:\ue003?[a-z])*)|([\ue001-\ue004])"
)


def _encode_unit(match: re.Match[str]) -> str:
    word = match.group()
    if word in OPERATORS:
        return ESC + word
    if len(word) > 1 and word.isupper():
        return ALLCAPS + word.lower()
    head = (TITLE if word[0].isupper() else "") + word[0].lower()
    return head + "".join(CAPNEXT + c.lower() if c.isupper() else c for c in word[1:])


def encode(text: str) -> str:
    """The transformed text: capitals as operators over lowercase words, operators escaped."""
    return _WORD_OR_OPERATOR.sub(_encode_unit, text)


def _decode_unit(match: re.Match[str]) -> str:
    escaped, allcaps, title, word, stray = match.groups()
    if escaped:
        return escaped
    if allcaps:
        return allcaps.upper()
    if stray:
        names = dict(zip(OPERATORS, ("TITLE", "ALLCAPS", "CAPNEXT", "ESC"), strict=True))
        raise PgolfError(
            f"CaseOps text: {names[stray]} at character {match.start()} is not followed by what it marks"
        )
    letters = re.sub(r"\ue003([a-z])", lambda m: m.group(1).upper(), word)
    return letters[0].upper() + letters[1:] if title else letters


def decode(text: str) -> str:
    """The original text of `encode`'s output; an operator where encode never writes one is refused."""
    return _ENCODED_UNIT.sub(_decode_unit, text)


def fragment_bytes(fragments: Iterable[str | bytes]) -> list[int]:
    """The original UTF-8 bytes each consecutive fragment of transformed text stands for.

    A fragment is a piece's text (str) or one raw byte of a byte-fallback piece (bytes). Operators
    count 0 and an escaped one 3, so the counts add up to the original text's UTF-8 length.
    """
    counts, escaped = [], False
    for fragment in fragments:
        n = len(fragment) if isinstance(fragment, bytes) else len(fragment.encode("utf-8"))
        if isinstance(fragment, str) and not fragment.isascii():
            for ch in fragment:
                if escaped:
                    escaped = False
                elif ch in OPERATORS:
                    n -= _OPERATOR_BYTES
                    escaped = ch == ESC
        counts.append(n)
    return counts


def piece_fragments(sp: spm.SentencePieceProcessor) -> list[str | bytes]:
    """Each id's fragment of text: its piece with "▁" as a space, one raw byte for a byte piece,
    nothing for a control or unknown piece. Exact for a tokenizer that does not normalize (`lossless` in
    core/datasets/writers.py: decoding joins these fragments)."""
    out: list[str | bytes] = []
    for i in range(sp.vocab_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            out.append("")
        elif sp.is_byte(i):
            out.append(bytes([int(sp.id_to_piece(i)[3:5], 16)]))  # "<0xE2>"
        else:
            out.append(sp.id_to_piece(i).replace("\u2581", " "))
    return out


def token_bytes(fragments: Sequence[str | bytes], ids: Sequence[int], original: str) -> np.ndarray:
    """uint16 original bytes of each token of `ids`, the tokens of encode(original) under a tokenizer
    whose pieces are `fragments` (piece_fragments). Refuses, naming the first difference, unless
    the tokens decode and invert back to `original` exactly, so the counts add up to its UTF-8 bytes."""
    pieces = [fragments[i] for i in ids]
    text = b"".join(p if isinstance(p, bytes) else p.encode("utf-8") for p in pieces).decode(
        "utf-8", "replace"
    )
    try:
        back = decode(text)
    except PgolfError as exc:
        back = f"<{exc}>"
    if back != original:
        at = next((i for i, (a, b) in enumerate(zip(back, original, strict=False)) if a != b), len(back))
        raise PgolfError(
            f"CaseOps: the tokens do not give the text back (first difference at character {at}: "
            f"{original[at : at + 20]!r} became {back[at : at + 20]!r}); the tokenizer must not normalize"
        )
    return np.array(fragment_bytes(pieces), dtype=np.uint16)
