"""The goldens written by tests/golden/make_quant_goldens.py from the challenge record's own code."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

GOLDEN = Path(__file__).resolve().parent / "golden"
QUANT_GOLDENS = GOLDEN / "quant_goldens.safetensors"
RECORD_PTZ = GOLDEN / "record_int6.ptz"


@cache
def goldens() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, metadata) of quant_goldens.safetensors."""
    with safe_open(QUANT_GOLDENS, "np") as f:
        meta = json.loads(f.metadata()["golden"])
        return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118 (safe_open is not a dict)
