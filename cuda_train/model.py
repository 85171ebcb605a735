"""pgolf's GPT in PyTorch: the parameters and the operations; the forward pass is core/model/walk.py.

Parameters are created with the names and shapes of core/model/params.py and filled by
`load_params` from its numpy initialisation, so both backends start from the
same numbers. Linear weights stay fp32 and are cast to the compute dtype at the
matmul; the embeddings are bf16 in bf16 runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from core.model.params import make_modules
from core.model.walk import Walk
from cuda_train.varlen import flash_varlen, varlen_attention

if TYPE_CHECKING:  # names for annotations alone
    from collections.abc import Callable

    from core.config.fields import Config
    from core.model.walk import Adapters, KVCache, Rope


def maybe_compile(fn: Callable, on: bool, backend: str, dynamic: bool = False) -> Callable:
    """`fn` through torch.compile's `backend`, one whole graph (dynamic shapes if asked), when `on`; else `fn`
    itself."""
    return torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True) if on else fn


def rms_norm(x: Tensor) -> Tensor:
    # eps=None: torch uses the fp32 machine epsilon (also for bf16 inputs); MLX copies that.
    # Cast back: CUDA autocast (PyTorch >= 2.12) returns fp32 here, which would make the residual stream fp32.
    return F.rms_norm(x, (x.size(-1),)).to(x.dtype)


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
        fits = q.is_cuda and t == s and q.dtype == torch.bfloat16  # (the compute dtypes: fp32, bf16)
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
    """A linear layer (made bias-free: `bias=False`) whose fp32 weight is cast to the input dtype at the matmul."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class MLP(nn.Module):
    """relu(x)^2 or leaky_relu(x, 0.5)^2 between two linear layers (`fc`, `proj`: the model adds them)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.negative_slope = 0.5 if cfg.mlp_activation == "leaky_relu2" else 0.0

    def forward(self, x: Tensor) -> Tensor:
        # A slope of 0 is relu's values and gradients (-0.0 for a negative input, squared to 0).
        return self.proj(F.leaky_relu(self.fc(x), self.negative_slope).square())


class TorchParts:
    """PyTorch's pieces of the module tree core/model/params.py's `make_modules` makes: CastedLinear
    layers, embeddings, parameters; the layers of `blocks` in a ModuleList, the `ve_layer_scales` in a
    ParameterList, each `mlp` an MLP."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def container(self, name: str | None) -> nn.Module:
        lists = {"blocks": nn.ModuleList, "ve_layer_scales": nn.ParameterList}
        return MLP(self.cfg) if name == "mlp" else lists.get(name, nn.Module)()

    def linear(self, in_dim: int, out_dim: int) -> CastedLinear:
        return CastedLinear(in_dim, out_dim, bias=False)

    def embedding(self, rows: int, cols: int) -> nn.Embedding:
        return nn.Embedding(rows, cols)

    def parameter(self, shape: tuple[int, ...]) -> nn.Parameter:
        return nn.Parameter(torch.zeros(shape))


class GPT(nn.Module):
    """The modules the walk reads (core/model/walk.py lists them), made from the parameter table
    (core/model/params.py: `make_modules`). `lm_head` is None with tied embeddings."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.walk = TorchWalk(cfg)
        self.softcap = cfg.logit_softcap
        self.lm_head = None
        make_modules(cfg, self, TorchParts(cfg))
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
        z = self.walk.adapt(adapters, "head", x, z)  # (no adapters: z itself)
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
