"""pgolf's GPT in MLX: the parameters and the operations; the forward pass is core/model/walk.py.

The parameter names and shapes are those of cuda_train/model.py (core/model/params.py). The
conventions are PyTorch's so that weights mean the same in both backends: RoPE rotates by
-theta (`[x1 cos + x2 sin, -x1 sin + x2 cos]`, not `nn.RoPE`'s default), and RMSNorm's
epsilon is the fp32 machine epsilon in fp32 and bf16 alike (what `F.rms_norm(eps=None)`
uses). The heavy operations come from mlx_train/ops.py (Metal kernels, or lean CPU versions).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from core.model.params import make_modules
from core.model.walk import Walk
from mlx_train.ops import Ops, default_ops, segment_mask, softcap_logits

if TYPE_CHECKING:  # names for annotations alone
    from core.config.fields import Config
    from core.model.walk import Adapters, KVCache, Rope

# F.rms_norm(eps=None) uses the fp32 machine epsilon for fp32 and bf16 inputs alike.
RMS_EPS = float(mx.finfo(mx.float32).eps)
NORMALIZE_EPS = 1e-12  # F.normalize's floor on the norm


def rms_norm(x: mx.array) -> mx.array:
    return mx.fast.rms_norm(x, None, RMS_EPS)


class MLXWalk(Walk):
    """The forward pass's operations in MLX: `ops` supplies attention, `compute_dtype` the embeddings' dtype."""

    def __init__(self, cfg: Config, ops: Ops, compute_dtype: mx.Dtype):
        super().__init__(cfg)
        self.ops, self.compute_dtype = ops, compute_dtype

    def cast(self, a: mx.array, like: mx.array) -> mx.array:
        return a.astype(like.dtype)

    def cat(self, arrays: list[mx.array], axis: int) -> mx.array:
        return mx.concatenate(arrays, axis=axis)

    def sigmoid(self, a: mx.array) -> mx.array:
        return mx.sigmoid(a)

    def rms_norm(self, x: mx.array) -> mx.array:
        return rms_norm(x)

    def unit(self, v: mx.array) -> mx.array:
        return v / mx.maximum(mx.sqrt(mx.sum(v * v, axis=-1, keepdims=True)), NORMALIZE_EPS)

    def arange(self, start: int, stop: int, step: int) -> mx.array:
        return mx.arange(start, stop, step, dtype=mx.float32)

    def round_bf16(self, a: mx.array) -> mx.array:
        return a.astype(mx.bfloat16).astype(a.dtype)

    def embed(self, table: nn.Embedding, idx: mx.array) -> mx.array:
        return table(idx).astype(self.compute_dtype)

    def running_max(self, a: mx.array) -> mx.array:
        return mx.cummax(a, axis=1)

    def attention(self, q: mx.array, k: mx.array, v: mx.array, lower: mx.array | None = None) -> mx.array:
        t, s, scale = q.shape[2], k.shape[2], 1.0 / math.sqrt(q.shape[-1])
        if t < s:  # decoding after cached tokens
            visible = mx.arange(s)[None, :] <= mx.arange(s - t, s)[:, None]
            if lower is not None:
                visible = segment_mask(lower, t, s)
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=visible)
        return self.ops.attention(q, k, v, scale, lower)


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


class MLP(nn.Module):
    """relu(x)^2 or leaky_relu(x, 0.5)^2 between two linear layers (`fc`, `proj`: the model adds them)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.negative_slope = 0.5 if cfg.mlp_activation == "leaky_relu2" else 0.0

    def __call__(self, x: mx.array) -> mx.array:
        h = self.fc(x)
        h = nn.leaky_relu(h, self.negative_slope) if self.negative_slope else nn.relu(h)
        return self.proj(mx.square(h))


class MLXParts:
    """MLX's pieces of the module tree core/model/params.py's `make_modules` makes: CastedLinear layers
    on `ops`, embeddings, fp32 arrays; `blocks` and `ve_layer_scales` are lists, each `mlp` an MLP."""

    def __init__(self, cfg: Config, ops: Ops):
        self.cfg, self.ops = cfg, ops

    def container(self, name: str | None) -> nn.Module | list:
        if name in ("blocks", "ve_layer_scales"):
            return []
        return MLP(self.cfg) if name == "mlp" else nn.Module()

    def linear(self, in_dim: int, out_dim: int) -> CastedLinear:
        return CastedLinear(in_dim, out_dim, self.ops)

    def embedding(self, rows: int, cols: int) -> nn.Embedding:
        return nn.Embedding(rows, cols)

    def parameter(self, shape: tuple[int, ...]) -> mx.array:
        return mx.zeros(shape, dtype=mx.float32)


class GPT(nn.Module):
    """pgolf's GPT: the modules the walk reads (core/model/walk.py), made from the parameter table
    (core/model/params.py: `make_modules`); `ops` picks the kernels (default: those of the current MLX device)."""

    def __init__(self, cfg: Config, compute_dtype: mx.Dtype = mx.float32, ops: Ops | None = None):
        super().__init__()
        self.ops = ops or default_ops()
        self.walk = MLXWalk(cfg, self.ops, compute_dtype)
        self.softcap = cfg.logit_softcap
        make_modules(cfg, self, MLXParts(cfg, self.ops))
        # RoPE tables for the training length (the leading underscore keeps them out of the
        # parameters); longer inputs get their own.
        self._rope_table = self.walk.rope_tables(cfg.train_seq_len)

    def rope_table(self) -> Rope:
        return self._rope_table

    def hidden(
        self,
        idx: mx.array,
        looping: bool = False,
        cache: KVCache | None = None,
        adapters: Adapters | None = None,
    ) -> mx.array:
        """Token ids (B, T) -> the final normed hidden states (B, T, d) in the compute dtype."""
        return self.walk.hidden(self, idx, looping, cache, adapters)

    def head_weight(self) -> mx.array:
        return self.lm_head.weight if "lm_head" in self else self.tok_emb.weight

    def logits(self, idx: mx.array, looping: bool = False, cache: KVCache | None = None) -> mx.array:
        """Token ids (B, T) -> softcapped logits (B, T, V) in the compute dtype."""
        x = self.hidden(idx, looping, cache)
        return softcap_logits(x, self.head_weight(), self.softcap, self.ops.linear)

    def token_losses(
        self, idx: mx.array, targets: mx.array, looping: bool = False, adapters: Adapters | None = None
    ) -> mx.array:
        """Cross-entropy in nats per token (B, T), computed in fp32."""
        x = self.hidden(idx, looping, adapters=adapters)
        if adapters is None:
            return self.ops.token_losses(x, self.head_weight(), targets, self.softcap)
        z = self.walk.adapt(adapters, "head", x, self.ops.linear(x, self.head_weight()))
        logits = (self.softcap * mx.tanh(z / self.softcap)).astype(mx.float32)
        return nn.losses.cross_entropy(logits, targets, reduction="none")

    def loss(self, idx: mx.array, targets: mx.array, looping: bool = False) -> mx.array:
        """Mean cross-entropy; `looping` is an argument so that mx.compile keys its traces on it."""
        return self.token_losses(idx, targets, looping).mean()

    __call__ = logits

    def decode(self, idx: mx.array, cache: KVCache, looping: bool = False) -> mx.array:
        """Softcapped logits (B, t, V) of tokens `idx` that follow those already in `cache` (empty at
        first), which keeps their keys and values for the next call."""
        return self.logits(idx, looping, cache)
