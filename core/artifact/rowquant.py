"""Per-row int-N quantization (N = 8, 7, 6 or 5) with fp16 scales, and how each row's clip is chosen.

A matrix row w is stored as q = clamp(round(w / s), -R, R) in int8, R = 2**(N-1) - 1
(31 for int6), with one fp16 scale s per row; it comes back as q * s. The clip c sets
the scale, s = fp16(max(c / R, 1 / R)); values past the clip saturate at +-R. This is
the challenge records' `quantize_int6_per_row` (2026-03-22, 2026-04-01) bit for bit:
the division is by the fp16 scale, the quantiles are torch.quantile's. (The floor
1/R is the records' too: a row whose clip is below 1 gets steps of 1/R, coarser than
its values need.)

Ways to choose c (`Clip`):
- "percentile": the q-quantile of |w| in the row (q = 1: its largest |value|);
- "search" (GPTQ-lite): try several quantiles and keep the one with the smallest
  squared reconstruction error, for the whole matrix as the records do (their
  candidates 0.999, 0.9995, 0.9999, 0.99999, 1.0), or for each row on its own;
- "sdclip": c = k * std(row) (2026-04-05; std with Bessel's correction, as torch's).
  Nothing bounds c by the row's largest value; a scale too small for fp16 is raised
  to 1/R (the record would divide by zero there).
Tensors that are not matrices get one scale from their largest |value|, as in the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core.artifact.quantized import abs_quantile, dequantize_rows
from core.common.errors import PgolfError

__all__ = [
    "BITS",
    "SEARCH_QUANTILES",
    "Clip",
    "clip_range",
    "dequantize_rows",
    "quantize_rows",
    "quantize_tensor",
    "row_scales",
]

BITS = (8, 7, 6, 5)
SEARCH_QUANTILES = (0.9990, 0.9995, 0.9999, 0.99999, 1.0)  # the records' GPTQ-lite candidates


def clip_range(bits: int) -> int:
    """R: int-N values lie in [-R, R]."""
    if bits not in BITS:
        raise PgolfError(f"quantization to {bits} bits: choose from {', '.join(map(str, BITS))}")
    return 2 ** (bits - 1) - 1


@dataclass(frozen=True)
class Clip:
    """How each row's clip is chosen (see the module docstring). Its settings are checked where they
    come from: a run's by Config.validate (and `sdclip`, its k), an artifact's by
    core/artifact/checks.py (`clip_from_json`)."""

    kind: str = "search"
    q: float = 1.0  # percentile: the quantile of |w| per row (1.0 = the largest |value|)
    candidates: tuple[float, ...] = SEARCH_QUANTILES  # search: quantiles tried
    per_row: bool = False  # search: best candidate for each row, not one for the whole matrix
    k: float = 0.0  # sdclip: clip = k * std(row)

    @classmethod
    def percentile(cls, q: float) -> Clip:
        return cls("percentile", q=q)

    @classmethod
    def sdclip(cls, k: float) -> Clip:
        """SDClip at `k` standard deviations: a positive number below 1e4, else refused."""
        if not (isinstance(k, int | float) and 0.0 < k < 1e4):
            raise PgolfError(f"sdclip: k = {k!r} should be a positive number of standard deviations")
        return cls("sdclip", k=k)

    @property
    def quantiles(self) -> tuple[float, ...]:
        """The quantiles of |w| this clip tries: none for sdclip."""
        return (self.q,) if self.kind == "percentile" else self.candidates if self.kind == "search" else ()

    def to_json(self) -> dict[str, Any]:
        """Only the fields this kind uses: what an artifact records."""
        if self.kind == "search":
            return {"kind": "search", "candidates": list(self.candidates), "per_row": self.per_row}
        return (
            {"kind": self.kind, "q": self.q} if self.kind == "percentile" else {"kind": "sdclip", "k": self.k}
        )


def row_scales(w: np.ndarray, bits: int, q: float) -> np.ndarray:
    """fp16 per-row scales for clip = the q-quantile of |row| (q = 1: the largest |value|):
    fp16(max(clip / R, 1 / R)), computed in float32 as torch does."""
    r = clip_range(bits)
    if q >= 1.0:
        clip = np.abs(w).max(axis=1)
    else:
        clip = abs_quantile(w, q)
    return np.maximum(clip.astype(np.float32) / np.float32(r), np.float32(1.0 / r)).astype(np.float16)


def _sdclip_scales(w: np.ndarray, bits: int, k: float) -> np.ndarray:
    r = clip_range(bits)
    # torch.std accumulates in float64 and rounds the result to float32.
    std = (
        w.astype(np.float64).std(axis=1, ddof=1).astype(np.float32)
        if w.shape[1] > 1
        else np.zeros(len(w), np.float32)
    )
    s = (np.float32(k) * std / np.float32(r)).astype(np.float16)
    return np.where(s > 0, s, np.float16(1.0 / r))  # fp16 has no room for the record's 1e-10 floor


def candidate_scales(w: np.ndarray, bits: int, clip: Clip) -> list[np.ndarray]:
    """The fp16 per-row scales each candidate of `clip` gives (one array for percentile and sdclip)."""
    if clip.kind == "sdclip":
        return [_sdclip_scales(w, bits, clip.k)]
    return [row_scales(w, bits, q) for q in clip.quantiles]


def squared_errors(w: np.ndarray, q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Per-row sums of the float32 squared reconstruction errors, summed in float64."""
    return np.square(w - dequantize_rows(q, scales)).sum(axis=1, dtype=np.float64)


