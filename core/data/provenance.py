"""What data a run trained and was scored on, as digests its run directory keeps (a `data` record in
metrics.jsonl): `package` refuses seeds whose data differ, and submission.json carries them.

The training shards are named by a digest of their names and sizes (hashing their contents, gigabytes,
would delay every start: `data verify` checks those against the manifest); the validation shards, and
the validation byte sidecar where the data has one, and the tokenizer by digests of their contents.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from core.common.files import file_sha256
from core.data.shards import find_shards

# The fields of a data record that must agree between the seeds of one submission.
SAME_DATA = ("train_shards", "train_shards_sha256", "val_sha256", "tokenizer_sha256")


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("".join(f"{line}\n" for line in lines).encode()).hexdigest()


def data_record(data_path: str | Path, tokenizer_path: str | Path) -> dict[str, Any]:
    """The `data` record of a run reading `data_path` and `tokenizer_path` (found and checked already)."""
    train = find_shards(data_path, "train")
    val = find_shards(data_path, "val")
    sidecars = sorted(
        Path(data_path).glob("fineweb_val_bytes_[0-9]*.bin")
    )  # optional: find_shards refuses none
    return {
        "kind": "data",
        "train_shards": len(train),
        "train_shards_sha256": _digest([f"{p.name} {p.stat().st_size}" for p in train]),
        "val_shards": len(val),
        "val_sha256": _digest([f"{p.name} {file_sha256(p)}" for p in [*val, *sidecars]]),
        "tokenizer_sha256": file_sha256(tokenizer_path, "tokenizer"),
    }
