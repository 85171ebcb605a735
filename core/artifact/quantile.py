"""The quantiles of |w| along rows, bit for bit as torch.quantile computes them: the int8 format's clip
(core/artifact/int8_format.py), and the mixed format's percentile and searched clips
(core/artifact/rowquant.py). A mixed run whose classes are all clipped by SDClip (their
`*_clip_sigmas` set, core/artifact/export.py: `class_clips`) computes none: it is packaged without
this module (core/runs/package.py: `OPTIONAL`).
"""

from __future__ import annotations

import numpy as np

from core.artifact.int8 import CLIP_QUANTILE

__all__ = ["abs_quantile", "fma32"]


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