def pick_best(
    w: np.ndarray, results: list[tuple[np.ndarray, np.ndarray]], per_row: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The (q, scales) with the smallest squared error: for the whole matrix, or row by row.

    Ties keep the earlier candidate (the records' strict `<`).
    """
    if len(results) == 1:
        return results[0]
    errors = np.stack([squared_errors(w, q, s) for q, s in results])  # (candidates, rows)
    if not per_row:
        best = int(np.argmin(errors.sum(axis=1)))  # argmin: the first of equal minima
        return results[best]
    choice, rows = np.argmin(errors, axis=0), np.arange(w.shape[0])  # the best candidate of each row
    q, s = (np.stack(parts)[choice, rows] for parts in zip(*results, strict=True))
    return q, s


def quantize_rows(w: np.ndarray, bits: int = 6, clip: Clip = Clip()) -> tuple[np.ndarray, np.ndarray]:
    """int8 values in [-R, R] and fp16 per-row scales of a float32 matrix (Clip is frozen: one default serves)."""
    w = check_matrix(w, "per-row quantization")
    r = clip_range(bits)
    results = [
        (np.clip(np.round(w / s.astype(np.float32)[:, None]), -r, r).astype(np.int8), s)
        for s in candidate_scales(w, bits, clip)
    ]
    return pick_best(w, results, clip.per_row)


def quantize_tensor(w: np.ndarray, bits: int = 6, clip: Clip = Clip()) -> tuple[np.ndarray, np.ndarray]:
    """`quantize_rows` for a matrix; any other shape gets one 0-d fp16 scale from its largest |value|."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim == 2:
        return quantize_rows(w, bits, clip)
    r = clip_range(bits)
    amax = float(np.abs(w).max()) if w.size else 0.0
    scale = np.array(amax / r if amax > 0 else 1.0, dtype=np.float16)
    q = np.clip(np.round(w / np.float32(scale)), -r, r).astype(np.int8)
    return q, scale


def check_matrix(w: np.ndarray, what: str) -> np.ndarray:
    """`w` as an array, refused (naming `what` takes it) unless a finite float32 matrix with columns."""
    w = np.asarray(w)
    if w.ndim != 2 or w.dtype != np.float32:
        raise PgolfError(f"{what} takes a float32 matrix, not {w.dtype} of shape {w.shape}")
    if w.shape[1] == 0:
        raise PgolfError(f"{what} of a matrix with no columns")
    if not np.isfinite(w).all():
        raise PgolfError(f"{what}: the weights hold NaN or infinite values")
    return w


def absmax_rows(x: np.ndarray, top: float, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows of `x` in [lo, hi], one fp16 scale per row: its largest |value| (at least 1e-10) / top.
    (Also the mixed format's attention gates: top 127, in [-127, 127].)"""
    s = (np.maximum(np.abs(x).max(axis=1), np.float32(1e-10)) / np.float32(top)).astype(np.float16)
    return np.clip(np.rint(x / s.astype(np.float32)[:, None]), lo, hi).astype(np.int8), s
