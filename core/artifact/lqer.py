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
`corrections` works on the quantized arrays; core/artifact/mixed.py's `add_lqer` gives a mixed-precision
model its corrections with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from core.artifact.quantized import _in_dtype, dequantize_rows
from core.artifact.rowquant import absmax_rows


@dataclass(frozen=True)
class LqerSettings:
    rank: int = 4
    top_k: int = 3
    factor_bits: int = 4
    asym: bool = True
    group: int = 64


def pack_sym(a: np.ndarray, b: np.ndarray, bits: int) -> dict[str, np.ndarray]:
    """A and B as int-`bits` rows with fp16 scales: {qA, sA, qB, sB}."""
    top = 2 ** (bits - 1) - 1
    (q_a, s_a), (q_b, s_b) = (absmax_rows(x, top, -top, top) for x in (a, b))
    return {"qA": q_a, "sA": s_a, "qB": q_b, "sB": s_b}


def pack_asym(a: np.ndarray, b: np.ndarray, group: int) -> dict[str, np.ndarray]:
    """A as int2 with one fp16 scale, B as int4 with one fp16 scale per `group` values: {qA, sA, qB, sB}."""
    q_a, s_a = absmax_rows(a.reshape(1, -1), 1.5, -2, 1)
    q_b, s_b = absmax_rows(b.reshape(-1, group), 7.5, -8, 7)
    return {"qA": q_a.reshape(a.shape), "sA": s_a.reshape(()), "qB": q_b.reshape(b.shape), "sB": s_b}


def correction(packed: dict[str, np.ndarray]) -> np.ndarray:
    """A_q @ B_q in float32 (rows x cols), for either packing: A's scales are per row (sym) or one (asym),
    B's per row (sym) or per group of its values (asym)."""
    q_a, s_a, q_b, s_b = (packed[k] for k in ("qA", "sA", "qB", "sB"))
    return dequantize_rows(q_a, s_a) @ dequantize_rows(q_b.reshape(s_b.size, -1), s_b).reshape(q_b.shape)


def ranked_errors(
    state: Mapping[str, np.ndarray],
    quantized: Mapping[str, np.ndarray],
    scales: Mapping[str, np.ndarray],
    dtypes: Mapping[str, str],
) -> list[tuple[str, np.ndarray]]:
    """The quantization errors W - W_q of the `quantized` matrices (rows of `scales`) made of `state`,
    largest Frobenius norm first: the order LQER corrects them in. W is each as it was given, in the
    precision of its model dtype (`dtypes`)."""
    errors = {}
    for name, q in quantized.items():
        if q.ndim == 2:
            w = _in_dtype(np.asarray(state[name], dtype=np.float32), dtypes[name])
            errors[name] = w - dequantize_rows(q, scales[name])
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


def corrections(
    errors: list[tuple[str, np.ndarray]], lqer: LqerSettings
) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """Name -> (kind, packed factors): the corrections `lqer` asks for, of its `lqer.top_k` first errors
    of `ranked_errors`."""
    return {
        name: factors(np.linalg.svd(error, full_matrices=False), lqer) for name, error in errors[: lqer.top_k]
    }
