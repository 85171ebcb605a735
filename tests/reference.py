"""An independent numpy float64 implementation of the model and optimizers, for parity tests.

It covers the baseline and every model feature of the config (partial RoPE, LN scale,
XSA, value embeddings, skip gates, leaky-ReLU^2, fractional MLP width, document-masked attention).

Written from the formulas, with explicit loops and no framework: if a backend
and this file agree, both implement the spec (or both misread it the same way).
"""

from __future__ import annotations

import numpy as np

from core.config.fields import Config
from core.model.params import round_to_bfloat16

EPS32 = float(np.finfo(np.float32).eps)  # RMSNorm epsilon in fp32 (the torch convention)


def rms_norm(x: np.ndarray) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis, eps the fp32 machine epsilon."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS32)


def rope(x: np.ndarray, base: float, dims: int = 0, precision: str = "float32") -> np.ndarray:
    """x: (B, H, T, D). Rotate the halves (x1, x2) of the first `dims` dims (0 = all) by -theta:
    (x1 cos + x2 sin, -x1 sin + x2 cos); the other dims pass unchanged. `precision` (rope_precision):
    bf16_inv_freq rounds the inverse frequencies to bf16, bfloat16 also the positions, angles, cos and sin."""
    t, d = x.shape[2], dims or x.shape[3]
    theta = np.arange(t)[:, None] * base ** (-np.arange(0, d, 2) / d)[None, :]  # (T, d/2)
    if precision != "float32":
        inv_freq = round_to_bfloat16(1.0 / base ** (np.arange(0, d, 2, dtype=np.float32) / d))
        theta = np.arange(t, dtype=np.float32)[:, None] * inv_freq[None, :]
    if precision == "bfloat16":
        theta = round_to_bfloat16(
            round_to_bfloat16(np.arange(t, dtype=np.float32))[:, None] * inv_freq[None, :]
        )
        cos, sin = round_to_bfloat16(np.cos(theta)), round_to_bfloat16(np.sin(theta))
    else:
        cos, sin = np.cos(theta), np.sin(theta)
    x1, x2, rest = x[..., : d // 2], x[..., d // 2 : d], x[..., d:]
    return np.concatenate([x1 * cos + x2 * sin, -x1 * sin + x2 * cos, rest], axis=-1)


def rope_base(cfg: Config, t: int) -> float:
    """RoPE's base for a t-token input: with rope_yarn and t > train_seq_len, scaled so that the slowest
    of the R/2 frequencies, base^(-(R-2)/R), falls by t / train_seq_len."""
    r = cfg.rope_dims or cfg.head_dim
    if not cfg.rope_yarn or t <= cfg.train_seq_len:
        return cfg.rope_base
    return cfg.rope_base * (t / cfg.train_seq_len) ** (r / (r - 2))


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def head_gate(params: dict, prefix: str, cfg: Config, x: np.ndarray, q_raw: np.ndarray) -> np.ndarray:
    """The per-head gate (B, T, H) on the attention output; ones when no attention gate is on."""
    w = cfg.gate_window
    if cfg.attn_out_gate_enabled:
        src = q_raw if cfg.attn_out_gate_src == "q" else x
        return 2.0 * sigmoid(src[..., :w] @ params[prefix + "attn_gate_proj.weight"].T)
    if cfg.gated_attn_enabled:
        return sigmoid(x @ params[prefix + "attn_gate_w"].T)
    if cfg.sparse_attn_gate_enabled:
        return sigmoid(cfg.sparse_attn_gate_scale * (x[..., :w] @ params[prefix + "attn_gate_w"].T))
    return np.ones((*x.shape[:2], cfg.num_heads))


def document_mask(cfg: Config, tokens: np.ndarray) -> np.ndarray:
    """Which keys each query may see (B, T, T): causal, and with varlen_attn_enabled only those of its
    own segment. A segment starts at the row's start and at each BOS, and a document longer than
    max_doc_len is cut every max_doc_len tokens from its start. Token by token, as the records'
    `_build_cu_seqlens` lists the boundaries."""
    b, t = tokens.shape
    mask = np.zeros((b, t, t), dtype=bool)
    for row in range(b):
        doc = 0
        for q in range(t):
            if tokens[row, q] == cfg.bos_id:
                doc = q
            first = doc + (q - doc) // cfg.max_doc_len * cfg.max_doc_len if cfg.varlen_attn_enabled else 0
            mask[row, q, first : q + 1] = True
    return mask


def attention(
    params: dict,
    prefix: str,
    cfg: Config,
    x: np.ndarray,
    v_embed: np.ndarray | None,
    xsa: bool,
    mask: np.ndarray,
) -> np.ndarray:
    """Grouped-query attention of x (B, T, d) under `mask` (B, T, T), head by head with an explicit softmax.

    `v_embed` (B, T, kv_dim) is added to the values; with `xsa` each head's output loses
    its component along the unit vector of its own token's value."""
    b, t, d = x.shape
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def heads(y: np.ndarray, n: int) -> np.ndarray:
        return y.reshape(b, t, n, hd).transpose(0, 2, 1, 3)

    values = x @ params[prefix + "c_v.weight"].T + (0.0 if v_embed is None else v_embed)
    q, k, v = (
        heads(x @ params[prefix + "c_q.weight"].T, h),
        heads(x @ params[prefix + "c_k.weight"].T, kv),
        heads(values, kv),
    )
    base = rope_base(cfg, t)
    precision = cfg.rope_precision if base == cfg.rope_base else "float32"  # rescaled tables are fp32
    q, k = (rope(rms_norm(a), base, cfg.rope_dims, precision) for a in (q, k))
    q = q * params[prefix + "q_gain"][None, :, None, None]
    out = np.zeros((b, h, t, hd))
    for head in range(h):
        group = head // (h // kv)  # query heads share key/value heads in order
        scores = q[:, head] @ k[:, group].transpose(0, 2, 1) / np.sqrt(hd)  # (B, T, T)
        scores = np.where(mask, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        out[:, head] = weights @ v[:, group]
        if xsa:
            unit = v[:, group] / np.maximum(np.linalg.norm(v[:, group], axis=-1, keepdims=True), 1e-12)
            out[:, head] -= (out[:, head] * unit).sum(axis=-1, keepdims=True) * unit
    out = (
        out
        * head_gate(params, prefix, cfg, x, x @ params[prefix + "c_q.weight"].T).transpose(0, 2, 1)[..., None]
    )
    y = out.transpose(0, 2, 1, 3).reshape(b, t, d)
    return y @ params[prefix + "proj.weight"].T


def mixed(params: dict, i: int, x: np.ndarray, x0: np.ndarray) -> np.ndarray:
    mix = params[f"blocks.{i}.resid_mix"]
    return mix[0] * x + mix[1] * x0


def norm_scale(cfg: Config, i: int) -> float:
    """ln_scale: block i's normed inputs are scaled by 1/sqrt(i + 1)."""
    return 1.0 / np.sqrt(i + 1) if cfg.ln_scale else 1.0


def attn_out(
    params: dict, i: int, cfg: Config, x: np.ndarray, v_embed: np.ndarray | None, mask: np.ndarray
) -> np.ndarray:
    """attn_scale * attention(RMSNorm(x)) of block i (XSA on the last xsa_last_n layers)."""
    p = f"blocks.{i}."
    xsa = i >= cfg.num_layers - cfg.xsa_last_n
    y = attention(params, p + "attn.", cfg, rms_norm(x) * norm_scale(cfg, i), v_embed, xsa, mask)
    return params[p + "attn_scale"] * y


def mlp_out(params: dict, i: int, cfg: Config, x: np.ndarray) -> np.ndarray:
    """mlp_scale * MLP(RMSNorm(x)) of block i: relu(u)^2, or leaky_relu(u, 0.5)^2."""
    p = f"blocks.{i}."
    u = rms_norm(x) * norm_scale(cfg, i) @ params[p + "mlp.fc.weight"].T
    slope = 0.5 if cfg.mlp_activation == "leaky_relu2" else 0.0
    hidden = np.where(u > 0, u, slope * u) ** 2
    return params[p + "mlp_scale"] * (hidden @ params[p + "mlp.proj.weight"].T)


def block(
    params: dict,
    i: int,
    cfg: Config,
    x: np.ndarray,
    x0: np.ndarray,
    v_embed: np.ndarray | None,
    mask: np.ndarray,
) -> np.ndarray:
    """Block i: mix with x0, then the scaled attention and MLP residual branches, one after the other."""
    x = mixed(params, i, x, x0)
    x = x + attn_out(params, i, cfg, x, v_embed, mask)
    return x + mlp_out(params, i, cfg, x)


def value_embeddings(p: dict, cfg: Config, x: np.ndarray) -> dict[int, np.ndarray]:
    """Layer -> the value embedding it adds: table row, projected when ve_dim != kv width, times both scales."""
    if not cfg.ve_enabled:
        return {}
    h = p["ve_shared.embed.weight"][x]
    if "ve_shared.proj.weight" in p:
        h = h @ p["ve_shared.proj.weight"].T
    h = h * p["ve_shared.scale"]
    return {layer: h * p[f"ve_layer_scales.{j}"] for j, layer in enumerate(cfg.ve_layer_indices)}


def visit_order(cfg: Config, looping: bool) -> list[int]:
    """Layers in the order they run: with looping, right after loop_end, the segment
    loop_start..loop_end again, num_loops more times."""
    order = []
    for i in range(cfg.num_layers):
        order.append(i)
        if looping and cfg.num_loops > 0 and i == cfg.loop_end:
            for _ in range(cfg.num_loops):
                order.extend(range(cfg.loop_start, cfg.loop_end + 1))
    return order


def take_skip(p: dict, cfg: Config, j: int, h: np.ndarray, skipped: np.ndarray) -> np.ndarray:
    """Decoder position j takes back an encoder output: added, or blended in through a sigmoid gate."""
    skip = p["skip_weights"][j] * skipped
    if not cfg.skip_gates_enabled:
        return h + skip
    gate = 1.0 / (1.0 + np.exp(-p["skip_gates"][j]))
    return (1.0 - gate) * skip + gate * h


def smear(p: dict, cfg: Config, emb: np.ndarray, x: np.ndarray) -> np.ndarray:
    """SmearGate: e_t + lambda * sigmoid(W e_t[:gate_window]) * e_(t-1) for t >= 1 where x_t is not BOS."""
    if not cfg.smear_gate_enabled:
        return emb
    out = emb.copy()
    for t in range(1, emb.shape[1]):
        gate = p["smear_lambda"][0] / (
            1.0 + np.exp(-(emb[:, t, : cfg.gate_window] @ p["smear_gate.weight"][0]))
        )
        keep = (x[:, t] != cfg.bos_id).astype(np.float64)
        out[:, t] += (gate * keep)[:, None] * emb[:, t - 1]
    return out


def reference_logits(
    params: dict[str, np.ndarray], cfg: Config, x: np.ndarray, looping: bool = False
) -> np.ndarray:
    """Logits (B, T, V) after the softcap for token ids x (B, T), in float64.

    The U-Net halves are cut from the visit order (the encoder gets the shorter
    half); decoder position j takes back the latest encoder output while there is
    one and j has a skip weight. Parallel lanes (04-23 form): at the first decoder
    layer >= parallel_start_layer the stream splits in two; skips go to lane 0;
    attention reads lane 0 (mixed with x0), the MLP reads lane 1, both from before
    the layer, and each lane keeps R * itself and takes P-weighted outputs.
    """
    p = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    ve = value_embeddings(p, cfg, x)
    mask = document_mask(cfg, x)
    h = rms_norm(smear(p, cfg, p["tok_emb.weight"][x], x))
    x0, skips = h, []
    order = visit_order(cfg, looping)
    half = len(order) // 2
    for i in order[:half]:
        h = block(p, i, cfg, h, x0, ve.get(i), mask)
        skips.append(h)
    lanes = None
    for j, i in enumerate(order[half:]):
        parallel = 0 < cfg.parallel_start_layer <= i
        if parallel and lanes is None:
            lanes = [h, h]
        if skips and j < len(p["skip_weights"]):
            if parallel:
                lanes[0] = take_skip(p, cfg, j, lanes[0], skips.pop())
            else:
                h = take_skip(p, cfg, j, h, skips.pop())
        if not parallel:
            h = block(p, i, cfg, h, x0, ve.get(i), mask)
            continue
        a = attn_out(p, i, cfg, mixed(p, i, lanes[0], x0), ve.get(i), mask)
        m = mlp_out(p, i, cfg, lanes[1])
        keep, post = p["parallel_resid_lambdas"][i], p["parallel_post_lambdas"][i]
        lanes = [keep[lane] * lanes[lane] + post[0, lane] * a + post[1, lane] * m for lane in (0, 1)]
    if lanes is not None:
        h = {"attn": lanes[0], "mlp": lanes[1], "mean": (lanes[0] + lanes[1]) / 2}[cfg.parallel_final_lane]
    head = p["tok_emb.weight"] if cfg.tie_embeddings else p["lm_head.weight"]
    z = rms_norm(h) @ head.T
    return cfg.logit_softcap * np.tanh(z / cfg.logit_softcap)


def reference_loss(
    params: dict[str, np.ndarray], cfg: Config, x: np.ndarray, y: np.ndarray, looping: bool = False
) -> float:
    """Mean cross-entropy in nats of targets y (B, T) after inputs x (B, T)."""
    z = reference_logits(params, cfg, x, looping)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return float(-np.take_along_axis(logp, y[..., None], axis=-1).mean())


def reference_muon_update(
    param: np.ndarray,
    grad: np.ndarray,
    buf: np.ndarray,
    lr: float,
    momentum: float,
    steps: int,
    wd: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """One Muon step on a 2-D matrix, after decoupled weight decay: (new param, new momentum buffer)."""
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
    return param * (1 - lr * wd) - lr * np.sqrt(max(1.0, rows / cols)) * x, buf


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
    wd: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One bias-corrected AdamW step (step = 1 on the first; decoupled decay): (new param, m, v)."""
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad * grad
    m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
    return param * (1 - lr * wd) - lr * m_hat / (np.sqrt(v_hat) + eps), m, v
