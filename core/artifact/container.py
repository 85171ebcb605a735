"""pgolf's container of an artifact, both layouts: what a run writes and reads back, and what the
readers of other files open.

pgolf's container holds no pickle. Layout:
    MAGIC (b"PGOLF-INT8\\x01") | 1 byte compressor id | compressed payload | sha256 of the payload
(ids in core/common/compress.py: 0 none, 1 zlib, 2 lzma, 3 bz2, 4 brotli, 5 zstd; bit 0x80
set when the payload was byte-shuffled first; the checksum is the 32 raw bytes of the
digest of the payload before compression, so any change to what the container holds
is refused) where the payload is a safetensors file (readable with numpy alone) with
tensors named `role/name` (core/artifact/quantized.py: `model_parts`), and one metadata entry "pgolf"
holding canonical JSON, its "format" naming the format (int8's or the mixed one) and the rest
the format's own. The same weights always give the same bytes, whatever order they come in.
A file may be at most MAX_ARTIFACT_BYTES, and its payload at most compress.MAX_OUTPUT_BYTES.

pgolf's first container (MAGIC_V1, b"PGOLF-INT8\\x00") has the same layout without the trailing
digest: damage to it cannot be detected, so it is read with a warning.

Who opens with what: a run reads back the container it has just written as it is
(`open_container`: the current layout alone, its checksum saying it is what was written); the
readers of other files open theirs with `open_any` (either layout, and the metadata must name a
format), then check its metadata and tensor names (core/artifact/checks.py: `check_container`).

The challenge's own containers (its torch file, its MLX pickle) are core/artifact/upstream.py's.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from core.common import compress, pergroup
from core.common.errors import PgolfError, first_line
from core.common.files import read_file, write_atomic

__all__ = [
    "ArtifactInfo",
    "Container",
    "container_bytes",
    "open_any",
    "open_container",
    "payload_bytes",
    "write_artifact",
]

MAGIC = b"PGOLF-INT8\x01"  # the container with the payload's checksum
MAGIC_V1 = b"PGOLF-INT8\x00"  # the first container: no checksum
DIGEST_BYTES = 32  # sha256
# The metadata key of the SHA-256 of the tokenizer file a model was trained with (absent in older
# artifacts, and where the file was not at hand): a reader given another tokenizer refuses it.
TOKENIZER_KEY = "tokenizer_sha256"
MAX_ARTIFACT_BYTES = 2**30  # 1 GiB, 67 times the challenge's whole budget: anything larger is not an artifact
META_KEY = "pgolf"


@dataclass(frozen=True)
class ArtifactInfo:
    path: Path
    file_bytes: int


@dataclass(frozen=True)
class Container:
    tensors: dict[str, np.ndarray]
    # The parsed "pgolf" metadata: a dict with a "format" key (the readers of other files check it:
    # `open_any`).
    meta: dict[str, Any]
    compressor: str
    shuffle: int  # byte-shuffle stride, 0 for none


def container_bytes(
    tensors: dict[str, np.ndarray],
    meta: dict[str, Any],
    compressor: str,
    level: int | None,
    shuffle: int,
    config: dict[str, Any] | None,
    tokenizer: str | None,
) -> bytes:
    """MAGIC + id byte + the compressed safetensors file holding `tensors` and `meta` (canonical JSON),
    then the payload's SHA-256. `config` (the run settings the weights are scored with) and `tokenizer`
    (the SHA-256 of the tokenizer they were trained with) join `meta` when given."""
    meta = meta | ({"config": config} if config else {}) | ({TOKENIZER_KEY: tokenizer} if tokenizer else {})
    data = payload_bytes(tensors, meta)
    return MAGIC + pack_body(data, compressor, level, shuffle) + hashlib.sha256(data).digest()


def pack_body(payload: bytes, compressor: str, level: int | None = None, shuffle: int = 0) -> bytes:
    """The container's body: the id byte and the compressed payload (core/common/compress.py: `pack`), or the
    pergroup compressor's streams (core/common/pergroup.py)."""
    if compressor != compress.PERGROUP:
        return compress.pack(payload, compressor, level, shuffle)
    return compress.id_byte(payload, compressor, shuffle) + pergroup.pack(payload, shuffle)


