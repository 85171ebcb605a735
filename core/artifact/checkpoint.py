"""Resumable training checkpoints, in a framework-neutral form.

A checkpoint is one safetensors file: parameters under `param/<name>`, optimizer
state under `opt/<key>` (the canonical layout of `core.model.backend`), and one JSON
metadata entry with the config, the step, the training clock, the data
position and a sha256 over the tensors and the rest of that metadata (checked on
load; a file without it is refused). Version 1 files, whose sha256 covered the
tensors alone, still load, with a warning. Either backend can resume from a
checkpoint the other wrote.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from core.artifact.int8 import check_finite
from core.common.errors import PgolfError
from core.common.files import open_regular, read_file, write_atomic

CHECKPOINT_FORMAT = "pgolf-checkpoint"
CHECKPOINT_VERSION = 2  # 2: the sha256 covers the metadata too; 1: the tensors alone
MAX_CHECKPOINT_BYTES = 2**36  # 64 GiB: a checkpoint is read whole into memory


@dataclass
class Checkpoint:
    params: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    config: dict[str, Any]
    step: int = 0  # optimizer steps completed
    train_time_ms: float = 0.0  # training clock at the checkpoint (validation excluded)
    data_state: dict[str, Any] = field(default_factory=dict)  # TokenStream.state()
    backend: str = ""  # which backend wrote it (informational)
    dtypes: dict[str, str] = field(default_factory=dict)  # storage dtype of each parameter in the model


def tensors_digest(tensors: dict[str, np.ndarray]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        digest.update(a.data)
    return digest.hexdigest()


def checkpoint_digest(tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> str:
    """sha256 over the tensors (`tensors_digest`) and the metadata but its "sha256", as canonical JSON."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    digest = hashlib.sha256(tensors_digest(tensors).encode())
    digest.update(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())
    return digest.hexdigest()


def save_checkpoint(path: str | Path, ckpt: Checkpoint) -> Path:
    path = Path(path)
    tensors = {f"param/{k}": np.require(v, requirements="C") for k, v in ckpt.params.items()}
    tensors.update({f"opt/{k}": np.require(v, requirements="C") for k, v in ckpt.optimizer.items()})
    meta = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": ckpt.config,
        "step": ckpt.step,
        "train_time_ms": ckpt.train_time_ms,
        "data_state": ckpt.data_state,
        "backend": ckpt.backend,
        "dtypes": ckpt.dtypes,
    }
    meta["sha256"] = checkpoint_digest(tensors, meta)
    blob = st_save(tensors, metadata={"pgolf": json.dumps(meta, sort_keys=True, separators=(",", ":"))})
    write_atomic(path, blob)
    return path


