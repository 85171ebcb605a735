"""The v1 GPT in MLX: the same modules, maths and parameter names as cuda_train/model.py.

See that file's docstring for the architecture. The conventions are PyTorch's so
that weights mean the same in both backends: RoPE rotates by -theta
(`[x1 cos + x2 sin, -x1 sin + x2 cos]`, not `nn.RoPE`'s default), and RMSNorm's
epsilon is the fp32 machine epsilon in fp32 and bf16 alike (what `F.rms_norm(eps=None)` uses).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from core.config import Config
from core.params import num_skip_weights
from mlx_train.ops import Ops, default_ops, softcap_logits

# F.rms_norm(eps=None) uses the fp32 machine epsilon for fp32 and bf16 inputs alike.
RMS_EPS = float(mx.finfo(mx.float32).eps)


def rms_norm(x: mx.array) -> mx.array:
    return mx.fast.rms_norm(x, None, RMS_EPS)


def rope_tables(seq_len: int, head_dim: int, base: float, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    inv_freq = 1.0 / (base ** (mx.arange(0, head_dim, 2, dtype=mx.float32) / head_dim))
    freqs = mx.arange(seq_len, dtype=mx.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    return mx.cos(freqs).astype(dtype), mx.sin(freqs).astype(dtype)


def apply_rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return mx.concatenate([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], axis=-1)


class CastedLinear(nn.Module):
    """A bias-free linear layer whose fp32 weight is cast to the input dtype at the matmul."""

    def __init__(self, in_dim: int, out_dim: int, ops: Ops):
        super().__init__()
        self.ops = ops
        self.weight = mx.zeros((out_dim, in_dim), dtype=mx.float32)

    def __call__(self, x: mx.array) -> mx.array:
        return self.ops.linear(x, self.weight)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config, ops: Ops):
        super().__init__()
        self.ops = ops
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rope_base = cfg.rope_base
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.c_q = CastedLinear(cfg.model_dim, cfg.model_dim, ops)
        self.c_k = CastedLinear(cfg.model_dim, kv_dim, ops)
        self.c_v = CastedLinear(cfg.model_dim, kv_dim, ops)
        self.proj = CastedLinear(cfg.model_dim, cfg.model_dim, ops)
        self.q_gain = mx.full((cfg.num_heads,), cfg.qk_gain_init, dtype=mx.float32)

    def __call__(self, x: mx.array) -> mx.array:
        b, t, d = x.shape
        q = self.c_q(x).reshape(b, t, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)  # (B, H, T, D)
        k = self.c_k(x).reshape(b, t, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)  # (B, KV, T, D)
        v = self.c_v(x).reshape(b, t, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        q, k = rms_norm(q), rms_norm(k)
        cos, sin = rope_tables(t, self.head_dim, self.rope_base, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q = q * self.q_gain.astype(q.dtype)[None, :, None, None]
        y = self.ops.attention(q, k, v, 1.0 / math.sqrt(self.head_dim))
        return self.proj(y.transpose(0, 2, 1, 3).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: Config, ops: Ops):
        super().__init__()
        self.fc = CastedLinear(cfg.model_dim, cfg.mlp_mult * cfg.model_dim, ops)
        self.proj = CastedLinear(cfg.mlp_mult * cfg.model_dim, cfg.model_dim, ops)

    def __call__(self, x: mx.array) -> mx.array:
        return self.proj(mx.square(nn.relu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: Config, ops: Ops):
        super().__init__()
        d = cfg.model_dim
        self.attn = CausalSelfAttention(cfg, ops)
        self.mlp = MLP(cfg, ops)
        self.attn_scale = mx.ones((d,), dtype=mx.float32)
        self.mlp_scale = mx.ones((d,), dtype=mx.float32)
        self.resid_mix = mx.stack([mx.ones((d,)), mx.zeros((d,))]).astype(mx.float32)

    def __call__(self, x: mx.array, x0: mx.array) -> mx.array:
        mix = self.resid_mix.astype(x.dtype)
        x = mix[0] * x + mix[1] * x0
        x = x + self.attn_scale.astype(x.dtype) * self.attn(rms_norm(x))
        return x + self.mlp_scale.astype(x.dtype) * self.mlp(rms_norm(x))


class GPT(nn.Module):
    """The v1 GPT; `ops` picks the kernels (default: those of the current MLX device)."""

    def __init__(self, cfg: Config, compute_dtype: mx.Dtype = mx.float32, ops: Ops | None = None):
        super().__init__()
        self.ops = ops or default_ops()
        self.compute_dtype = compute_dtype
        self.softcap = cfg.logit_softcap
        self.num_encoder = cfg.num_layers // 2
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.model_dim)
        self.skip_weights = mx.ones((num_skip_weights(cfg), cfg.model_dim), dtype=mx.float32)
        self.blocks = [Block(cfg, self.ops) for _ in range(cfg.num_layers)]
        if not cfg.tie_embeddings:
            self.lm_head = CastedLinear(cfg.model_dim, cfg.vocab_size, self.ops)

    def hidden(self, idx: mx.array) -> mx.array:
        """Token ids (B, T) -> the final normed hidden states (B, T, d) in the compute dtype."""
        x = rms_norm(self.tok_emb(idx).astype(self.compute_dtype))  # (B, T, d)
        x0, skips = x, []
        for block in self.blocks[: self.num_encoder]:
            x = block(x, x0)
            skips.append(x)
        for i, block in enumerate(self.blocks[self.num_encoder :]):
            if skips:
                x = x + self.skip_weights[i].astype(x.dtype) * skips.pop()
            x = block(x, x0)
        return rms_norm(x)

    def head_weight(self) -> mx.array:
        return self.lm_head.weight if "lm_head" in self else self.tok_emb.weight

    def __call__(self, idx: mx.array) -> mx.array:
        """Token ids (B, T) -> softcapped logits (B, T, V) in the compute dtype."""
        return softcap_logits(self.hidden(idx), self.head_weight(), self.softcap, self.ops.linear)

    def token_losses(self, idx: mx.array, targets: mx.array) -> mx.array:
        """Cross-entropy in nats per token (B, T), computed in fp32."""
        return self.ops.token_losses(self.hidden(idx), self.head_weight(), targets, self.softcap)

    def loss(self, idx: mx.array, targets: mx.array) -> mx.array:
        return self.token_losses(idx, targets).mean()