def unpack_body(body: bytes) -> tuple[bytes, str, int]:
    """(payload, compressor name, shuffle stride) of `pack_body`'s bytes; ValueError when damaged."""
    if body and compress.compressor_by_id(body[0] & ~compress.SHUFFLE_FLAG).name == compress.PERGROUP:
        payload, stride = pergroup.unpack(body[1:], bool(body[0] & compress.SHUFFLE_FLAG))
        return payload, compress.PERGROUP, stride
    return compress.unpack(body)


def payload_bytes(tensors: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> bytes:
    """The safetensors file a container compresses: `tensors` and, when given, `meta` (canonical JSON)."""
    # One metadata key: safetensors keeps metadata in a hash map, whose order could vary.
    # (np.require, not ascontiguousarray: that one turns 0-d scales into shape (1,).)
    text = None if meta is None else json.dumps(meta, sort_keys=True, separators=(",", ":"))
    return st_save(
        {k: np.require(v, requirements="C") for k, v in tensors.items()},
        metadata=None if text is None else {META_KEY: text},
    )


def open_container(blob: bytes) -> Container:
    """The parts of a pgolf container, as a run reads back the one it has just written; ValueError (to
    be worded by the caller) when damaged. The readers of other files open theirs with `open_any`:
    the first container too, and its metadata checked."""
    if not blob.startswith(MAGIC):
        raise ValueError("not a pgolf container (no magic bytes)")
    if len(blob) < len(MAGIC) + 1 + DIGEST_BYTES:
        raise ValueError("file ends before its checksum")
    payload, compressor, shuffle = unpack_body(blob[len(MAGIC) : -DIGEST_BYTES])
    if hashlib.sha256(payload).digest() != blob[-DIGEST_BYTES:]:
        raise ValueError("its content does not match its checksum (the file is damaged)")
    tensors = st_load(payload)
    try:
        header = json.loads(payload[8 : 8 + int.from_bytes(payload[:8], "little")])
        meta = json.loads(header.get("__metadata__", {}).get(META_KEY, "null"))
    except RecursionError:  # json's own refusal of deep nesting; its other refusals are ValueErrors
        raise ValueError("its metadata is nested too deep") from None
    return Container(tensors, meta, compressor, shuffle)


def open_any(blob: bytes, source: str | Path) -> Container:
    """The parts of a pgolf container of either layout, as the readers of other files than a run's own
    open them: its metadata checked (a map naming its format); ValueError when damaged. A first
    container gets a warning naming `source`, and is opened as the current layout holding the
    checksum of its own payload."""
    if blob.startswith(MAGIC_V1):
        warnings.warn(
            f"{source} was written before pgolf's containers carried a checksum: damage to it cannot "
            "be detected (export it again to add one)",
            stacklevel=2,
        )
        packed = blob[len(MAGIC_V1) :]
        payload, _, _ = unpack_body(packed)
        blob = MAGIC + packed + hashlib.sha256(payload).digest()
    box = open_container(blob)
    if not isinstance(box.meta, dict) or not isinstance(box.meta.get("format"), str):
        raise ValueError("no pgolf metadata")
    return box


def write_artifact(
    path: str | Path, blob: bytes, compressor: str, read: Callable[[bytes], object] | None = None
) -> ArtifactInfo:
    """Write an artifact's bytes atomically and describe what was written, once both are read back:
    `blob` decoded as a reader will (`read`, by default pgolf's container: decompressed, by lrzip
    too, its payload checked against its checksum) before the file is touched, and the file's bytes
    compared with `blob` after. A compressor whose output does not give back its input, or a disk
    that does not keep the bytes, is a PgolfError, and no file is left at `path`."""
    try:
        (read or open_container)(blob)
    except PgolfError as exc:  # e.g. a compressor's program that failed
        raise PgolfError(f"artifact {path} not written: {exc}") from None
    except Exception as exc:  # what the compressor made does not decompress to what it was given
        raise PgolfError(
            f"artifact {path} not written: its {compressor} bytes do not read back ({first_line(exc)})"
        ) from None
    written = write_atomic(path, blob)
    if read_file(written, "artifact", max(MAX_ARTIFACT_BYTES, len(blob))) != blob:
        written.unlink(missing_ok=True)
        raise PgolfError(f"artifact {path}: the file read back differs from what was written (removed it)")
    return ArtifactInfo(written, len(blob))
