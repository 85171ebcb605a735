"""Resumable training checkpoints, in a framework-neutral form.

A checkpoint is one safetensors file: parameters under `param/<name>`, optimizer
state under `opt/<key>` (the canonical layout of `core.model.backend`), and one JSON
metadata entry with the config, the step, the training clock, the data
position and a sha256 over the tensors and the rest of that metadata (checked on
load; a file without it is refused). Version 1 files, whose sha256 covered the
tensors alone, still load, with a warning. Either backend can resume from a
checkpoint the other wrote. This module writes them; core/artifact/load.py reads them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save as st_save

from core.common.files import write_atomic

CHECKPOINT_FORMAT = "pgolf-checkpoint"
CHECKPOINT_VERSION = 2  # 2: the sha256 covers the metadata too; 1: the tensors alone


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
    # Every field but the tensors, as they are.
    meta = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **vars(ckpt)}
    del meta["params"], meta["optimizer"]
    meta["sha256"] = checkpoint_digest(tensors, meta)
    blob = st_save(tensors, metadata={"pgolf": json.dumps(meta, sort_keys=True, separators=(",", ":"))})
    write_atomic(path, blob)
    return path
