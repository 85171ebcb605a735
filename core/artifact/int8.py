"""pgolf's container of an artifact (both formats), what the formats share, and the byte budget.

The formats: the challenge's int8 (core/artifact/int8_format.py, "int8_clean_per_row_v1") and
core/artifact/mixed.py's mixed precision; both keep a model's tensors by role (`model_parts`) and
round float weights the same way (`float_weight`, `to_float16`, `dequantize_rows`); their clips are quantiles of
|w| along rows, bit for bit as torch.quantile computes them (`abs_quantile`: the int8 format's clip, the mixed
format's percentile and searched clips).

pgolf's container holds no pickle. Layout:
    MAGIC (b"PGOLF-INT8\\x01") | 1 byte compressor id | compressed payload | sha256 of the payload
(ids in core/common/compress.py: 0 none, 1 zlib, 2 lzma, 3 bz2, 4 brotli, 5 zstd; bit 0x80
set when the payload was byte-shuffled first; the checksum is the 32 raw bytes of the
digest of the payload before compression, so any change to what the container holds
is refused) where the payload is a safetensors file (readable with numpy alone) with
tensors named `role/name` (`model_parts`), and one metadata entry "pgolf" holding canonical
JSON, its "format" naming the format (CONTAINER_FORMAT for int8, or the mixed one) and the rest
the format's own. The same weights always give the same bytes, whatever order they come in.

Containers written before the checksum (b"PGOLF-INT8\\x00", the same layout without the trailing
digest) are still read by the readers of other files, with a warning (core/artifact/container_v1.py:
`open_any`). A file may be at most MAX_ARTIFACT_BYTES, and its payload at most
compress.MAX_OUTPUT_BYTES. A run reads back the container it has just written as it is (`open_container`:
its checksum says it is what was written); the readers of other files open theirs with
container_v1.open_any (which checks the metadata names a format), then check its metadata and tensor
names (core/artifact/checks.py: `check_container`).

The challenge's own containers (its torch file, its MLX pickle) are core/artifact/upstream.py's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from core.common import compress
from core.common.errors import PgolfError, first_line
from core.common.files import read_file, write_atomic
from core.config.fields import BUDGET_BYTES
from core.model.params import round_to_bfloat16

__all__ = [
    "ArtifactInfo",
    "Container",
    "Int8Model",
    "container_bytes",
    "dequantize_rows",
    "open_container",
    "payload_bytes",
    "round_to_bfloat16",
    "size_report",
]

CONTAINER_FORMAT = "pgolf-int8"  # the int8 format's name in the metadata (its version: int8_format.py)
MAGIC = b"PGOLF-INT8\x01"  # the container with the payload's checksum
DIGEST_BYTES = 32  # sha256
# The metadata key of the SHA-256 of the tokenizer file a model was trained with (absent in older
# artifacts, and where the file was not at hand): a reader given another tokenizer refuses it.
TOKENIZER_KEY = "tokenizer_sha256"
MAX_ARTIFACT_BYTES = 2**30  # 1 GiB, 67 times the challenge's whole budget: anything larger is not an artifact
META_KEY = "pgolf"
KEEP_FLOAT_MAX_NUMEL = 65_536
CLIP_QUANTILE = 99.99984 / 100.0

FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # the float dtypes a model may hold


@dataclass
class QuantizedModel:
    """What a model of either format (int8's, core/artifact/mixed.py's) holds: by role in the container
    (`model_parts`), and the SHA-256 of its tokenizer (read from the container's metadata, TOKENIZER_KEY)."""

    quantized: dict[str, np.ndarray] = field(default_factory=dict)  # int8 (holding int-N values)
    scales: dict[str, np.ndarray] = field(default_factory=dict)  # fp16 per row, or one 0-d
    passthrough: dict[str, np.ndarray] = field(default_factory=dict)
    tokenizer_sha256: str | None = None


@dataclass
class Int8Model(QuantizedModel):
    # Scales: fp16 per row, or a 0-d fp32. Made and read by core/artifact/int8_format.py.
    dtypes: dict[str, str] = field(default_factory=dict)  # original dtype of each quantized tensor
    passthrough_orig_dtypes: dict[str, str] = field(default_factory=dict)  # of those stored as fp16
    qmeta: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ArtifactInfo:
    path: Path
    file_bytes: int


# ------------------------------------------------- rounding, in both formats
def _in_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to what `dtype` can hold (numpy has no bfloat16)."""
    if dtype == "bfloat16":
        return round_to_bfloat16(values)
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    return values.astype(np.float32)


def float_weight(name: str, t: np.ndarray, dtype: str) -> np.ndarray:
    """The float tensor `t` as float32, rounded to `dtype` (its dtype in the model): what upstream
    quantizes. A dtype the formats do not take, NaN or infinities (upstream would cast them to int8,
    which is undefined) are refused."""
    if dtype not in FLOAT_BYTES:
        raise PgolfError(f"quantize: {name} has dtype {dtype}; the format takes {', '.join(FLOAT_BYTES)}")
    w = _in_dtype(t.astype(np.float32), dtype)
    if not np.isfinite(w).all():
        raise PgolfError(f"quantize: {name} holds NaN or infinite values (did training diverge?)")
    return w


def to_float16(name: str, w: np.ndarray) -> np.ndarray:
    """float32 weights stored as float16; values beyond its range are refused."""
    with np.errstate(over="ignore"):  # an overflow to inf is refused just below
        kept = w.astype(np.float16)
    _check_float16_range(name, w, kept)
    return kept


def _check_float16_range(name: str, w: np.ndarray, stored: np.ndarray) -> None:
    """Values or scales beyond float16's range would be stored as infinities: refuse them."""
    if not np.isfinite(stored).all():
        raise PgolfError(
            f"quantize: {name} is too large for the format's float16 (max |w| {np.abs(w).max():.3g}; "
            "did training diverge?)"
        )


def dequantize_rows(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 q * s, with per-row (shape (rows,)) or one (0-d) scale."""
    s = np.asarray(scales).astype(np.float32)
    return q.astype(np.float32) * s.reshape(s.shape + (1,) * (q.ndim - s.ndim))


# ------------------------------------------------------------- pgolf container
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
    pergroup compressor's streams (core/common/pergroup.py, imported for the runs that use it alone)."""
    if compressor != compress.PERGROUP:
        return compress.pack(payload, compressor, level, shuffle)
    from core.common import pergroup

    return compress.id_byte(payload, compressor, shuffle) + pergroup.pack(payload, shuffle)


def unpack_body(body: bytes) -> tuple[bytes, str, int]:
    """(payload, compressor name, shuffle stride) of `pack_body`'s bytes; ValueError when damaged."""
    if body and compress.compressor_by_id(body[0] & ~compress.SHUFFLE_FLAG).name == compress.PERGROUP:
        from core.common import pergroup

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


def model_parts(model: QuantizedModel) -> dict[str, dict[str, np.ndarray]]:
    """A quantized model's arrays (int8's or mixed's) by their role in the container: the `role/` of each
    tensor's name there."""
    return {"q": model.quantized, "s": model.scales, "p": model.passthrough}


def container_tensors(model: QuantizedModel) -> dict[str, np.ndarray]:
    """The tensors of a container holding `model`, named `role/name` (`model_parts`)."""
    return {f"{role}/{k}": v for role, part in model_parts(model).items() for k, v in part.items()}


@dataclass(frozen=True)
class Container:
    tensors: dict[str, np.ndarray]
    # The parsed "pgolf" metadata: a dict with a "format" key (the readers of other files check it:
    # container_v1.open_any).
    meta: dict[str, Any]
    compressor: str
    shuffle: int  # byte-shuffle stride, 0 for none


def open_container(blob: bytes) -> Container:
    """The parts of a pgolf container, as a run reads back the one it has just written; ValueError (to
    be worded by the caller) when damaged. The readers of other files open theirs with
    core/artifact/container_v1.py's `open_any`: the first container too, and its metadata checked."""
    if not blob.startswith(MAGIC):
        raise ValueError("not a pgolf container (no magic bytes)")
    if len(blob) < len(MAGIC) + 1 + DIGEST_BYTES:
        raise ValueError("file ends before its checksum")
    payload, compressor, shuffle = unpack_body(blob[len(MAGIC) : -DIGEST_BYTES])
    if hashlib.sha256(payload).digest() != blob[-DIGEST_BYTES:]:
        raise ValueError("its content does not match its checksum (the file is damaged)")
    tensors = st_load(payload)
    header = json.loads(payload[8 : 8 + int.from_bytes(payload[:8], "little")])
    meta = json.loads(header.get("__metadata__", {}).get(META_KEY, "null"))
    return Container(tensors, meta, compressor, shuffle)


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


def fill_model(model: QuantizedModel, tensors: dict[str, np.ndarray]) -> QuantizedModel:
    """`model` (int8's or mixed's, empty) holding a container's tensors, each `role/name` put in its part
    (`model_parts`, or the mixed format's LQER factors `lqer.<part>/name`)."""
    parts = model_parts(model)
    for key, value in tensors.items():
        role, _, name = key.partition("/")
        if role.startswith("lqer."):
            model.lqer.setdefault(name, {})[role.removeprefix("lqer.")] = value
        else:
            parts[role][name] = value
    return model


# ------------------------------------------------------------------ the budget
def size_report(
    payload_bytes: int, model_bytes: int, code_bytes: int, budget: int = BUDGET_BYTES
) -> dict[str, int]:
    total = model_bytes + code_bytes
    return {
        "payload_bytes": payload_bytes,
        "model_bytes": model_bytes,
        "code_bytes": code_bytes,
        "total_bytes": total,
        "budget_bytes": budget,
        "headroom_bytes": budget - total,
    }


# ------------------------------------------------------------------ quantiles of |w|
def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a*b + c rounded once, as a fused multiply-add (torch's CPU lerp is one)."""
    a64, b64, c64 = (np.asarray(x, dtype=np.float64) for x in (a, b, c))
    p = a64 * b64  # exact: two 24-bit significands fit in float64's 53
    s = p + c64
    t = s - p
    err = (p - (s - t)) + (c64 - t)  # two-sum: the exact rounding error of s
    # Round to odd: an inexact sum moved to its odd neighbour cannot double-round in the float32 cast.
    fix = (err != 0) & ((s.view(np.int64) & 1) == 0) & np.isfinite(s)
    s = np.where(fix, np.nextafter(s, np.copysign(np.inf, err)), s)
    return s.astype(np.float32)


def abs_quantile(w: np.ndarray, q: float = CLIP_QUANTILE) -> np.ndarray:
    """torch.quantile(|w|, q, dim=-1) for a 2-D float32 array, bit for bit.

    torch computes the rank in float32 and interpolates with its lerp: a fused
    multiply-add, from the nearer end (weight < 0.5 or not).
    """
    n = w.shape[-1]
    rank = np.float32(q) * np.float32(n - 1)
    below, above = int(np.floor(rank)), int(np.ceil(rank))
    part = np.partition(np.abs(w), (below, above), axis=-1)
    lo, hi = part[:, below], part[:, above]
    weight = rank - np.float32(below)
    near, weight = (lo, weight) if weight < 0.5 else (hi, weight - np.float32(1))
    return fma32(np.full_like(lo, weight), hi - lo, near)
