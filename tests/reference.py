"""An independent numpy float64 implementation of the model and optimizers, for parity tests.

Written from the formulas, with explicit loops and no framework: if a backend
and this file agree, both implement the spec (or both misread it the same way).
"""

from __future__ import annotations

import numpy as np

from core.config import Config

EPS32 = float(np.finfo(np.float32).eps)  # RMSNorm epsilon in fp32 (the torch convention)


def rms_norm(x: np.ndarray) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis, eps the fp32 machine epsilon."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS32)


def rope(x: np.ndarray, base: float) -> np.ndarray:
    """x: (B, H, T, D). Rotate (x1, x2) halves by -theta: (x1 cos + x2 sin, -x1 sin + x2 cos)."""
    t, d = x.shape[2], x.shape[3]
    theta = np.arange(t)[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]  # (T, D/2)
    cos, sin = np.cos(theta), np.sin(theta)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], axis=-1)


def attention(params: dict, prefix: str, cfg: Config, x: np.ndarray) -> np.ndarray:
    """Grouped-query causal attention of x (B, T, d), head by head with an explicit softmax."""
    b, t, d = x.shape
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def heads(name: str, n: int) -> np.ndarray:
        return (x @ params[prefix + name].T).reshape(b, t, n, hd).transpose(0, 2, 1, 3)

    q, k, v = heads("c_q.weight", h), heads("c_k.weight", kv), heads("c_v.weight", kv)
    q, k = rope(rms_norm(q), cfg.rope_base), rope(rms_norm(k), cfg.rope_base)
    q = q * params[prefix + "q_gain"][None, :, None, None]
    out = np.zeros((b, h, t, hd))
    mask = np.tril(np.ones((t, t), dtype=bool))
    for head in range(h):
        group = head // (h // kv)  # query heads share key/value heads in order
        scores = q[:, head] @ k[:, group].transpose(0, 2, 1) / np.sqrt(hd)  # (B, T, T)
        scores = np.where(mask, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        out[:, head] = weights @ v[:, group]
    y = out.transpose(0, 2, 1, 3).reshape(b, t, d)
    return y @ params[prefix + "proj.weight"].T


def block(params: dict, i: int, cfg: Config, x: np.ndarray, x0: np.ndarray) -> np.ndarray:
    """Block i: mix with x0, then the scaled attention and relu^2-MLP residual branches."""
    p = f"blocks.{i}."
    mix = params[p + "resid_mix"]
    x = mix[0] * x + mix[1] * x0
    x = x + params[p + "attn_scale"] * attention(params, p + "attn.", cfg, rms_norm(x))
    hidden = np.maximum(rms_norm(x) @ params[p + "mlp.fc.weight"].T, 0.0) ** 2
    return x + params[p + "mlp_scale"] * (hidden @ params[p + "mlp.proj.weight"].T)


def reference_logits(params: dict[str, np.ndarray], cfg: Config, x: np.ndarray) -> np.ndarray:
    """Logits (B, T, V) after the softcap for token ids x (B, T), in float64."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    h = rms_norm(p["tok_emb.weight"][x])
    x0, skips = h, []
    encoder = cfg.num_layers // 2
    for i in range(encoder):
        h = block(p, i, cfg, h, x0)
        skips.append(h)
    for j, i in enumerate(range(encoder, cfg.num_layers)):
        if skips:
            h = h + p["skip_weights"][j] * skips.pop()
        h = block(p, i, cfg, h, x0)
    head = p["tok_emb.weight"] if cfg.tie_embeddings else p["lm_head.weight"]
    z = rms_norm(h) @ head.T
    return cfg.logit_softcap * np.tanh(z / cfg.logit_softcap)


def reference_loss(params: dict[str, np.ndarray], cfg: Config, x: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy in nats of targets y (B, T) after inputs x (B, T)."""
    z = reference_logits(params, cfg, x)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return float(-np.take_along_axis(logp, y[..., None], axis=-1).mean())


def reference_muon_update(
    param: np.ndarray, grad: np.ndarray, buf: np.ndarray, lr: float, momentum: float, steps: int
) -> tuple[np.ndarray, np.ndarray]:
    """One Muon step on a 2-D matrix: (new param, new momentum buffer)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    buf = momentum * buf + grad
    g = grad + momentum * buf
    x = g / (np.linalg.norm(g) + 1e-7)
    rows, cols = g.shape
    if rows > cols:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    if rows > cols:
        x = x.T
    return param - lr * np.sqrt(max(1.0, rows / cols)) * x, buf


def reference_adam_update(
    param: np.ndarray,
    grad: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One bias-corrected Adam step (step = 1 on the first): (new param, m, v)."""
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v
