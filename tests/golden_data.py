"""The goldens: the quantization goldens written by tests/golden/make_quant_goldens.py from the challenge
record's own code, the records' golden files read back, and a record's environment as a config."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

from core.config.fields import from_env
from core.config.presets import preset

GOLDEN = Path(__file__).resolve().parent / "golden"
QUANT_GOLDENS = GOLDEN / "quant_goldens.safetensors"
RECORD_PTZ = GOLDEN / "record_int6.ptz"


@cache
def goldens() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, metadata) of quant_goldens.safetensors."""
    with safe_open(QUANT_GOLDENS, "np") as f:
        meta = json.loads(f.metadata()["golden"])
        return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118 (safe_open is not a dict)


# ---------------------------------------- the records' golden files
def read_golden(path: Path, prefix: str) -> tuple[dict, dict[str, np.ndarray]]:
    if not path.is_file():
        pytest.skip(f"golden file {path} is missing")
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
        tensors = {k.removeprefix(prefix): f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}  # noqa: SIM118 (safe_open is not a dict)
    return meta, tensors


def record_config(env: dict[str, str]):
    """pgolf's config for a record's environment: fp32, eager, the record's fixed choices."""
    # Variables pgolf has no field for, at the values its model implies.
    assert env.get("EMBEDDING_DIM", env["MODEL_DIM"]) == env["MODEL_DIM"]
    assert env.get("EVAL_SEQ_LEN", env["TRAIN_SEQ_LEN"]) == env["TRAIN_SEQ_LEN"]
    assert env.get("FUSED_CE_ENABLED", "0") == "0"
    # Not environment switches in the record: leaky-ReLU(0.5)^2 MLP (the rest is pgolf's baseline).
    return (
        preset("smoke")
        .replace(**from_env(env), mlp_activation="leaky_relu2", compute_dtype="float32", compile="off")
        .validate()
    )
