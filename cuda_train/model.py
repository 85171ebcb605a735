"""pgolf's GPT in PyTorch: the parameters and the operations; the forward pass is core/model/walk.py.

Parameters are created with the names and shapes of core/model/params.py and filled by
`load_params` from its numpy initialisation, so both backends start from the
same numbers. Linear weights stay fp32 and are cast to the compute dtype at the
matmul; the embeddings are bf16 in bf16 runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.config.fields import Config
from core.model.params import mlp_hidden, num_skip_weights
from core.model.walk import Adapters, KVCache, Rope, Walk


def maybe_compile(fn: Callable, on: bool, dynamic: bool = False) -> Callable:
    """`fn` through torch.compile, one whole graph (dynamic shapes if asked), when `on`; else `fn` itself."""
    return torch.compile(fn, dynamic=dynamic, fullgraph=True) if on else fn


def rms_norm(x: Tensor) -> Tensor:
    # eps=None: torch uses the fp32 machine epsilon (also for bf16 inputs); MLX copies that.
    # Cast back: CUDA autocast (PyTorch >= 2.12) returns fp32 here, which would make the residual stream fp32.
    return F.rms_norm(x, (x.size(-1),)).to(x.dtype)


@cache
def flash_varlen() -> Callable | None:
    """FlashAttention's varlen kernel (version 3's interface, else version 2's), if installed."""
    for module in ("flash_attn_interface", "flash_attn"):
        try:
            return importlib.import_module(module).flash_attn_varlen_func
        except (ImportError, AttributeError):
            continue
    return None


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, lower: Tensor) -> Tensor:
    """Segment-causal attention through FlashAttention's varlen kernel, S == T: every row's segments
    (where lower[b, t] == t) laid end to end as the kernel's sequences. Their boundaries have a
    data-dependent count, so this runs eagerly only (the caller checks)."""
    b, h, t, d = q.shape
    flat = lower + torch.arange(b, device=q.device)[:, None] * t  # segment starts as flat positions
    starts = torch.arange(b * t, device=q.device)[flat.flatten() == torch.arange(b * t, device=q.device)]
    cu = torch.cat([starts, starts.new_tensor([b * t])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    y = flash_varlen()(
        *(a.transpose(1, 2).reshape(b * t, a.size(1), d) for a in (q, k, v)),
        cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest, causal=True,
    )  # fmt: skip
    y = y[0] if isinstance(y, tuple) else y  # version 3 may return (out, lse)
    return y.reshape(b, t, h, d).transpose(1, 2)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, expand_kv: bool, lower: Tensor | None = None) -> Tensor:
    """Causal SDPA of q (B, H, T, D) over k, v (B, KV, S, D), query t at position S - T + t: query head h
    reads kv head h // (H / KV); with `lower` (B, T) it sees keys lower[b, t] .. S - T + t only.

    `expand_kv` repeats each kv head for its query heads first: the same numbers, but in fp32 on CUDA
    a fused kernel runs instead of the math fallback `enable_gqa` takes, which holds (B, H, T, T) scores.
    A document mask is a boolean (B, 1, T, S) tensor; on CUDA, outside torch.compile, FlashAttention's
    varlen kernel runs instead where installed.
    """
    t, s = q.size(2), k.size(2)
    if lower is not None:
        fits = q.is_cuda and t == s and q.dtype in (torch.bfloat16, torch.float16)
        if fits and not torch.compiler.is_compiling() and flash_varlen() is not None:
            return varlen_attention(q, k, v, lower)
    if lower is not None or t < s:  # a document mask, or decoding after cached tokens
        keys = torch.arange(s, device=q.device)
        visible = keys <= torch.arange(s - t, s, device=q.device)[:, None]  # (T, S)
        if lower is not None:
            visible = (visible & (keys >= lower[..., None]))[:, None]  # (B, 1, T, S)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=k.size(1) != q.size(1))
    groups = q.size(1) // k.size(1)
    if expand_kv and groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, T, D)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.size(1) != q.size(1))


class TorchWalk(Walk):
    """The forward pass's operations in PyTorch."""

    def cast(self, a: Tensor, like: Tensor) -> Tensor:
        return a.to(like)

    def cat(self, arrays: list[Tensor], axis: int) -> Tensor:
        return torch.cat(arrays, dim=axis)

    def sigmoid(self, a: Tensor) -> Tensor:
        return torch.sigmoid(a)

    def rms_norm(self, x: Tensor) -> Tensor:
        return rms_norm(x)

    def unit(self, v: Tensor) -> Tensor:
        return F.normalize(v, dim=-1)

    def arange(self, start: int, stop: int, step: int) -> Tensor:
        return torch.arange(start, stop, step, dtype=torch.float32)

    def round_bf16(self, a: Tensor) -> Tensor:
        return a.to(torch.bfloat16).to(a.dtype)

    def embed(self, table: nn.Embedding, idx: Tensor) -> Tensor:
        return table(idx)  # bf16 tables in bf16 runs, the rest follows autocast

    def running_max(self, a: Tensor) -> Tensor:
        return torch.cummax(a, dim=1).values

    def attention(self, q: Tensor, k: Tensor, v: Tensor, lower: Tensor | None = None) -> Tensor:
        return causal_attention(q, k, v, expand_kv=q.is_cuda and q.dtype == torch.float32, lower=lower)


