"""`data verify NAME --bytes`: the proof that scoring divides by the validation text's bytes.

For each validation document, the bytes scoring counts for its tokens (the byte sidecar where the
dataset has one, else the tokenizer's byte tables) are compared with the UTF-8 bytes of the document
as the tokenizer normalizes it (core/datasets/byte_counts.py; for CaseOps data, of the original
text), token by token, from the documents that made the dataset (its manifest entry's "docs"). It
also says what the challenge's own byte tables would count for this tokenizer, the figure a stock
`train_gpt.py` would divide by.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.common.errors import PgolfError
from core.common.files import file_sha256
from core.data.manifest import (
    documents_source,
    find_entries,
    listed_entry,
    manifest_path,
    read_manifest,
    verify_dataset,
)
from core.data.shards import find_shards, read_shard
from core.data.tables import byte_tables, stream_bytes
from core.data.tokenizer import load_tokenizer
from core.datasets import caseops
from core.datasets.byte_counts import TokenBytes, normalized_bytes
from core.datasets.embedded import validation_documents
from core.datasets.export import ENCODE_BATCH, batched
from core.datasets.prepare import VAL_DOCS, read_documents


@dataclass
class ByteProof:
    documents: int = 0
    scoring: int = 0  # bytes scoring counts over the validation tokens
    text: int = 0  # UTF-8 bytes of the documents as the tokenizer encodes them
    raw: int = 0  # UTF-8 bytes of the documents as written
    normalized_docs: int = 0  # documents the normalization changed
    tables: int = 0  # what the challenge's byte tables count
    sidecar: bool = False
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
    """Compare dataset `name`'s validation byte counts with its documents' text, document by document."""
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
    tokens = np.concatenate([read_shard(f) for f in files]).astype(np.int64)
    tables = byte_tables(sp, max(sp.vocab_size(), int(tokens.max()) + 1))
    stock = stream_bytes(tokens, tables)
    proof = ByteProof(sidecar=any(folder.glob("fineweb_val_bytes_*.bin")))
    if proof.sidecar:
        scoring = np.concatenate(
            [read_shard(f.with_name(f.name.replace("_val_", "_val_bytes_"))) for f in files]
        )
        scoring = scoring.astype(np.int64)
    else:
        scoring = stock
    if len(scoring) != len(tokens):
        raise PgolfError(f"dataset {name}: the byte sidecar does not hold one entry per validation token")
    case_ops = tok_entry.get("text_transform") == caseops.TRANSFORM
    fragments = caseops.piece_fragments(sp) if case_ops else []
    counter = TokenBytes(sp)
    starts = [*np.flatnonzero(tokens == sp.bos_id()).tolist(), len(tokens)]
    if len(starts) - 1 != n or starts[0] != 0:
        raise PgolfError(
            f"dataset {name}: its validation shards hold {len(starts) - 1} documents (BOS {sp.bos_id()}), "
            f"the documents' first {n:,} were expected"
        )
    i = 0
    for batch in batched(texts, ENCODE_BATCH):
        inputs = [caseops.encode(t) for t in batch] if case_ops else batch
        for text, encoded in zip(batch, sp.encode(inputs, num_threads=os.cpu_count() or 1), strict=True):
            start, end = starts[i] + 1, starts[i + 1]
            ids = tokens[start:end]
            if not np.array_equal(ids, encoded):
                raise PgolfError(
                    f"dataset {name}: validation document {i}'s tokens are not those its text encodes to: "
                    "these documents did not make this dataset"
                )
            if case_ops:
                truth, text_bytes = (
                    caseops.token_bytes(fragments, encoded, text).astype(np.int64),
                    len(text.encode()),
                )
            else:
                truth, text_bytes = counter.counts(text, ids), normalized_bytes(sp, text)
            raw = len(text.encode("utf-8"))
            proof.documents += 1
            proof.scoring += int(scoring[start:end].sum())
            proof.text += text_bytes
            proof.raw += raw
            proof.normalized_docs += raw != text_bytes
            proof.tables += int(stock[start:end].sum())
            if not proof.difference:
                proof.difference = _first_difference(sp, i, ids, scoring[start:end], truth, text_bytes)
            i += 1
        say(f"checked {i:,}/{n:,} validation documents")
    proof.lines = _lines(proof)
    return proof


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
