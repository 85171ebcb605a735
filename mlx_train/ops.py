"""The model's three heavy operations, in one version for the Metal GPU and one for CPUs.

- `linear(x, w)`: x @ w.T, with w cast to x's dtype first;
- `attention(q, k, v, scale, lower)`: causal attention with grouped key/value heads; with `lower`
  (B, T) query t sees only keys lower[b, t]..t (document masking);
- `token_losses(x, w, targets, softcap)`: cross-entropy of softcap * tanh(x @ w.T / softcap).

GPU_OPS uses MLX's fused Metal kernels (`mx.fast`) and native bf16 matmuls.
A CPU has neither: there `mx.fast` attention falls back to composite operations
that keep every layer's (T, T) scores and probabilities for the backward pass, and
a bf16 matmul runs through a generic loop instead of BLAS. CPU_OPS computes the
same functions with less time and memory:
- a bf16 matmul rounds its operands to bf16, multiplies them with the fp32 BLAS
  GEMM (accumulating in fp32, like MLX's own bf16 kernel) and rounds the result to bf16;
- attention runs in blocks of query rows, each against only the keys it can see,
  in fp32; the backward pass keeps q, k and v only and recomputes the probabilities;
- the loss runs in chunks of tokens and recomputes each chunk's logits in the
  backward pass instead of keeping them.
Both versions agree to fp32 round-off (tests/test_mlx_ops.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import mlx.core as mx
import mlx.nn as nn

F32 = mx.float32
BLOCK_ELEMENTS = 1 << 19  # scores or logits (2 MiB in fp32) computed at a time on a CPU


# ------------------------------------------------------------------ Metal GPU
def fused_linear(x: mx.array, w: mx.array) -> mx.array:
    return x @ w.astype(x.dtype).T


def segment_mask(lower: mx.array, t: int, s: int) -> mx.array:
    """Which keys each query sees (B, 1, T, S): query t at position S - T + t sees keys lower[b, t] .. itself."""
    keys = mx.arange(s)
    return ((keys <= mx.arange(s - t, s)[:, None]) & (keys >= lower[..., None]))[:, None]


def fused_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, lower: mx.array | None = None
) -> mx.array:
    mask = "causal" if lower is None else segment_mask(lower, q.shape[2], k.shape[2])
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def softcap_logits(x: mx.array, w: mx.array, softcap: float, linear: Callable = fused_linear) -> mx.array:
    """softcap * tanh(x @ w.T / softcap) in x's dtype."""
    return softcap * mx.tanh(linear(x, w) / softcap)


def fused_token_losses(x: mx.array, w: mx.array, targets: mx.array, softcap: float) -> mx.array:
    logits = softcap_logits(x, w, softcap).astype(F32)
    return nn.losses.cross_entropy(logits, targets, reduction="none")


# ----------------------------------------------------------------------- CPU
@mx.custom_function
def _linear_via_fp32(x: mx.array, w: mx.array) -> mx.array:
    return (x.astype(F32) @ w.astype(x.dtype).astype(F32).T).astype(x.dtype)


@_linear_via_fp32.vjp
def _linear_via_fp32_vjp(primals, cotangent, output):
    x, w = primals
    g = cotangent.astype(F32)
    dx = g @ w.astype(x.dtype).astype(F32)
    dw = g.reshape(-1, g.shape[-1]).T @ x.astype(F32).reshape(-1, x.shape[-1])
    return dx.astype(x.dtype), dw.astype(w.dtype)


def blas_linear(x: mx.array, w: mx.array) -> mx.array:
    return fused_linear(x, w) if x.dtype == F32 else _linear_via_fp32(x, w)


