"""pgolf's GPT in MLX: the same modules, maths and parameter names as cuda_train/model.py.

See that file's docstring for the architecture and its features; this one reads
block by block like it. The conventions are PyTorch's so that weights mean the
same in both backends: RoPE rotates by -theta (`[x1 cos + x2 sin, -x1 sin + x2 cos]`,
not `nn.RoPE`'s default), and RMSNorm's epsilon is the fp32 machine epsilon in
fp32 and bf16 alike (what `F.rms_norm(eps=None)` uses). The heavy operations come
from mlx_train/ops.py (Metal kernels, or lean CPU versions).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from core.config.fields import Config
from core.model.params import mlp_hidden, num_skip_weights
from mlx_train.ops import Ops, default_ops, softcap_logits

Rope = tuple[mx.array, mx.array]  # cos, sin: (T, rope_dims / 2)
Lanes = tuple[mx.array, mx.array]  # the parallel residual lanes: 0 (attention reads it), 1 (the MLP's)

# F.rms_norm(eps=None) uses the fp32 machine epsilon for fp32 and bf16 inputs alike.
RMS_EPS = float(mx.finfo(mx.float32).eps)
NORMALIZE_EPS = 1e-12  # F.normalize's floor on the norm


def rms_norm(x: mx.array) -> mx.array:
    return mx.fast.rms_norm(x, None, RMS_EPS)


def rope_tables(seq_len: int, rope_dims: int, base: float) -> Rope:
    inv_freq = 1.0 / (base ** (mx.arange(0, rope_dims, 2, dtype=mx.float32) / rope_dims))
    freqs = mx.arange(seq_len, dtype=mx.float32)[:, None] * inv_freq[None, :]  # (T, R/2)
    return mx.cos(freqs), mx.sin(freqs)


def apply_rope(x: mx.array, rope: Rope) -> mx.array:
    """Rotate the two halves of the first R dims of each head by -theta: [x1 cos + x2 sin, -x1 sin + x2 cos]."""
    cos, sin = rope
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return mx.concatenate([x1 * cos + x2 * sin, x2 * cos - x1 * sin, rest], axis=-1)


def remove_self_value(y: mx.array, v: mx.array) -> mx.array:
    """XSA: y (B, H, T, D) minus its projection on the unit value vector of its own token (B, KV, T, D)."""
    b, h, t, d = y.shape
    kv = v.shape[1]
    y = y.reshape(b, kv, h // kv, t, d)  # query head h = kv_head * G + g
    norm = mx.sqrt(mx.sum(v * v, axis=-1, keepdims=True))
    unit = (v / mx.maximum(norm, NORMALIZE_EPS))[:, :, None]  # (B, KV, 1, T, D)
    return (y - mx.sum(y * unit, axis=-1, keepdims=True) * unit).reshape(b, h, t, d)


class CastedLinear(nn.Module):
    """A bias-free linear layer whose fp32 weight is cast to the input dtype at the matmul.

    `on_input`, when set, is called with every input first (GPTQ's calibration reads them).
    """

    def __init__(self, in_dim: int, out_dim: int, ops: Ops):
        super().__init__()
        self.ops = ops
        self.on_input = None
        self.weight = mx.zeros((out_dim, in_dim), dtype=mx.float32)

    def __call__(self, x: mx.array) -> mx.array:
        if self.on_input is not None:
            self.on_input(x)
        return self.ops.linear(x, self.weight)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config, layer: int, ops: Ops):
        super().__init__()
        self.ops = ops
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.xsa = layer >= cfg.num_layers - cfg.xsa_last_n
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.c_q = CastedLinear(cfg.model_dim, cfg.model_dim, ops)
        self.c_k = CastedLinear(cfg.model_dim, kv_dim, ops)
        self.c_v = CastedLinear(cfg.model_dim, kv_dim, ops)
        self.proj = CastedLinear(cfg.model_dim, cfg.model_dim, ops)
        self.q_gain = mx.zeros((cfg.num_heads,), dtype=mx.float32)

    def __call__(self, x: mx.array, rope: Rope, v_embed: mx.array | None = None) -> mx.array:
        b, t, d = x.shape
        v = self.c_v(x)
        if v_embed is not None:
            v = v + v_embed
        q = self.c_q(x).reshape(b, t, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)  # (B, H, T, D)
        k = self.c_k(x).reshape(b, t, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)  # (B, KV, T, D)
        v = v.reshape(b, t, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        rope = (rope[0].astype(q.dtype), rope[1].astype(q.dtype))
        q = apply_rope(rms_norm(q), rope) * self.q_gain.astype(q.dtype)[None, :, None, None]
        k = apply_rope(rms_norm(k), rope)
        y = self.ops.attention(q, k, v, 1.0 / math.sqrt(self.head_dim))  # (B, H, T, D)
        if self.xsa:
            y = remove_self_value(y, v)
        return self.proj(y.transpose(0, 2, 1, 3).reshape(b, t, d))

    def decode(
        self, x: mx.array, rope: Rope, start: int, kv: list[mx.array], v_embed: mx.array | None
    ) -> mx.array:
        """This attention on tokens x (B, t, d) at positions start.., attending to the keys and values `kv`
        of the tokens before them (empty at first), to which theirs are appended."""
        b, t, d = x.shape
        v = self.c_v(x)
        if v_embed is not None:
            v = v + v_embed
        q = self.c_q(x).reshape(b, t, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.c_k(x).reshape(b, t, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = v.reshape(b, t, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        rope = (rope[0][start : start + t].astype(q.dtype), rope[1][start : start + t].astype(q.dtype))
        q = apply_rope(rms_norm(q), rope) * self.q_gain.astype(q.dtype)[None, :, None, None]
        k = apply_rope(rms_norm(k), rope)
        keys, values = (
            (mx.concatenate([kv[0], k], axis=2), mx.concatenate([kv[1], v], axis=2)) if kv else (k, v)
        )
        kv[:] = [keys, values]
        visible = mx.arange(start + t)[None, :] <= mx.arange(start, start + t)[:, None]
        scale = 1.0 / math.sqrt(self.head_dim)
        y = mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=visible)
        if self.xsa:
            y = remove_self_value(y, v)
        return self.proj(y.transpose(0, 2, 1, 3).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: Config, ops: Ops):
        super().__init__()
        self.negative_slope = 0.5 if cfg.mlp_activation == "leaky_relu2" else 0.0
        self.fc = CastedLinear(cfg.model_dim, mlp_hidden(cfg), ops)
        self.proj = CastedLinear(mlp_hidden(cfg), cfg.model_dim, ops)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.fc(x)
        h = nn.leaky_relu(h, self.negative_slope) if self.negative_slope else nn.relu(h)
        return self.proj(mx.square(h))


class Block(nn.Module):
    def __init__(self, cfg: Config, layer: int, ops: Ops):
        super().__init__()
        d = cfg.model_dim
        self.norm_scale = 1.0 / math.sqrt(layer + 1) if cfg.ln_scale else 1.0
        self.attn = CausalSelfAttention(cfg, layer, ops)
        self.mlp = MLP(cfg, ops)
        self.attn_scale = mx.zeros((d,), dtype=mx.float32)
        self.mlp_scale = mx.zeros((d,), dtype=mx.float32)
        self.resid_mix = mx.zeros((2, d), dtype=mx.float32)

    def norm(self, x: mx.array) -> mx.array:
        return rms_norm(x) * self.norm_scale if self.norm_scale != 1.0 else rms_norm(x)

    def mix(self, x: mx.array, x0: mx.array) -> mx.array:
        """The residual stream blended with the embedding x0 (`resid_mix`)."""
        mix = self.resid_mix.astype(x.dtype)
        return mix[0] * x + mix[1] * x0

    def attn_branch(self, x: mx.array, rope: Rope, v_embed: mx.array | None = None) -> mx.array:
        return self.attn_scale.astype(x.dtype) * self.attn(self.norm(x), rope, v_embed)

    def mlp_branch(self, x: mx.array) -> mx.array:
        return self.mlp_scale.astype(x.dtype) * self.mlp(self.norm(x))

    def __call__(self, x: mx.array, x0: mx.array, rope: Rope, v_embed: mx.array | None = None) -> mx.array:
        x = self.mix(x, x0)
        x = x + self.attn_branch(x, rope, v_embed)
        return x + self.mlp_branch(x)

    def forward_lanes(
        self,
        lanes: Lanes,
        x0: mx.array,
        rope: Rope,
        v_embed: mx.array | None,
        resid: mx.array,
        post: mx.array,
    ) -> Lanes:
        """The same branches side by side: both read the incoming lanes, and lane j becomes
        resid[j] * lane_j + post[0, j] * attention + post[1, j] * MLP."""
        lane0, lane1 = lanes
        a = self.attn_branch(self.mix(lane0, x0), rope, v_embed)
        m = self.mlp_branch(lane1)
        resid, post = resid.astype(a.dtype), post.astype(a.dtype)
        return (
            resid[0] * lane0 + post[0, 0] * a + post[1, 0] * m,
            resid[1] * lane1 + post[0, 1] * a + post[1, 1] * m,
        )


class ValueEmbedding(nn.Module):
    """One token embedding shared by the value-embedding layers, projected to the kv width and scaled."""

    def __init__(self, cfg: Config, ops: Ops):
        super().__init__()
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, cfg.ve_dim)
        if cfg.ve_dim != kv_dim:
            self.proj = CastedLinear(cfg.ve_dim, kv_dim, ops)
        self.scale = mx.zeros((), dtype=mx.float32)

    def __call__(self, idx: mx.array, dtype: mx.Dtype) -> mx.array:
        h = self.embed(idx).astype(dtype)  # (B, T, ve_dim)
        if "proj" in self:
            h = self.proj(h)
        return h * self.scale.astype(h.dtype)


class GPT(nn.Module):
    """pgolf's GPT; `ops` picks the kernels (default: those of the current MLX device)."""

    def __init__(self, cfg: Config, compute_dtype: mx.Dtype = mx.float32, ops: Ops | None = None):
        super().__init__()
        self.ops = ops or default_ops()
        self.compute_dtype = compute_dtype
        self.softcap = cfg.logit_softcap
        self.layouts = {looping: cfg.layer_layout(looping) for looping in (False, True)}
        self.parallel_start = cfg.parallel_start_layer
        self.final_lane_choice = cfg.parallel_final_lane
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.model_dim)
        self.skip_weights = mx.zeros((num_skip_weights(cfg), cfg.model_dim), dtype=mx.float32)
        if cfg.skip_gates_enabled:
            self.skip_gates = mx.zeros((num_skip_weights(cfg), cfg.model_dim), dtype=mx.float32)
        self.blocks = [Block(cfg, i, self.ops) for i in range(cfg.num_layers)]
        self.ve_layers = cfg.ve_layer_indices
        if self.ve_layers:
            self.ve_shared = ValueEmbedding(cfg, self.ops)
            self.ve_layer_scales = [mx.zeros((1,), dtype=mx.float32) for _ in self.ve_layers]
        if not cfg.tie_embeddings:
            self.lm_head = CastedLinear(cfg.model_dim, cfg.vocab_size, self.ops)
        if cfg.parallel_start_layer > 0:
            self.parallel_post_lambdas = mx.zeros((cfg.num_layers, 2, 2), dtype=mx.float32)
            self.parallel_resid_lambdas = mx.zeros((cfg.num_layers, 2), dtype=mx.float32)
        self.rope_dims, self.rope_base = cfg.rope_dims or cfg.head_dim, cfg.rope_base

    def value_embeds(self, idx: mx.array) -> dict[int, mx.array]:
        """The value embedding each ve layer adds to its values (B, T, kv_dim)."""
        if not self.ve_layers:
            return {}
        shared = self.ve_shared(idx, self.compute_dtype)
        scales = zip(self.ve_layers, self.ve_layer_scales, strict=True)
        return {layer: shared * scale.astype(shared.dtype) for layer, scale in scales}

    def skip(self, i: int, x: mx.array, skipped: mx.array) -> mx.array:
        """Decoder layer i takes back the encoder output `skipped`: added, or blended through a gate."""
        scaled = self.skip_weights[i].astype(x.dtype) * skipped
        if "skip_gates" not in self:
            return x + scaled
        gate = mx.sigmoid(self.skip_gates[i].astype(x.dtype))
        return scaled + gate * (x - scaled)  # torch.lerp(scaled, x, gate)

    def final_lane(self, lanes: Lanes) -> mx.array:
        """What the head reads of the two lanes."""
        if self.final_lane_choice == "attn":
            return lanes[0]
        if self.final_lane_choice == "mlp":
            return lanes[1]
        return 0.5 * (lanes[0] + lanes[1])

    def hidden(self, idx: mx.array, looping: bool = False) -> mx.array:
        """Token ids (B, T) -> the final normed hidden states (B, T, d) in the compute dtype."""
        rope = rope_tables(idx.shape[1], self.rope_dims, self.rope_base)
        x = rms_norm(self.tok_emb(idx).astype(self.compute_dtype))  # (B, T, d)
        ve = self.value_embeds(idx)
        x0, skips = x, []
        encoder, decoder = self.layouts[looping]
        for i in encoder:
            x = self.blocks[i](x, x0, rope, ve.get(i))
            skips.append(x)
        lanes: Lanes | None = None
        for j, i in enumerate(decoder):
            if lanes is None and 0 < self.parallel_start <= i:
                lanes = (x, x)  # the split; Config.validate keeps every later layer parallel too
            if skips and j < self.skip_weights.shape[0]:
                if lanes is None:
                    x = self.skip(j, x, skips.pop())
                else:  # after the split the skips feed lane 0 only
                    lanes = (self.skip(j, lanes[0], skips.pop()), lanes[1])
            if lanes is None:
                x = self.blocks[i](x, x0, rope, ve.get(i))
            else:
                resid, post = self.parallel_resid_lambdas[i], self.parallel_post_lambdas[i]
                lanes = self.blocks[i].forward_lanes(lanes, x0, rope, ve.get(i), resid, post)
        if lanes is not None:
            x = self.final_lane(lanes)
        return rms_norm(x)

    def head_weight(self) -> mx.array:
        return self.lm_head.weight if "lm_head" in self else self.tok_emb.weight

    def logits(self, idx: mx.array, looping: bool = False) -> mx.array:
        """Token ids (B, T) -> softcapped logits (B, T, V) in the compute dtype."""
        return softcap_logits(self.hidden(idx, looping), self.head_weight(), self.softcap, self.ops.linear)

    def token_losses(self, idx: mx.array, targets: mx.array, looping: bool = False) -> mx.array:
        """Cross-entropy in nats per token (B, T), computed in fp32."""
        return self.ops.token_losses(self.hidden(idx, looping), self.head_weight(), targets, self.softcap)

    def loss(self, idx: mx.array, targets: mx.array, looping: bool = False) -> mx.array:
        """Mean cross-entropy; `looping` is an argument so that mx.compile keys its traces on it."""
        return self.token_losses(idx, targets, looping).mean()

    __call__ = logits

    def decode(self, idx: mx.array, cache: KVCache, looping: bool = False) -> mx.array:
        """Softcapped logits (B, t, V) of tokens `idx` that follow those already in `cache` (empty at
        first), which keeps their keys and values for the next call."""
        start = cache.get("length", 0)
        rope = rope_tables(start + idx.shape[1], self.rope_dims, self.rope_base)
        originals = [block.attn for block in self.blocks]
        try:
            for i, block in enumerate(self.blocks):
                block.attn = CachedAttention(originals[i], rope, start, cache.setdefault(i, []))
            logits = self.logits(idx, looping)
        finally:
            for block, attn in zip(self.blocks, originals, strict=True):
                block.attn = attn
        cache["length"] = start + idx.shape[1]
        return logits


# ------------------------------------------------------------------ generation
# Decoding with a KV cache, as in cuda_train/model.py: `GPT.decode` runs the usual forward pass on the
# new tokens only, with each attention module swapped for a `CachedAttention`.
KVCache = dict  # {"length": tokens so far, layer: [[k, v] per visit of that layer in one forward]}


class CachedAttention(nn.Module):
    """Stands in for a block's attention during one `GPT.decode` call."""

    def __init__(self, attn: CausalSelfAttention, rope: Rope, start: int, visits: list[list[mx.array]]):
        super().__init__()
        self.attn, self.table, self.start, self.visits, self.calls = attn, rope, start, visits, 0

    def __call__(self, x: mx.array, rope: Rope, v_embed: mx.array | None = None) -> mx.array:
        if self.calls == len(self.visits):  # depth recurrence visits a layer more than once
            self.visits.append([])
        kv = self.visits[self.calls]
        self.calls += 1
        return self.attn.decode(x, self.table, self.start, kv, v_embed)
