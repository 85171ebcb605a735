"""What pgolf's two quantized formats share: the model they hold, its tensors by role, the rounding
of float weights, the quantiles of |w| they clip with, and the byte budget's report.

The formats: the challenge's int8 (core/artifact/int8_format.py, "int8_clean_per_row_v1") and
core/artifact/mixed.py's mixed precision; both keep a model's tensors by role (`model_parts`: the
`role/` of each tensor's name in the container) and round float weights the same way (`float_weight`,
`to_float16`, `dequantize_rows`); their clips are quantiles of |w| along rows, bit for bit as
torch.quantile computes them (`abs_quantile`: the int8 format's clip, the mixed format's percentile
and searched clips). The container both are written in is core/artifact/container.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.common.errors import PgolfError
from core.config.fields import BUDGET_BYTES
from core.model.params import round_to_bfloat16

__all__ = [
    "Int8Model",
    "dequantize_rows",
    "round_to_bfloat16",
    "size_report",
]

CONTAINER_FORMAT = "pgolf-int8"  # the int8 format's name in the metadata (its version: int8_format.py)
KEEP_FLOAT_MAX_NUMEL = 65_536
CLIP_QUANTILE = 99.99984 / 100.0

FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # the float dtypes a model may hold


@dataclass
class QuantizedModel:
    """What a model of either format (int8's, core/artifact/mixed.py's) holds: by role in the container
    (`model_parts`), and the SHA-256 of its tokenizer (read from the container's metadata,
    core/artifact/container.py's TOKENIZER_KEY)."""

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


# ------------------------------------------------ a model in the container
def model_parts(model: QuantizedModel) -> dict[str, dict[str, np.ndarray]]:
    """A quantized model's arrays (int8's or mixed's) by their role in the container: the `role/` of each
    tensor's name there."""
    return {"q": model.quantized, "s": model.scales, "p": model.passthrough}


def container_tensors(model: QuantizedModel) -> dict[str, np.ndarray]:
    """The tensors of a container holding `model`, named `role/name` (`model_parts`)."""
    return {f"{role}/{k}": v for role, part in model_parts(model).items() for k, v in part.items()}


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