def _spans(n: int, row_elements: int) -> list[tuple[int, int]]:
    """[start, end) runs of rows covering 0..n, each of at most BLOCK_ELEMENTS elements (one row at least)."""
    rows = max(1, BLOCK_ELEMENTS // row_elements)
    return [(i, min(i + rows, n)) for i in range(0, n, rows)]


def _query_blocks(q: mx.array) -> list[tuple[int, int]]:
    b, h, t, _ = q.shape
    return _spans(t, b * h * t)  # a query row holds (B, H) rows of T scores


def _block_probs(
    q5: mx.array, k5: mx.array, start: int, end: int, scale: float, lower: mx.array | None = None
) -> mx.array:
    """Softmax probabilities of queries start:end over keys 0:end, shape (B, KV, G, end-start, end);
    with `lower` (B, T) query t sees keys lower[b, t]..t only."""
    scores = (q5[..., start:end, :] * scale) @ k5[..., :end, :].swapaxes(-1, -2)
    hidden = mx.arange(end)[None, :] > mx.arange(start, end)[:, None]
    if lower is not None:  # (B, 1, 1, end-start, end), the segment's earlier keys only
        hidden = hidden | (mx.arange(end) < lower[:, start:end, None])[:, None, None]
    return mx.softmax(mx.where(hidden, -mx.inf, scores), axis=-1)


def _grouped(q: mx.array, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """fp32 views with query head h = kv * G + g as (B, KV, G, T, D), keys/values as (B, KV, 1, T, D)."""
    b, h, t, d = q.shape
    kv = k.shape[1]
    return q.astype(F32).reshape(b, kv, h // kv, t, d), k.astype(F32)[:, :, None], v.astype(F32)[:, :, None]


@cache
def _blocked_attention(scale: float, masked: bool) -> Callable:
    """The blocked attention for one scale; `masked`: it takes the segment starts `lower` as a 4th input."""

    @mx.custom_function
    def attention(q: mx.array, k: mx.array, v: mx.array, *lower: mx.array) -> mx.array:
        q5, k5, v5 = _grouped(q, k, v)
        low = lower[0] if masked else None
        out = [_block_probs(q5, k5, s, e, scale, low) @ v5[..., :e, :] for s, e in _query_blocks(q)]
        return mx.concatenate(out, axis=3).reshape(q.shape).astype(q.dtype)

    @attention.vjp
    def attention_vjp(primals, cotangent, output):
        q, k, v, *lower = primals
        low = lower[0] if masked else None
        q5, k5, v5 = _grouped(q, k, v)
        do5 = cotangent.astype(F32).reshape(q5.shape)
        t = q.shape[2]
        dq = []
        dk = mx.zeros(k.shape, F32)
        dv = mx.zeros(v.shape, F32)
        for s, e in _query_blocks(q):
            p = _block_probs(q5, k5, s, e, scale, low)
            do = do5[..., s:e, :]
            dp = do @ v5[..., :e, :].swapaxes(-1, -2)
            ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
            dq.append((ds @ k5[..., :e, :]) * scale)
            pad = [(0, 0), (0, 0), (0, t - e), (0, 0)]
            dk = dk + mx.pad((ds.swapaxes(-1, -2) @ q5[..., s:e, :]).sum(axis=2) * scale, pad)
            dv = dv + mx.pad((p.swapaxes(-1, -2) @ do).sum(axis=2), pad)
        dq = mx.concatenate(dq, axis=3).reshape(q.shape)
        return (
            dq.astype(q.dtype),
            dk.astype(k.dtype),
            dv.astype(v.dtype),
            *(mx.zeros_like(a) for a in lower),
        )

    return attention


def blocked_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, lower: mx.array | None = None
) -> mx.array:
    if lower is None:
        return _blocked_attention(float(scale), False)(q, k, v)
    return _blocked_attention(float(scale), True)(q, k, v, lower)


@cache
def _chunked_token_losses(softcap: float) -> Callable:
    def capped(x: mx.array, w: mx.array) -> mx.array:
        return softcap_logits(x, w, softcap, blas_linear).astype(F32)

    @mx.custom_function
    def token_losses(x: mx.array, w: mx.array, targets: mx.array) -> mx.array:
        out = []
        for s, e in _spans(x.shape[0], w.shape[0]):
            logits = capped(x[s:e], w)
            picked = mx.take_along_axis(logits, targets[s:e, None], axis=-1)[:, 0]
            out.append(mx.logsumexp(logits, axis=-1) - picked)
        return mx.concatenate(out)

    @token_losses.vjp
    def token_losses_vjp(primals, cotangent, output):
        x, w, targets = primals
        vocab = w.shape[0]
        w_used = w.astype(x.dtype).astype(F32)
        dx, dw = [], mx.zeros(w.shape, F32)
        for s, e in _spans(x.shape[0], vocab):
            logits = capped(x[s:e], w)
            onehot = mx.arange(vocab)[None, :] == targets[s:e, None]
            dcapped = cotangent[s:e, None].astype(F32) * (mx.softmax(logits, axis=-1) - onehot)
            dlogits = dcapped * (1.0 - mx.square(logits / softcap))  # d/dz of c tanh(z/c)
            dx.append(dlogits @ w_used)
            dw = dw + dlogits.T @ x[s:e].astype(F32)
        return mx.concatenate(dx).astype(x.dtype), dw.astype(w.dtype), mx.zeros_like(targets)

    return token_losses


def chunked_token_losses(x: mx.array, w: mx.array, targets: mx.array, softcap: float) -> mx.array:
    d = x.shape[-1]
    losses = _chunked_token_losses(float(softcap))(x.reshape(-1, d), w, targets.reshape(-1))
    return losses.reshape(targets.shape)


# ---------------------------------------------------------------- selection
@dataclass(frozen=True)
class Ops:
    name: str
    linear: Callable[[mx.array, mx.array], mx.array]
    attention: Callable[..., mx.array]  # (q, k, v, scale, lower=None)
    token_losses: Callable[[mx.array, mx.array, mx.array, float], mx.array]


GPU_OPS = Ops("gpu", fused_linear, fused_attention, fused_token_losses)
CPU_OPS = Ops("cpu", blas_linear, blocked_attention, chunked_token_losses)


def default_ops() -> Ops:
    return GPU_OPS if mx.default_device() == mx.gpu else CPU_OPS