def is_checkpoint(path: str | Path) -> bool:
    """Cheap sniff: a `.safetensors` file (what a damaged checkpoint is still called), or a
    safetensors header whose metadata names our checkpoint format."""
    if Path(path).suffix == ".safetensors":
        return True
    try:
        with open_regular(path, "checkpoint") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            n = int.from_bytes(head, "little")
            return n < 100_000_000 and CHECKPOINT_FORMAT.encode() in f.read(min(n, 1_000_000))
    except (OSError, PgolfError):
        return False


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    blob = read_file(path, "checkpoint", MAX_CHECKPOINT_BYTES)
    if len(blob) < 9:
        raise PgolfError(f"checkpoint {path}: only {len(blob)} bytes: truncated, or not a checkpoint")
    try:
        if blob[8:9] != b"{":  # a safetensors header is JSON: its first byte is "{"
            raise ValueError("not safetensors")
        n = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8 : 8 + n]) if len(blob) >= 8 + n else None
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"] if header else []
        if header is None or len(blob) < 8 + n + max(ends, default=0):
            raise PgolfError(
                f"checkpoint {path}: truncated ({len(blob):,} bytes, fewer than its header promises)"
            )
        tensors = st_load(blob)
        meta = json.loads(header["__metadata__"]["pgolf"])
    except (SafetensorError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise PgolfError(f"checkpoint {path}: not a pgolf checkpoint (corrupt or wrong file)") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise PgolfError(f"checkpoint {path}: not a pgolf checkpoint")
    version = meta.get("version")
    if version not in (1, CHECKPOINT_VERSION):
        raise PgolfError(f"checkpoint {path}: unsupported version {version}")
    if "sha256" not in meta:
        raise PgolfError(f"checkpoint {path}: has no checksum (damaged, or written before pgolf wrote one)")
    expected = tensors_digest(tensors) if version == 1 else checkpoint_digest(tensors, meta)
    if meta["sha256"] != expected:
        raise PgolfError(f"checkpoint {path}: its content does not match its checksum (the file is damaged)")
    if version == 1:
        warnings.warn(
            f"checkpoint {path} was written before checkpoints covered their step, clock and data "
            "position with their checksum: only its tensors are checked",
            stacklevel=2,
        )
    _check_metadata(meta, path)
    try:
        check_finite(tensors)
    except ValueError as exc:
        raise PgolfError(f"checkpoint {path}: {exc}") from None
    params = {k.removeprefix("param/"): v for k, v in tensors.items() if k.startswith("param/")}
    optimizer = {k.removeprefix("opt/"): v for k, v in tensors.items() if k.startswith("opt/")}
    return Checkpoint(
        params=params,
        optimizer=optimizer,
        config=meta["config"],
        step=int(meta["step"]),
        train_time_ms=float(meta["train_time_ms"]),
        data_state=meta.get("data_state", {}),
        backend=meta.get("backend", ""),
        dtypes=meta.get("dtypes", {}),
    )


def checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The config a checkpoint was trained with, from its header alone (the tensors are not read)."""
    path = Path(path)
    if not path.is_file():
        raise PgolfError(f"checkpoint {path}: not a regular file")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            body = f.read(min(int.from_bytes(head.ljust(8, b"\0"), "little"), 100_000_000))
    except OSError as exc:
        raise PgolfError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    return _metadata(head, body, path)["config"]


def _metadata(head: bytes, rest: bytes, path: Path) -> dict[str, Any]:
    """The checked pgolf metadata of a checkpoint: its first 8 bytes, then at least its header."""
    try:
        n = int.from_bytes(head, "little")
        if len(head) < 8 or len(rest) < n:
            raise ValueError("short")
        meta = json.loads(json.loads(rest[:n])["__metadata__"]["pgolf"])
    except (ValueError, KeyError, TypeError):
        raise PgolfError(f"checkpoint {path}: not a pgolf checkpoint (corrupt or wrong file)") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise PgolfError(f"checkpoint {path}: not a pgolf checkpoint")
    if meta.get("version") not in (1, CHECKPOINT_VERSION):
        raise PgolfError(f"checkpoint {path}: unsupported version {meta.get('version')}")
    _check_metadata(meta, path)
    return meta


def _check_metadata(meta: dict[str, Any], path: Path) -> None:
    """Each metadata field has the type the loop relies on, or the file is refused by name."""
    expected = {
        "config": (dict, "an object"),
        "step": (int, "a whole number >= 0"),
        "train_time_ms": ((int, float), "a number >= 0"),
        "data_state": (dict, "an object"),
        "backend": (str, "a string"),
        "dtypes": (dict, "an object"),
    }
    optional = ("data_state", "backend", "dtypes")  # written by every version, not needed to resume
    for key, (kind, wanted) in expected.items():
        if key in optional and key not in meta:
            continue
        value = meta.get(key)
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if ok and key in ("step", "train_time_ms"):
            ok = 0 <= value < float("inf")
        if not ok:
            raise PgolfError(f"checkpoint {path}: metadata {key!r} must be {wanted}, got {value!r}")
