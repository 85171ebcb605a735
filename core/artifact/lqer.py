"""LQER: a low-rank correction of the quantization error of the worst-quantized matrices.

For each quantized matrix W (rows x cols) with dequantized values W_q, the error E = W - W_q is
measured by its Frobenius norm; the `top_k` largest get a rank-r correction from E's SVD:
A = U[:, :r] * S[:r] (rows x r) and B = Vh[:r] (r x cols), stored quantized, and scoring adds
A_q @ B_q to W_q. Two packings (the 2026-04-27 record's):
- "sym": A and B each int-`bits` with one fp16 scale per row (absmax / (2^(bits-1) - 1));
- "asym": A int2 in [-2, 1] with one fp16 scale (absmax / 1.5), B int4 in [-8, 7] with one fp16
  scale per `group` consecutive values of B flattened (absmax / 7.5). Used when B's size is a
  multiple of the group, else "sym".
Values are float32 until the fp16 scales, rounding half to even, as the record computes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LqerSettings:
    rank: int = 4
    top_k: int = 3
    factor_bits: int = 4
    asym: bool = True
    group: int = 64


def _rows_absmax(x: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(x).max(axis=1), np.float32(1e-10))


def pack_sym(a: np.ndarray, b: np.ndarray, bits: int) -> dict[str, np.ndarray]:
    """A and B as int-`bits` rows with fp16 scales: {qA, sA, qB, sB}."""
    top = np.float32(2 ** (bits - 1) - 1)
    out = {}
    for key, x in (("A", a), ("B", b)):
        s = (_rows_absmax(x) / top).astype(np.float16)
        out["q" + key] = np.clip(np.rint(x / s.astype(np.float32)[:, None]), -top, top).astype(np.int8)
        out["s" + key] = s
    return out


def pack_asym(a: np.ndarray, b: np.ndarray, group: int) -> dict[str, np.ndarray]:
    """A as int2 with one fp16 scale, B as int4 with one fp16 scale per `group` values: {qA, sA, qB, sB}."""
    s_a = (np.maximum(np.abs(a).max(), np.float32(1e-10)) / np.float32(1.5)).astype(np.float16)
    q_a = np.clip(np.rint(a / np.float32(s_a)), -2, 1).astype(np.int8)
    groups = b.reshape(-1, group)
    s_b = (_rows_absmax(groups) / np.float32(7.5)).astype(np.float16)
    q_b = np.clip(np.rint(groups / s_b.astype(np.float32)[:, None]), -8, 7).astype(np.int8).reshape(b.shape)
    return {"qA": q_a, "sA": np.asarray(s_a), "qB": q_b, "sB": s_b}


def correction(packed: dict[str, np.ndarray], kind: str) -> np.ndarray:
    """A_q @ B_q in float32 (rows x cols)."""
    q_a, s_a, q_b, s_b = (packed[k] for k in ("qA", "sA", "qB", "sB"))
    if kind == "asym":
        a = q_a.astype(np.float32) * np.float32(s_a)
        b = (q_b.reshape(s_b.size, -1).astype(np.float32) * s_b.astype(np.float32)[:, None]).reshape(
            q_b.shape
        )
    else:
        a = q_a.astype(np.float32) * s_a.astype(np.float32)[:, None]
        b = q_b.astype(np.float32) * s_b.astype(np.float32)[:, None]
    return a @ b


def ranked_errors(
    weights: dict[str, np.ndarray], dequantized: dict[str, np.ndarray]
) -> list[tuple[str, np.ndarray]]:
    """The quantization errors W - W_q of the matrices of `weights`, largest Frobenius norm first:
    the order LQER corrects them in."""
    errors = {n: weights[n].astype(np.float32) - dequantized[n] for n in weights if weights[n].ndim == 2}
    norms = {n: float(np.linalg.norm(e)) for n, e in errors.items()}
    return [(n, errors[n]) for n in sorted(norms, key=lambda n: (-norms[n], n))]


def factors(
    svd: tuple[np.ndarray, np.ndarray, np.ndarray], settings: LqerSettings
) -> tuple[str, dict[str, np.ndarray]]:
    """(kind, packed factors) of the rank-`settings.rank` correction of one error, given its SVD
    (`np.linalg.svd(error, full_matrices=False)`)."""
    u, s, vh = svd
    r = min(settings.rank, s.size)
    a = np.ascontiguousarray((u[:, :r] * s[:r]).astype(np.float32))
    b = np.ascontiguousarray(vh[:r].astype(np.float32))
    if settings.asym and b.size % settings.group == 0:
        return "asym", pack_asym(a, b, settings.group)
    return "sym", pack_sym(a, b, settings.factor_bits)


def lqer_corrections(
    weights: dict[str, np.ndarray], dequantized: dict[str, np.ndarray], settings: LqerSettings
) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """{name: (kind, packed factors)} for the `top_k` matrices of `weights` whose quantization error
    (against `dequantized`) has the largest Frobenius norm."""
    return {
        name: factors(np.linalg.svd(error, full_matrices=False), settings)
        for name, error in ranked_errors(weights, dequantized)[: settings.top_k]
    }