class CastedLinear(nn.Linear):
    """Bias-free linear layer whose fp32 weight is cast to the input dtype at the matmul."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__(in_dim, out_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.c_q = CastedLinear(cfg.model_dim, cfg.model_dim)
        self.c_k = CastedLinear(cfg.model_dim, kv_dim)
        self.c_v = CastedLinear(cfg.model_dim, kv_dim)
        self.proj = CastedLinear(cfg.model_dim, cfg.model_dim)
        self.q_gain = nn.Parameter(torch.zeros(cfg.num_heads))
        if cfg.attn_out_gate_enabled:
            self.attn_gate_proj = CastedLinear(cfg.gate_window, cfg.num_heads)  # read by the walk as a weight
        elif cfg.gated_attn_enabled or cfg.sparse_attn_gate_enabled:
            inputs = cfg.model_dim if cfg.gated_attn_enabled else cfg.gate_window
            self.attn_gate_w = nn.Parameter(torch.zeros(cfg.num_heads, inputs))


class MLP(nn.Module):
    """relu(x)^2 or leaky_relu(x, 0.5)^2 between two linear layers."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.negative_slope = 0.5 if cfg.mlp_activation == "leaky_relu2" else 0.0
        self.fc = CastedLinear(cfg.model_dim, mlp_hidden(cfg))
        self.proj = CastedLinear(mlp_hidden(cfg), cfg.model_dim)

    def forward(self, x: Tensor) -> Tensor:
        # A slope of 0 is relu's values and gradients (-0.0 for a negative input, squared to 0).
        return self.proj(F.leaky_relu(self.fc(x), self.negative_slope).square())


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.model_dim
        self.attn = CausalSelfAttention(cfg)
        self.mlp = MLP(cfg)
        self.attn_scale = nn.Parameter(torch.zeros(d))
        self.mlp_scale = nn.Parameter(torch.zeros(d))
        self.resid_mix = nn.Parameter(torch.zeros(2, d))


class ValueEmbedding(nn.Module):
    """One token embedding shared by the value-embedding layers, projected to the kv width and scaled."""

    def __init__(self, cfg: Config):
        super().__init__()
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, cfg.ve_dim)
        self.proj = CastedLinear(cfg.ve_dim, kv_dim) if cfg.ve_dim != kv_dim else None
        self.scale = nn.Parameter(torch.zeros(()))


class GPT(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.walk = TorchWalk(cfg)
        self.softcap = cfg.logit_softcap
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.model_dim)
        self.skip_weights = nn.Parameter(torch.zeros(num_skip_weights(cfg), cfg.model_dim))
        if cfg.skip_gates_enabled:
            self.skip_gates = nn.Parameter(torch.zeros(num_skip_weights(cfg), cfg.model_dim))
        if cfg.smear_gate_enabled:
            self.smear_gate = CastedLinear(cfg.gate_window, 1)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        if cfg.ve_enabled:
            self.ve_shared = ValueEmbedding(cfg)
            self.ve_layer_scales = nn.ParameterList(
                nn.Parameter(torch.zeros(1)) for _ in cfg.ve_layer_indices
            )
        self.lm_head = None if cfg.tie_embeddings else CastedLinear(cfg.model_dim, cfg.vocab_size)
        if cfg.parallel_start_layer > 0:
            self.parallel_post_lambdas = nn.Parameter(torch.zeros(cfg.num_layers, 2, 2))
            self.parallel_resid_lambdas = nn.Parameter(torch.zeros(cfg.num_layers, 2))
        # RoPE tables for the training length, moved with the model; longer inputs get their own.
        cos, sin = self.walk.rope_tables(cfg.train_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rope_table(self) -> Rope:
        return self.rope_cos, self.rope_sin

    def hidden(
        self,
        idx: Tensor,
        looping: bool = False,
        cache: KVCache | None = None,
        adapters: Adapters | None = None,
    ) -> Tensor:
        """Token ids (B, T) -> the final normed hidden states (B, T, d)."""
        return self.walk.hidden(self, idx, looping, cache, adapters)

    def logits(
        self,
        idx: Tensor,
        looping: bool = False,
        cache: KVCache | None = None,
        adapters: Adapters | None = None,
    ) -> Tensor:
        """Token ids (B, T) -> softcapped logits (B, T, V). With `cache` (empty at first) the tokens follow
        those already decoded, whose keys and values it keeps for the next call (decoding)."""
        x = self.hidden(idx, looping, cache, adapters)
        z = self.lm_head(x) if self.lm_head is not None else F.linear(x, self.tok_emb.weight.to(x.dtype))
        if adapters is not None:
            z = self.walk.adapt(adapters, "head", x, z)
        return self.softcap * torch.tanh(z / self.softcap)

    def token_losses(
        self, idx: Tensor, targets: Tensor, looping: bool = False, adapters: Adapters | None = None
    ) -> Tensor:
        """Cross-entropy in nats per token (B, T), computed in fp32."""
        logits = self.logits(idx, looping, adapters=adapters).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)

    def forward(self, idx: Tensor, targets: Tensor, reduction: str = "mean", looping: bool = False) -> Tensor:
        """The entry point that compile and DDP wrap: the cross-entropy, mean or sum.

        `looping` is an argument, not a module attribute, so torch.compile guards on it and
        keeps one graph per value (one recompile at the switch, none after it).
        """
        logits = self.logits(idx, looping).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)
